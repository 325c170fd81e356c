#!/bin/sh
# Container entrypoint of grm-service. Every setting is an env var GRM_<FIELD> (see config.py),
# so `docker run -e GRM_MODEL=/models/rm IMAGE` is a whole deployment; arguments still win.
#   grm-entrypoint [serve] [OPTIONS] [-- ENGINE ARGS]   the gateway and its replicas (default)
#   grm-entrypoint replica [OPTIONS]                    ONE engine replica (one container per GPU;
#                                                       `backend`, its old name, still works)
#   grm-entrypoint healthcheck                          exit 0 when this container is ready
#   grm-entrypoint COMMAND ...                          any other grm-service command
set -eu

die() {
    echo "grm-entrypoint: $*" >&2
    exit 64  # EX_USAGE: a configuration mistake, not a crash; restarting will not help
}

healthcheck() {
    # The gateway answers /ready (200 once a replica is ready); a lone engine replica has no
    # /ready (404) and answers /health instead. No curl in the base images: Python it is.
    exec python3 - "http://127.0.0.1:${GRM_PORT:-8000}" <<'PY'
import sys
import urllib.error
import urllib.request


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError as err:
        sys.stderr.write(f"{url}: {err}\n")
        return 0


code = status(sys.argv[1] + "/ready")
if code == 404:
    code = status(sys.argv[1] + "/health")
sys.exit(0 if code == 200 else 1)
PY
}

open_without_keys() {
    # Compose hands the gateway the address its port is published on (GRM_PUBLISH_ADDR): a
    # gateway open to the network without keys would be anyone's GPU judge.
    case "${GRM_PUBLISH_ADDR:-127.0.0.1}" in
        127.* | localhost | ::1 | "[::1]") return 1 ;;
    esac
    [ -z "${GRM_API_KEYS:-}" ] && [ -z "${GRM_API_KEYS_FILE:-}" ] \
        && [ "${GRM_OPEN_WITHOUT_KEYS:-0}" != 1 ]
}

case "${1:-serve}" in
    -*) set -- serve "$@" ;;  # options alone: they are serve's
esac
command="${1:-serve}"
[ "$#" -gt 0 ] && shift

case "$command" in
    healthcheck)
        healthcheck
        ;;
    serve)
        if [ -z "${GRM_MODEL:-}" ] && [ -z "${GRM_REPLICA_URLS:-}" ] \
            && [ -z "${GRM_BACKEND_URLS:-}" ] \
            && ! printf '%s\n' "$@" | grep -q -e '^--model' -e '^--replica-url' -e '^--backend-url'
        then
            die "set GRM_MODEL (a model folder, e.g. /models/my-rm) or GRM_REPLICA_URLS"
        fi
        if open_without_keys; then
            die "published on ${GRM_PUBLISH_ADDR} (GRM_PUBLISH_ADDR) without GRM_API_KEYS: set" \
                "GRM_API_KEYS (clients send 'Authorization: Bearer KEY'), publish on 127.0.0.1," \
                "or set GRM_OPEN_WITHOUT_KEYS=1 to serve the network without keys on purpose"
        fi
        ;;
    replica|backend)
        if [ -z "${GRM_MODEL:-}" ] && ! printf '%s\n' "$@" | grep -q '^--model'; then
            die "set GRM_MODEL (a model folder, e.g. /models/my-rm) for the replica"
        fi
        ;;
esac

# Inside a container the service must listen on the container's interface, not loopback.
GRM_HOST="${GRM_HOST:-0.0.0.0}"
export GRM_HOST
exec grm-service "$command" "$@"
