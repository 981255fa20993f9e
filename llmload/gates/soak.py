"""The soak: the release ritual in one run, ramp to 150% of the target and hold, then PASS or FAIL.

A thin wrapper over `locust -f loadtests/chat.py --headless --verdict`: the same run and verdict
a plain Locust invocation gives, with the soak's stages filled in. Flags it does not know (SLOs,
criteria, timeouts, Locust's own) are passed to Locust unchanged.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from llmload import rundir
from llmload.errors import InputError

SOAK_STAGES = "25,50,100,150"


def run_soak(
    *,
    locustfile: str,
    workload: str,
    host: str | None,
    target_qps: float | None,
    ramp_stage_s: float,
    hold_s: float,
    run_id: str,
    reports_dir: str,
    passthrough: Sequence[str] = (),
) -> int:
    """Locust's exit code (0 PASS, 1 FAIL, 2 bad input), after printing the verdict and the report's path."""
    if not Path(locustfile).is_file():
        raise InputError(f"no locustfile at {locustfile} (run from the repository root)")
    run_dir = Path(reports_dir) / run_id
    rundir.claim(run_dir)  # before Locust: a used directory's old verdict must not be read as this run's
    command = [
        sys.executable, "-m", "locust", "-f", locustfile, "--headless", "--only-summary",
        "--workload", workload, "--stages", SOAK_STAGES,
        "--stage-duration", f"{ramp_stage_s:g}", "--hold-duration", f"{hold_s:g}",
        "--run-id", run_id, "--reports-dir", reports_dir, "--verdict",
    ]  # fmt: skip
    if host:
        command += ["--host", host]
    if target_qps is not None:
        command += ["--target-qps", f"{target_qps:g}"]
    code = subprocess.run([*command, *passthrough], check=False).returncode
    summary_path = run_dir / rundir.SUMMARY_FILE
    if summary_path.is_file():
        verdict = orjson.loads(summary_path.read_bytes()).get("verdict") or {}
        print(f"\nllmload soak: {'PASS' if verdict.get('passed') else 'FAIL'}")
        for reason in verdict.get("reasons", []):
            print(f"  - {reason}")
        print(f"report: {run_dir / rundir.REPORT_FILE}")
    return code
