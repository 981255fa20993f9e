"""How long does a run's report take to write? Every Locust run pays it at its end (and the test suite
once per run), so a regression here costs every run.

A run as report.html's tests make it (600 records, server and GPU samples: all seven charts), reported
5 times in this process (`conclude`, after one to warm up; its charts alone: `render_html`) and 5 times
as `llmload report` in a process of its own (imports included, as at the end of a run). Best and
median of 5, wall time and CPU time (on a shared machine the wall time depends on the neighbours).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from llmload import rundir
from llmload.conclude import conclude
from llmload.report.html import chart_window_s, render_html
from llmload.report.summary import summarize_run
from tests.locust_runs import llmload_command
from tests.test_report_html import synthetic_run


def _timed(action: Callable[[], object], times: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (this process and its children) of each of `times` calls."""
    wall, cpu = [], []
    for _ in range(times):
        started, used = time.perf_counter(), _cpu_s()
        action()
        wall.append(time.perf_counter() - started)
        cpu.append(_cpu_s() - used)
    return wall, cpu


def _cpu_s() -> float:
    used = os.times()
    return used.user + used.system + used.children_user + used.children_system


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--times", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmload-report-") as tmp:
        run_dir = synthetic_run(Path(tmp) / "run", args.records)  # reports it once: the warm-up
        run = rundir.load(run_dir)
        summary, itl = summarize_run(run, chart_window_s(run))
        command = llmload_command("report", str(run_dir))
        rows = {
            "conclude (summary, report.md, report.html)": _timed(lambda: conclude(run_dir), args.times),
            "render_html (report.html alone)": _timed(
                lambda: render_html(rundir.load(run_dir), summary, itl), args.times
            ),
            "`llmload report` (a process of its own)": _timed(
                lambda: subprocess.run(command, check=True, capture_output=True), args.times
            ),
        }
    print(f"\n### A run's report: {args.records} records, every chart (s, best and median of {args.times})\n")
    print("| what | wall best | wall median | CPU best | CPU median |")
    print("|---|---:|---:|---:|---:|")
    for what, (wall, cpu) in rows.items():
        figures = (min(wall), statistics.median(wall), min(cpu), statistics.median(cpu))
        print(f"| {what} | " + " | ".join(f"{x:.2f}" for x in figures) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
