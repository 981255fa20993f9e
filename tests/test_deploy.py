"""The compose stack, the Prometheus config and the Grafana dashboard match what the tests run.

Nothing here starts Docker (the CI machines have none, nor a GPU): the compose file is validated
against the compose-spec JSON schema that PyPI's check-jsonschema ships, each command's flags are
looked up in the real `--help` of the same commands the tests run outside Docker, and every metric
the dashboard queries must be one llmload serves, a DCGM field, or one a real vLLM 0.32 served
(tests/data/vllm-0.32/metrics.txt).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from llmload.live import HISTOGRAM_NAMES, METRIC_NAMES
from tests.vllm_harness import VLLM_VERSION

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "llmload.json"
VLLM_METRICS = ROOT / "tests" / "data" / "vllm-0.32" / "metrics.txt"
BIN = Path(sys.executable).parent

# Every metric llmload's live endpoint (`locust ... --prometheus-port N`) serves.
LLMLOAD_METRICS = frozenset(METRIC_NAMES)
LLMLOAD_HISTOGRAMS = frozenset(HISTOGRAM_NAMES)
# NVIDIA DCGM exporter fields the dashboard may use (label `gpu`); MiB and percent
DCGM_FIELDS = frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"})


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@functools.cache
def compose() -> dict[str, Any]:
    data = _load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def service(name: str) -> dict[str, Any]:
    svc = compose()["services"][name]
    assert isinstance(svc, dict)
    return svc


def command_argv(name: str) -> list[str]:
    """The service's command with `${VAR:-default}` replaced by its default, as a shell would split it."""
    cmd = service(name)["command"]
    text = cmd if isinstance(cmd, str) else shlex.join(cmd)
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    assert "${" not in text, f"{name}: a variable without a default: {text}"
    return shlex.split(text)


def flags(argv: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


def _run_help(args: list[str]) -> str:
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    return proc.stdout


@functools.cache
def locust_help() -> str:
    """`llmload run --help`: Locust's flags and llmload's in one list, as `locust -f loadtests/chat.py`
    parses them (the same locustfile)."""
    return _run_help([str(BIN / "llmload"), "run", "--help"])


@functools.cache
def sim_help() -> str:
    return _run_help([str(BIN / "llmload"), "sim", "--help"])


def missing_flags(argv: list[str], help_text: str) -> set[str]:
    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text))
    return flags(argv) - listed


# -- compose file ------------------------------------------------------------------------------------


def compose_spec_schema() -> dict[str, Any]:
    """compose-spec.json as vendored by PyPI's check-jsonschema (a dev dependency), read offline."""
    path = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(schema, dict)
    return schema


def test_compose_file_matches_compose_spec_schema() -> None:
    schema = compose_spec_schema()
    assert schema.get("$id") == "compose_spec.json"
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_compose_schema_check_catches_mistakes() -> None:
    """The schema check is not vacuous: a misspelt key and a bad type are both rejected."""
    schema = compose_spec_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    bad = json.loads(json.dumps(compose()))
    bad["services"]["master"]["comand"] = "locust"
    assert not validator.is_valid(bad)
    bad = json.loads(json.dumps(compose()))
    bad["services"]["prometheus"]["ports"] = "9090:9090"
    assert not validator.is_valid(bad)


def test_compose_pins_the_vllm_the_tests_run() -> None:
    image = service("vllm")["image"]
    assert image.endswith(f"vllm/vllm-openai:v{VLLM_VERSION}}}"), image  # ${VLLM_IMAGE:-...:v0.32.0}
    assert f"v{VLLM_VERSION}" in COMPOSE.read_text(encoding="utf-8").split("services:")[0], "say why in a comment"


def test_compose_services_and_profiles() -> None:
    services = compose()["services"]
    assert {"vllm", "dcgm-exporter", "sim", "master", "worker", "prometheus", "grafana"} <= set(services)
    assert service("vllm")["profiles"] == ["gpu"]
    assert service("dcgm-exporter")["profiles"] == ["gpu"]
    assert "nvcr.io/nvidia/k8s/dcgm-exporter:" in service("dcgm-exporter")["image"]
    assert "9400:9400" in service("dcgm-exporter")["ports"]
    assert service("sim")["profiles"] == ["sim"]
    # the sim answers as "vllm", so the master's --host and Prometheus' target fit both profiles
    assert "vllm" in service("sim")["networks"]["default"]["aliases"]
    for name in ("master", "worker", "prometheus", "grafana"):
        assert "profiles" not in services[name], f"{name} runs in every profile"
    # the master waits for whichever target its profile started
    deps = service("master")["depends_on"]
    for target in ("vllm", "sim"):
        assert deps[target] == {"condition": "service_healthy", "required": False}


