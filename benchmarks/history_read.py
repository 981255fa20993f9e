"""How long does `llmload history` take over a year of nightly runs, and in how much memory?

One run as report.html's tests make it (600 records, summarised by llmload's own code), copied into
N run directories (run.json and summary.json only, as CI artifacts keep them) with every latency
varied by 2% noise and TTFT 15% higher in the last third. Timed: the reading alone in this process
(`read_runs`: run.json by run.json, then every summary.json in one DuckDB query), and `llmload
history DIR` in a process of its own (imports, the trend table, history.json and history.html with its
charts), with that process's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llmload.history.runs import read_runs
from tests.locust_runs import llmload_command
from tests.test_history import copy_run
from tests.test_report_html import synthetic_run

DAY_S = 86_400.0


def _runs(source: Path, directory: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        copy_run(source, directory / f"nightly-{i:04d}", started_at=1_800_000_000.0 + i * DAY_S,
                 ttft=1.15 if i >= 2 * count // 3 else 1.0, noise=float(rng.normal(1, 0.02)))  # fmt: skip


def _child(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.read().decode() if proc.stderr else status}")
    return wall, usage.ru_maxrss / 1024


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmload-history-") as tmp:
        source = synthetic_run(Path(tmp) / "source", 600)
        for count in args.runs:
            directory = Path(tmp) / f"runs-{count}"
            _runs(source, directory, count)
            started = time.perf_counter()
            found, _ = read_runs([directory])
            read_s = time.perf_counter() - started
            assert len(found) == count
            table = _child(llmload_command("history", str(directory)))
            as_json = _child([*llmload_command("history", str(directory)), "--json"])
            rows.append((count, read_s, *table, *as_json))
    print("\n### `llmload history`: N run directories (run.json + summary.json), s and peak RSS\n")
    print("| runs | read_runs (in process) s | `llmload history` s | peak RSS MiB | with --json s | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for count, read_s, wall, rss, json_wall, json_rss in rows:
        print(f"| {count:,} | {read_s:.2f} | {wall:.2f} | {rss:.0f} | {json_wall:.2f} | {json_rss:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
