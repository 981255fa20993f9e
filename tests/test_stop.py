"""Every long command stops cleanly: SIGTERM or SIGINT at a random moment of its load (a Locust
run begun), and within 10 s every process it started is gone, what it measured is written, and it
exits 128 + the signal. Stages are short and the hold small, so the file runs in about 2 minutes."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import orjson
import psutil
import pytest

from llmload.sweep.run import simulator_serve
from tests.locust_runs import llmload_command, running, small_workload, tiny_llama_config, wait_until

GONE_WITHIN_S = 10.0
SHORT_SEARCH = ("--max-qps", "8", "--start-qps", "2", "--probe-duration", "4s", "--probe-warmup", "0")


def _command(name: str, tmp_path: Path) -> tuple[list[str], Path]:
    """The command's line and the file that holds what it measured."""
    reports = tmp_path / "reports"
    workload = str(small_workload(tmp_path))
    if name == "demo":
        return [name, "--duration", "40", "--warmup", "0", "--reports-dir", str(reports)], reports
    if name == "soak":
        flags = ["--workload", workload, "--target-qps", "4", "--ramp-stage-duration", "2s", "--duration", "30s"]
        return [name, *flags, "--run-id", "r", "--reports-dir", str(reports)], reports / "r" / "summary.json"
    if name == "search":
        flags = ["--workload", workload, *SHORT_SEARCH, "--search-id", "s", "--reports-dir", str(reports)]
        return [name, *flags], reports / "s" / "search.json"
    config = tiny_llama_config(tmp_path / "base.yaml", length=2048, kv="64M", seqs=8)
    serve = simulator_serve("--profile", "vllm-cpu-tiny")
    flags = ["--serve", serve, "--vllm-config", str(config), "--vary", "max-num-seqs=2,4"]
    return [name, *flags, "--workload", workload, *SHORT_SEARCH, "--sweep-id", "w", "--reports-dir", str(reports)], (
        reports / "w" / "sweep.json"
    )


def _alive(pids: set[int]) -> list[psutil.Process]:
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize("name", ["demo", "soak", "search", "sweep"])
def test_a_signal_at_a_random_moment_stops_everything_and_keeps_what_was_measured(name: str, tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        directory = tmp_path / sig.name
        directory.mkdir()
        args, measured = _command(name, directory)
        with running(llmload_command(*args)) as proc:
            wait_until(lambda d=directory: any(d.rglob("run.json")), 60, f"{name}: its load never started")
            time.sleep(random.uniform(0.0, 3.0))
            started = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            signalled = time.monotonic()
            proc.send_signal(sig)
            output, _ = proc.communicate(timeout=GONE_WITHIN_S + 5)
            wait_until(lambda s=started: not _alive(s), GONE_WITHIN_S, f"{name}: left behind {_alive(started)}")
            took = time.monotonic() - signalled
            print(f"{name} {sig.name}: its processes gone {took:.1f} s after the signal")
        assert took < GONE_WITHIN_S, (name, sig.name, took, output[-3000:])
        assert proc.returncode == 128 + sig, (name, sig.name, proc.returncode, output[-3000:])
        assert "interrupted" in output, output[-3000:]
        if name == "demo":
            [run_dir] = measured.iterdir()
            measured = run_dir / "summary.json"
        figures = orjson.loads(measured.read_bytes())
        if name == "search":
            assert figures["outcome"] == "interrupted"
        elif name == "sweep":
            assert figures["interrupted"] is True
        else:
            assert any("interrupted" in w for w in figures["run"]["warnings"]), figures["run"]["warnings"]