def test_master_command_is_the_tested_one() -> None:
    argv = command_argv("master")
    assert argv[:3] == ["locust", "-f", "loadtests/chat.py"]
    assert {"--master", "--headless", "--expect-workers"} <= set(argv)
    assert argv[argv.index("--host") + 1] == "http://vllm:8000"
    assert argv[argv.index("--prometheus-port") + 1] == "9646"
    assert (ROOT / argv[argv.index("--workload") + 1]).is_file()
    # as many workers as the master waits for
    assert "--expect-workers ${WORKERS:-2}" in service("master")["command"]
    assert service("worker")["scale"] == "${WORKERS:-2}"


def test_worker_command_is_the_tested_one() -> None:
    argv = command_argv("worker")
    assert argv == ["locust", "-f", "loadtests/chat.py", "--worker", "--master-host", "master"]


def test_sim_command_is_the_tested_one() -> None:
    argv = command_argv("sim")
    assert argv[:2] == ["llmload", "sim"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "8000"
    profile = argv[argv.index("--profile") + 1]
    assert profile in sim_help(), f"--profile {profile} is not one of the sim's engine profiles"


def test_vllm_and_the_sim_read_the_same_vllm_config() -> None:
    """One `vllm serve --config` file sizes the real server and its stand-in; it must be one vLLM
    0.32 accepts and whose KV cache holds its max-model-len on the sim's GPU."""
    vllm, sim = service("vllm"), service("sim")
    mount = "${VLLM_CONFIG:-./deploy/vllm/config.yaml}:/etc/vllm/config.yaml:ro"
    assert mount in vllm["volumes"] and mount in sim["volumes"]
    assert command_argv("vllm") == ["--config", "/etc/vllm/config.yaml"]
    argv = command_argv("sim")
    assert argv[argv.index("--vllm-config") + 1] == "/etc/vllm/config.yaml"
    host_argv = [str(BIN / "llmload"), *argv[1:]]
    host_argv[host_argv.index("--vllm-config") + 1] = str(ROOT / "deploy" / "vllm" / "config.yaml")
    host_argv[host_argv.index("--port") + 1] = "0"
    host_argv[host_argv.index("--host") + 1] = "127.0.0.1"
    proc = subprocess.Popen(host_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("llmload sim listening on http://127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("name", ["master", "worker"])
def test_locust_commands_use_existing_flags(name: str) -> None:
    assert not missing_flags(command_argv(name), locust_help())


def test_sim_command_uses_existing_flags() -> None:
    assert not missing_flags(command_argv("sim"), sim_help())


def test_flag_check_is_not_vacuous() -> None:
    help_text = locust_help()
    for flag in ("--master", "--worker", "--master-host", "--expect-workers", "--workload", "--target-qps"):
        assert flag in help_text
    assert missing_flags(["locust", "--target-qsp", "3"], help_text) == {"--target-qsp"}
    assert missing_flags(["llmload", "sim", "--ttft", "3"], sim_help()) == {"--ttft"}


# -- Prometheus and Grafana --------------------------------------------------------------------------


def scrape_targets() -> dict[str, tuple[str, list[str]]]:
    config = _load_yaml(PROMETHEUS)
    return {
        job["job_name"]: (
            job.get("metrics_path", "/metrics"),
            [t for sc in job["static_configs"] for t in sc["targets"]],
        )
        for job in config["scrape_configs"]
    }


def test_prometheus_scrapes_vllm_dcgm_and_the_master() -> None:
    targets = scrape_targets()
    wanted = {"vllm:8000", "dcgm-exporter:9400", "master:9646"}
    found = {t for path, ts in targets.values() if path == "/metrics" for t in ts}
    assert wanted <= found, targets
    services = compose()["services"]
    for target in wanted:
        host = target.split(":")[0]
        assert host in services or host == "vllm", host
    mounts = service("prometheus")["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    assert "--config.file=/etc/prometheus/prometheus.yml" in service("prometheus")["command"]


def _mounts(name: str) -> dict[str, str]:
    """container path -> repo path (relative, no leading ./) of a service's bind mounts."""
    out = {}
    for spec in service(name)["volumes"]:
        host, container = spec.split(":")[:2]
        out[container] = host.removeprefix("./")
    return out


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard() -> None:
    mounts = _mounts("grafana")
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]
    assert provisioning == GRAFANA / "provisioning"

    datasources = [
        ds for f in sorted((provisioning / "datasources").glob("*.yml")) for ds in _load_yaml(f)["datasources"]
    ]
    assert [(ds["type"], ds["url"]) for ds in datasources] == [("prometheus", "http://prometheus:9090")]

    providers = [p for f in sorted((provisioning / "dashboards").glob("*.yml")) for p in _load_yaml(f)["providers"]]
    assert len(providers) == 1
    container_dir = providers[0]["options"]["path"]
    host_dir = ROOT / mounts[container_dir]
    assert (host_dir / DASHBOARD.name).resolve() == DASHBOARD.resolve()
    home = service("grafana")["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{container_dir}/{DASHBOARD.name}"


# -- the dashboard's queries -------------------------------------------------------------------------

PROMQL_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf",
     "nan"}
)  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', " ", expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_KEYWORDS:
            continue  # a function call or a keyword
        if text[: match.start()].rstrip()[-1:].isdigit():
            continue  # exponent or duration suffix of a number, e.g. 1e3
        names.add(match.group())
    return names


def test_promql_metric_names() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, status) "
        '(rate(llmload_ttft_seconds_bucket{status="ok"}[$__rate_interval])))'
        " / on(gpu) group_left DCGM_FI_DEV_FB_USED + sum without (engine) (vllm:num_requests_waiting offset 5m) * 1e3"
    )
    assert promql_metric_names(expr) == {
        "llmload_ttft_seconds_bucket",
        "DCGM_FI_DEV_FB_USED",
        "vllm:num_requests_waiting",
    }


