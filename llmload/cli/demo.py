"""`make demo`: a real, short load test against the embedded target, ending with a report path."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from llmload.gates.locust_run import LocustRun
from llmload.packaged import LOCUSTFILE, SAMPLE_WORKLOAD, say_if_sample
from llmload.plan import PlanFlags
from llmload.process_group import Stopped, run_to_end
from llmload.rundir import REPORT_FILE, read_summary
from llmload.schedule import parse_duration
from llmload.sim.process import EMBEDDED_TARGET_ARGS, SimProcess

HELP = "a short real load test against the embedded target"
STOPS_CLEANLY = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=parse_duration, default=40.0, help="the ramp, 4 stages (40s)")
    parser.add_argument(
        "--warmup", type=lambda t: parse_duration(t, allow_zero=True), default=None,
        help="unjudged lead-in (default: a mean session of the sample workload, 19 s)",
    )  # fmt: skip
    parser.add_argument("--reports-dir", default="reports")


def run(args: argparse.Namespace) -> int:
    return run_demo(duration_s=args.duration, warmup_s=args.warmup, reports_dir=args.reports_dir)


def run_demo(*, duration_s: float = 40.0, warmup_s: float | None = None, reports_dir: str = "reports") -> int:
    say_if_sample("demo", SAMPLE_WORKLOAD)
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    with SimProcess(*EMBEDDED_TARGET_ARGS) as sim:
        print(
            f"llmload demo: embedded target {sim.url} (pid {sim.pid}); an unjudged warm-up, then a {duration_s:g} s"
            " ramp to 150% of 4 req/s"
        )
        plan = PlanFlags.checked(
            workload=str(SAMPLE_WORKLOAD), target_qps=4, stage_duration_s=duration_s / 4, drain_s=15, warmup_s=warmup_s
        )
        command = LocustRun(host=sim.url, run_id=run_id, reports_dir=reports_dir, plan=plan).command(str(LOCUSTFILE))
        try:
            code, stopped = run_to_end(command), None
        except Stopped as stop:  # the embedded target is stopped on the way out, then the report read
            code, stopped = 128 + stop.signum, stop
    run_dir = Path(reports_dir) / run_id
    summary = read_summary(run_dir)
    if summary is None:
        print(f"llmload demo: the load test wrote no report (locust exit code {code})", file=sys.stderr)
        return code or 1
    r, ttft = summary.requests, summary.latency_ms.ttft
    print(
        f"\nllmload demo: {r.scheduled} requests scheduled, {r.ok} ok, {r.failed} failed, {r.unfinished} unfinished, "
        f"{r.cancelled} cancelled, {r.not_sent} not sent, {r.lost} lost; TTFT p50 {ttft.p50 or 0:.1f} ms,"
        f" p99 {ttft.p99 or 0:.1f} ms"
    )
    for stage in summary.stages:
        judged = "not judged" if stage.warmup else "shortfall" if stage.shortfall else "held"
        print(
            f"  stage {stage.name:>7}: target {stage.target_qps:.2f} req/s, offered {stage.offered_qps:.2f},"
            f" achieved {stage.achieved_qps:.2f}, first turns {stage.turn_mix.get('1', 0):.0%} ({judged})"
        )
    print(f"report: {run_dir / REPORT_FILE}")
    if stopped is not None:
        print(f"llmload demo: interrupted ({stopped}): what was measured until then")
    return code
