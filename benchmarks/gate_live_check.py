"""The error-rate harness held against live runs: the embedded engine (`llmload sim --profile vllm-cpu-tiny
--max-num-seqs 4`, single-turn requests of exactly 64 output tokens) at 0.7, 1.0 and 1.3 of its analytic
saturation rate, a 60 s hold after a 10 s warm-up judged by the search's confirm criteria, live; and the
same hold against the harness's batch server of the same capacity, over seeds. The live verdicts must
fall where the harness puts its verdicts (within a binomial interval of the live runs' count).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import orjson

from llmload.errorrates.runs import Hold, judge, records
from llmload.errorrates.servers import BatchServer, Lengths
from llmload.gates.criteria import SoakCriteria
from llmload.gates.search import confirm_criteria
from llmload.records import read_records
from llmload.schedule import build_stages
from llmload.sim.process import SimProcess
from llmload.sim.profiles import PROFILES
from tests.locust_runs import fixed_output_workload, run_locust

OUTPUT_TOKENS, MAX_NUM_SEQS = 64, 4
HOLD_S, WARMUP_S, DRAIN_S = 60.0, 10.0, 120.0
LOADS = (0.7, 1.0, 1.3)


def harness_outcomes(capacity: float, load: float, seeds: int) -> Counter[str]:
    """The hold against a batch server of the engine's capacity: full steps twice the empty one's cost."""
    step_full = MAX_NUM_SEQS / (capacity * OUTPUT_TOKENS)
    server = BatchServer(MAX_NUM_SEQS, step_full / 2, step_full / 2 / MAX_NUM_SEQS, Lengths("fixed", OUTPUT_TOKENS))
    criteria = confirm_criteria(SoakCriteria(), HOLD_S)
    hold = Hold("confirm", tuple(build_stages(load * capacity, (100,), HOLD_S, warmup_s=WARMUP_S)), criteria, DRAIN_S)
    out: Counter[str] = Counter()
    for seed in range(seeds):
        manifest, frame = records(hold, server, "constant", 1.0, seed)
        out[judge(manifest, frame, criteria)[0].verdict.outcome] += 1
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2, help="live runs per load")
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, SimProcess("--profile", "vllm-cpu-tiny", "--max-num-seqs",
                                                          str(MAX_NUM_SEQS)) as sim:  # fmt: skip
        directory = Path(tmp)
        workload = fixed_output_workload(directory, OUTPUT_TOKENS)
        criteria = directory / "criteria.yaml"
        criteria.write_text(orjson.dumps(confirm_criteria(SoakCriteria(), HOLD_S).model_dump(mode="json")).decode())
        capacity = None
        for load in LOADS:
            live: Counter[str] = Counter()
            for run in range(args.runs):
                if capacity is None:  # the prompt length the engine counted, from a short first run
                    first = run_locust(
                        sim.url, workload, directory / "reports", "calibrate", "--target-qps", "2",
                        "--stages", "100", "--stage-duration", "5", "--arrival", "constant",
                    )  # fmt: skip
                    prompt = float(read_records(first.run_dir / "requests.jsonl").prompt_tokens.mean())
                    capacity = PROFILES["vllm-cpu-tiny"].timing.saturation_qps(MAX_NUM_SEQS, prompt, OUTPUT_TOKENS)
                done = run_locust(
                    sim.url, workload, directory / "reports", f"live-{load:g}-{run}",
                    "--target-qps", f"{load * capacity:.3f}", "--stages", "100", "--stage-duration", f"{HOLD_S:g}",
                    "--warmup", f"{WARMUP_S:g}", "--arrival", "constant", "--drain-timeout", f"{DRAIN_S:g}",
                    "--seed", str(run), "--first-session", str(run * 2000), "--verdict", "--criteria", str(criteria),
                    timeout=HOLD_S + WARMUP_S + DRAIN_S + 120,
                )  # fmt: skip
                live[done.summary["verdict"]["outcome"]] += 1
            assert capacity is not None
            rows.append((load, capacity, live, harness_outcomes(capacity, load, args.seeds)))
    print("\n### The harness against live runs: embedded engine, vllm-cpu-tiny, 4 sequences, 64-token answers\n")
    print("| load | rate req/s | live PASS/FAIL/INCONCLUSIVE | harness PASS | harness FAIL | harness INCONCLUSIVE |")
    print("|---:|---:|---|---:|---:|---:|")
    for load, capacity, live, predicted in rows:
        total = sum(predicted.values())
        shares = " | ".join(f"{predicted[o] / total:.0%}" for o in ("pass", "fail", "inconclusive"))
        print(f"| {load:g} | {load * capacity:.2f} | {live['pass']}/{live['fail']}/{live['inconclusive']} | {shares} |")


if __name__ == "__main__":
    main(sys.argv[1:])
