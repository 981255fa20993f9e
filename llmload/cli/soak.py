"""`llmload soak`: ramp to 150% of the target, hold (5 minutes), PASS or FAIL (llmload.gates.soak).

Every flag not listed here goes to the Locust run (llmload/locust/flags.py lists them, README.md shows them):
the arrival flags and the verdict's criteria (--criteria FILE, --slo-ttft-p99-ms, --slo-ttfo-p99-ms
(first answer token, after a reasoning model's thinking), --slo-e2e-p99-ms, --max-error-rate,
--min-achieved-ratio (achieved / target), --min-goodput-ratio with --goodput-slo, --alerts warn|fail);
docs/gates.md explains each check. Exit 0 PASS, 1 FAIL, 2 bad input, 3 INCONCLUSIVE (the hold was too short
or too noisy to tell; the verdict says what to change).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from llmload.gates.locust_run import add_host_argument
from llmload.gates.soak import DEFAULT_HOLD_S, SoakRun, run_soak
from llmload.packaged import LOCUSTFILE, say_if_sample
from llmload.plan import PlanFlags
from llmload.schedule import DEFAULT_STAGE_S, parse_duration

HELP = "ramp to 150%% of the target, hold (5 min), PASS/FAIL; unknown flags go to Locust"
PASSTHROUGH = True
STOPS_CLEANLY = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_host_argument(parser)
    PlanFlags.add_arguments(parser, ["workload", "target_qps"])
    parser.add_argument("--duration", type=parse_duration, default=DEFAULT_HOLD_S, help="hold at 150%% (default 5m)")
    parser.add_argument(
        "--ramp-stage-duration", type=parse_duration, default=DEFAULT_STAGE_S, help="each of 25/50/100%%"
    )
    parser.add_argument("--locustfile", default=str(LOCUSTFILE), help="(default: the packaged one)")
    parser.add_argument("--run-id", default=None, help="the run directory's name (default: soak-TIME)")
    parser.add_argument("--reports-dir", default="reports", help="where run directories go (%(default)s)")


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    soak = SoakRun(
        locustfile=args.locustfile, workload=args.workload, target_qps=args.target_qps,
        ramp_stage_s=args.ramp_stage_duration, hold_s=args.duration, host=args.host,
        run_id=args.run_id or time.strftime("soak-%Y%m%d-%H%M%S"), reports_dir=args.reports_dir,
    )  # fmt: skip
    say_if_sample("soak", args.workload)
    return run_soak(soak, passthrough)
