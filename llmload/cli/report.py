"""`llmload report RUN_DIR`: rebuild summary.json, report.md and report.html from a run's records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "rebuild summary.json, report.md and report.html from a run's records"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir")


def run(args: argparse.Namespace) -> int:
    from llmload.conclude import conclude  # matplotlib and pandas: only for the commands that report
    from llmload.rundir import REPORT_FILE

    run_dir = Path(args.run_dir)
    summary = conclude(run_dir)
    for warning in summary.run.warnings:
        print(f"llmload report: warning: {warning}", file=sys.stderr)
    print(f"{run_dir / REPORT_FILE}: {summary.requests.scheduled} scheduled, {summary.requests.ok} ok")
    return 0
