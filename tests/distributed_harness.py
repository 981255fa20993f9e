"""A distributed llmload run across hosts of tests/netns.py: the target (`llmload sim`), a Locust
master and its workers, each in a namespace of its own (or workers sharing one), each reaching
the others only by address. Output goes to log files, so a chatty process never blocks on a pipe
and a failed test can show every process's tail.

    with hosts("master", "worker1", "worker2", "target") as net:
        url = start_target(net, "target", tmp / "logs", "--ttft-ms", "100")
        fleet = start_fleet(net, url, workload, tmp / "reports", "run", flags=flags, logs=tmp / "logs")
        assert fleet.wait(120) == 0, fleet.tails()
        fleet.summary, fleet.records

The processes are the network's: its teardown stops them, whatever the test did.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from llmload.records import read_records
from tests.locust_runs import REPO, locust_command
from tests.netns import Network

MASTER_PORT = 5557  # Locust's default; each host has its own port space
TARGET_PORT = 8000
_LISTENING = re.compile(r"^llmload sim listening on http://\S+$", re.MULTILINE)


def _log_popen(net: Network, host: str, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:  # the child holds its own descriptor
        return net.popen(host, argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file (empty when it was never written)."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def start_target(
    net: Network, host: str, logs: Path, *sim_args: str, port: int = TARGET_PORT, timeout_s: float = 60
) -> str:
    """`llmload sim --host 0.0.0.0 --port PORT SIM_ARGS` in `host`; its URL by the host's address once
    it listens. Its log is LOGS/target.log."""
    log = logs / "target.log"
    argv = [sys.executable, "-m", "llmload.sim", "--host", "0.0.0.0", "--port", str(port), *sim_args]
    proc = _log_popen(net, host, argv, log)
    deadline = time.monotonic() + timeout_s
    while not _LISTENING.search(tail(log, 100_000)):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else f"not listening in {timeout_s:g} s"
            raise RuntimeError(f"llmload sim in {host} {why}:\n{tail(log)}")
        time.sleep(0.05)
    return f"http://{net.address(host)}:{port}"


@dataclass
class Fleet:
    """A master and its workers started in a network; `wait` for the master's end, then read the run."""

    net: Network
    master: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    worker_hosts: list[str]
    run_dir: Path
    logs: Path
    worker_argv: list[str]

    def add_worker(self, host: str) -> subprocess.Popen[bytes]:
        """One more worker in `host` (a pod the cluster starts in place of a lost one); its log is
        workerN.log after the others'."""
        proc = _log_popen(self.net, host, self.worker_argv, self.worker_log(len(self.workers)))
        self.workers.append(proc)
        self.worker_hosts.append(host)
        return proc

    @property
    def master_log(self) -> Path:
        return self.logs / "master.log"

    def worker_log(self, index: int) -> Path:
        return self.logs / f"worker{index}.log"

    def wait(self, timeout_s: float) -> int:
        """The master's exit code once it ends; TimeoutError (with every log's tail) if it runs longer."""
        try:
            return self.master.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the master ran past {timeout_s:g} s\n{self.tails()}") from None

    def stop_workers(self, timeout_s: float = 10) -> list[int | None]:
        """After the master's end: the workers' exit codes, each stopped if it has not quit."""
        codes: list[int | None] = []
        for proc in self.workers:
            try:
                codes.append(proc.wait(timeout_s))
            except subprocess.TimeoutExpired:
                self.net.stop(proc)
                codes.append(None)
        return codes

    def tails(self, chars: int = 3000) -> str:
        """Every process's last output, for an assertion's message."""
        parts = [f"--- master ---\n{tail(self.master_log, chars)}"]
        parts += [f"--- worker {i} ---\n{tail(self.worker_log(i), chars)}" for i in range(len(self.workers))]
        return "\n".join(parts)

    @property
    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = orjson.loads((self.run_dir / "summary.json").read_bytes())
        return summary

    @property
    def records(self) -> pd.DataFrame:
        return read_records(self.run_dir / "requests.jsonl")


def start_fleet(
    net: Network,
    target_url: str,
    workload: Path,
    reports: Path,
    run_id: str,
    *,
    flags: Sequence[str],
    logs: Path,
    workers: int = 2,
    master_host: str = "master",
    worker_hosts: Sequence[str] | None = None,
    port: int = MASTER_PORT,
) -> Fleet:
    """A headless master (`--expect-workers WORKERS`, bound to its host's address) and WORKERS
    workers that reach it by that address. Worker i runs in worker_hosts[i % len] (default: the
    hosts named worker1, worker2, ...). The run's flags go to the master, which sends them on."""
    if worker_hosts is None:
        worker_hosts = [f"worker{i + 1}" for i in range(workers)]
    placed = [worker_hosts[i % len(worker_hosts)] for i in range(workers)]
    address = net.address(master_host)
    master_argv = [
        *locust_command(target_url, workload, reports, run_id, *flags),
        "--master", "--expect-workers", str(workers), "--master-bind-host", address, "--master-bind-port", str(port),
    ]  # fmt: skip
    master = _log_popen(net, master_host, master_argv, logs / "master.log")
    worker_argv = [
        *locust_command(target_url, workload, reports, run_id),
        "--worker", "--master-host", address, "--master-port", str(port),
    ]  # fmt: skip
    procs = [_log_popen(net, host, worker_argv, logs / f"worker{i}.log") for i, host in enumerate(placed)]
    return Fleet(net, master, procs, placed, reports / run_id, logs, worker_argv)
