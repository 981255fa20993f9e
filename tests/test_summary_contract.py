"""The summary contract holds across refactors: a fixed-seed run against the embedded simulator
gives the same summary.json as the code before the restructure (issue 8), timings aside.

Same keys, request counts, failure categories, stages and token figures: everything that does not
depend on how fast this machine is. `tests/data/golden/summary_shape.json` was written by the code
before the restructure; change it only when the summary contract changes on purpose (and say so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from llmload.models import Message, Session, Turn
from llmload.sim.process import SimProcess
from llmload.workload.synth import TextSynthesizer
from llmload.workload.tokens import get_tokenizer
from tests.locust_runs import run_locust, write_workload

GOLDEN = Path(__file__).parent / "data" / "golden" / "summary_shape.json"
# faults struck at arrival only: which request fails depends on arrival order alone, never on timing
FAULTS = ("http_500:0.06", "oom:0.04", "engine_dead:0.03", "http_429:0.05")
TIMED = ("ttft", "itl", "tpot", "e2e", "schedule_delay", "ttft_from_schedule", "e2e_from_schedule")


def _key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value; list items share one `[]` path."""
    if isinstance(value, dict):
        paths = {prefix} if prefix else set()
        for key, item in value.items():
            paths |= _key_paths(item, f"{prefix}.{key}" if prefix else key)
        return paths
    if isinstance(value, list):
        return set().union(*(_key_paths(item, f"{prefix}[]") for item in value)) | {prefix}
    return {prefix}


def summary_shape(summary: dict[str, Any]) -> dict[str, Any]:
    """What a run's summary must keep from one version of llmload to the next, timings left out."""
    stage_fields = (
        "name",
        "target_qps",
        "duration_s",
        "scheduled",
        "ok",
        "failed",
        "unfinished",
        "cancelled",
        "not_sent",
        "warmup",
        "turn_mix",
    )
    turn_fields = ("turn", "requests", "prompt_tokens_p50", "prompt_tokens_p99")
    # warnings speak of the host too (load-generator CPU, hypervisor steal): their list is part of
    # the contract, what a given machine puts in it is not
    keys = _key_paths(summary) - {"run.warnings[]"}
    return {
        "keys": sorted(keys),
        "requests": summary["requests"],
        "failures": {k: summary["failures"][k] for k in ("by_category", "oom_family")}
        | {"example_categories": sorted(summary["failures"]["examples"])},
        "stages": [{k: stage[k] for k in stage_fields} for stage in summary["stages"]],
        "turns": [{k: t[k] for k in turn_fields} for t in summary["turns"]],
        "tokens": summary["tokens"],
        "counts": {name: summary["latency_ms"][name]["count"] for name in TIMED},
        "run": {k: summary["run"][k] for k in ("arrival", "target_qps", "workers", "goodput_slo")},
        "verdict_present": summary["verdict"] is not None,
    }  # fmt: skip


def fixed_workload(directory: Path) -> Path:
    """120 single-turn requests of fixed output length; every tenth prompt is too long for the target."""
    synth = TextSynthesizer(get_tokenizer("cl100k_base"), seed=5)
    sessions = [
        Session(
            id=f"s{i}",
            turns=[Turn(messages=[Message(role="user", content=synth.text(400 if i % 10 == 9 else 30 + i % 7))],
                        output_tokens=12)],
        )
        for i in range(120)
    ]  # fmt: skip
    return write_workload(directory, "fixed", sessions)


def run_fixed(tmp_path: Path) -> dict[str, Any]:
    faults = [arg for fault in FAULTS for arg in ("--fault", fault)]
    with SimProcess("--ttft-ms", "10", "--itl-ms", "2", "--max-model-len", "300", "--seed", "7", *faults) as sim:
        run = run_locust(
            sim.url, fixed_workload(tmp_path), tmp_path / "reports", "fixed", "--target-qps", "8",
            "--stages", "50,100,150", "--stage-duration", "4", "--arrival", "constant", "--seed", "3",
            "--goodput-slo", "ttft=1000", "--verdict", "--max-error-rate", "1",
        )  # fmt: skip
    assert (run.run_dir / "summary.json").is_file(), run.output[-3000:]
    return run.summary


def test_fixed_seed_run_keeps_the_summary_contract(tmp_path: Path) -> None:
    shape = summary_shape(run_fixed(tmp_path))
    assert shape["failures"]["by_category"], "the run must exercise failure categories"
    assert orjson.loads(GOLDEN.read_bytes()) == shape