@functools.cache
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def dashboard_exprs() -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"] for target in panel.get("targets", [])]


@functools.cache
def vllm_metric_names() -> frozenset[str]:
    """Sample names in a real vLLM 0.32 /metrics page (histograms' _bucket/_sum/_count included)."""
    names = set()
    for line in VLLM_METRICS.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return frozenset(names)


def known_metric(name: str) -> bool:
    if name in LLMLOAD_METRICS or name in DCGM_FIELDS or name in vllm_metric_names():
        return True
    base, _, suffix = name.rpartition("_")
    return base in LLMLOAD_HISTOGRAMS and suffix in {"bucket", "sum", "count"}


def test_vllm_capture_is_real() -> None:
    names = vllm_metric_names()
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_preemptions_total"} <= names
    text = VLLM_METRICS.read_text(encoding="utf-8")
    assert re.search(r"^vllm:time_to_first_token_seconds_count\{[^}]*\} [1-9]", text, re.M), "no request was served"


def test_dashboard_queries_only_known_metrics() -> None:
    unknown = {
        (title, name)
        for title, expr in dashboard_exprs()
        for name in promql_metric_names(expr)
        if not known_metric(name)
    }
    assert not unknown, f"metrics neither llmload's, DCGM's nor in {VLLM_METRICS.name}: {sorted(unknown)}"


def test_dashboard_shows_client_server_and_gpu_side_by_side() -> None:
    used = {name for _, expr in dashboard_exprs() for name in promql_metric_names(expr)}
    for hist in ("llmload_ttft_seconds", "llmload_itl_seconds", "llmload_e2e_seconds"):
        assert f"{hist}_bucket" in used
        quantiles = {
            q for _, expr in dashboard_exprs() if f"{hist}_bucket" in expr
            for q in re.findall(r"histogram_quantile\(\s*([0-9.]+)", expr)
        }  # fmt: skip
        assert {"0.5", "0.99"} <= quantiles, (hist, quantiles)
    assert {"llmload_target_qps", "llmload_offered_qps", "llmload_achieved_qps", "llmload_requests_total"} <= used
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_preemptions_total"} <= used
    assert used >= DCGM_FIELDS


def test_dashboard_is_compact_valid_grafana_json() -> None:
    dash = dashboard()
    assert dash["uid"] == "llmload"
    assert 36 <= dash["schemaVersion"] <= 41
    panels = dash["panels"]
    assert 8 <= len(panels) <= 12
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
