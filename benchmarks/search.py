"""A default `llmload search` against the simulator's engine: how long it takes (goal: under 10
minutes) and how close its answer lands to the engine's analytic saturation rate (goal: within 15% below it).
The passing rate is printed beside it.

The target is `llmload sim --profile vllm-cpu-tiny --max-num-seqs 4`; the load, single-turn
requests of ~50 prompt and exactly 64 output tokens, so the saturation rate follows from the
profile (StepTiming.saturation_qps). Every search flag is left at its default but --max-qps.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

from llmload.records import read_records
from llmload.sim.process import SimProcess
from llmload.sim.profiles import PROFILES
from tests.locust_runs import fixed_output_workload, llmload_cli

OUTPUT_TOKENS = 64
MAX_NUM_SEQS = 4
BUDGET_S = 600.0


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-qps", type=float, default=40.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, SimProcess("--profile", "vllm-cpu-tiny", "--max-num-seqs",
                                                          str(MAX_NUM_SEQS)) as sim:  # fmt: skip
        workload = fixed_output_workload(Path(tmp), OUTPUT_TOKENS)
        started = time.monotonic()
        proc = llmload_cli(
            "search", "--host", sim.url, "--workload", str(workload), "--max-qps", f"{args.max_qps:g}",
            "--reports-dir", tmp, "--search-id", "bench", timeout=None,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        result = orjson.loads((Path(tmp) / "bench" / "search.json").read_bytes())
        first = Path(tmp) / "bench" / result["probes"][0]["run_id"] / "requests.jsonl"
        prompt = float(read_records(first).prompt_tokens.mean())
    truth = PROFILES["vllm-cpu-tiny"].timing.saturation_qps(MAX_NUM_SEQS, prompt, OUTPUT_TOKENS)
    found, answer = result["passing_qps"], result["answer_qps"]

    def error(qps: float | None) -> str:
        return "–" if qps is None else f"{100 * (qps - truth) / truth:+.1f}%"

    print("\n### llmload search, defaults, against the simulator's engine (vllm-cpu-tiny, 4 sequences)\n")
    print("| probes | duration | goal | answer (error) | passing rate (error) | boundary | saturation | exit |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {len(result['probes'])} | {elapsed:.0f} s | < {BUDGET_S:.0f} s | ≥ {answer} req/s ({error(answer)})"
        f" | {found} req/s ({error(found)}) | {found}–{result['failing_qps']} | {truth:.2f} req/s | {proc.returncode} |"
    )
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-2000:])


if __name__ == "__main__":
    main(sys.argv[1:])
