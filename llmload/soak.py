"""`llmload soak`: the release ritual in one command, ramp to 150% and hold, then PASS or FAIL.

A thin wrapper over `locust -f loadtests/chat.py --headless --verdict`: the same run and verdict
a plain Locust invocation gives, with the soak's stages filled in. Flags it does not know (SLOs,
criteria, timeouts, Locust's own) are passed to Locust unchanged.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from llmload.report import REPORT_FILE, SUMMARY_FILE

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|m|s|)\s*$")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """`5m`, `300s`, `300`, `1.5h` → seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) < 0 or (float(match.group(1)) == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 5m, 300s, 1h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="target base URL (default: the embedded target)")
    parser.add_argument("--workload", default="workloads/chat-multiturn.yaml")
    parser.add_argument("--target-qps", type=float, default=None, help="100%% request rate (default: the workload's)")
    parser.add_argument("--duration", type=parse_duration, default=300.0, help="hold at 150%% (default 5m)")
    parser.add_argument("--ramp-stage-duration", type=parse_duration, default=60.0, help="each of 25/50/100%%")
    parser.add_argument("--locustfile", default="loadtests/chat.py")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--reports-dir", default="reports")


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    if not Path(args.locustfile).is_file():
        print(f"llmload soak: no locustfile at {args.locustfile} (run from the repository root)", file=sys.stderr)
        return 2
    run_id = args.run_id or time.strftime("soak-%Y%m%d-%H%M%S")
    command = [
        sys.executable, "-m", "locust", "-f", args.locustfile, "--headless", "--only-summary",
        "--workload", args.workload, "--stages", "25,50,100,150",
        "--stage-duration", f"{args.ramp_stage_duration:g}", "--hold-duration", f"{args.duration:g}",
        "--run-id", run_id, "--reports-dir", args.reports_dir, "--verdict",
    ]  # fmt: skip
    if args.host:
        command += ["--host", args.host]
    if args.target_qps is not None:
        command += ["--target-qps", f"{args.target_qps:g}"]
    code = subprocess.run([*command, *passthrough], check=False).returncode
    summary_path = Path(args.reports_dir) / run_id / SUMMARY_FILE
    if summary_path.is_file():
        verdict = orjson.loads(summary_path.read_bytes()).get("verdict") or {}
        print(f"\nllmload soak: {'PASS' if verdict.get('passed') else 'FAIL'}")
        for reason in verdict.get("reasons", []):
            print(f"  - {reason}")
        print(f"report: {summary_path.parent / REPORT_FILE}")
    return code
