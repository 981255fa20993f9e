"""The release ritual at its full default length: `llmload soak` with every default but the target
(ramp 25/50/100% × 60 s, then 150% × 5 minutes) against the embedded target, with the sample workload.
It prints the verdict, the hold's length and rate against its target, the checks that were judged and
the run's wall time. `make test` runs the same soak with a 2-minute hold (tests/test_soak.py); the
default 5-minute soak's error rates are the harness's (`gate_error_rates`, docs/gates.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

from tests.locust_runs import llmload_cli


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target-qps", type=float, default=6.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        proc = llmload_cli(
            "soak", "--target-qps", f"{args.target_qps:g}", "--reports-dir", tmp, "--run-id", "soak", timeout=None
        )
        elapsed = time.monotonic() - started
        summary = orjson.loads((Path(tmp) / "soak" / "summary.json").read_bytes())
    hold = summary["stages"][-1]
    reasons = summary["verdict"]["reasons"]
    judged = sum(not r.startswith("SKIP") for r in reasons)
    print("\n### llmload soak, defaults, against the embedded target\n")
    print("| verdict | hold | target | achieved | checks judged | skipped | wall time | exit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {summary['verdict']['outcome'].upper()} | {hold['duration_s']:g} s"
        f" | {hold['target_qps']:g} req/s | {hold['achieved_qps']:.2f} req/s | {judged} | {len(reasons) - judged}"
        f" | {elapsed:.0f} s | {proc.returncode} |"
    )
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-2000:])


if __name__ == "__main__":
    main(sys.argv[1:])
