"""This machine's CPU beside each sample: what the run's own processes used, what the hypervisor
took, and what other work took (a neighbour slows a client and a local target alike); and the
steal over a whole run, for run.json."""

from __future__ import annotations

import contextlib

import psutil
from geventhttpclient.url import URL

_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


class HostMeter:
    """This machine's CPU between two readings: how much was in use, how much the hypervisor took
    (steal), and how much the run's own processes used: this load generator's process tree and,
    when the target listens on this machine, the target's. The rest is other work: a neighbour
    that slows the client and a local target alike, which the verdict's drift check leaves out."""

    def __init__(self, target_url: str) -> None:
        url = URL(target_url)
        self._port = url.port if url.host and url.host.startswith(_LOOPBACK) else None
        self._target: psutil.Process | None = None
        self._last = (psutil.cpu_times(), self._run_cpu())

    def _find_target(self) -> None:
        """The process listening on the target's loopback port (root may be needed to see it)."""
        if self._port is None or self._target is not None:
            return
        with contextlib.suppress(psutil.Error, OSError):
            for conn in psutil.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self._port and conn.pid:
                    self._target = psutil.Process(conn.pid)
                    return

    def _run_cpu(self) -> float:
        """CPU seconds the run's processes have used (user + system), children included."""
        roots = [psutil.Process()] + ([self._target] if self._target is not None else [])
        seen: set[int] = set()
        total = 0.0
        for root in roots:
            with contextlib.suppress(psutil.Error):
                for proc in [root, *root.children(recursive=True)]:
                    if proc.pid not in seen:
                        seen.add(proc.pid)
                        with contextlib.suppress(psutil.Error):
                            times = proc.cpu_times()
                            total += times.user + times.system
        return total

    def read(self) -> dict[str, float]:
        """host_cpu_busy, host_cpu_steal and host_cpu_run since the last reading (fractions of all cores)."""
        had_target = self._target is not None
        self._find_target()
        now, run = psutil.cpu_times(), self._run_cpu()
        then, run_then = self._last
        self._last = (now, run)
        total = sum(now) - sum(then)
        if total <= 0 or (not had_target and self._target is not None):
            return {}  # no time passed, or the target just joined the tally: next time
        idle = (now.idle - then.idle) + (getattr(now, "iowait", 0.0) - getattr(then, "iowait", 0.0))
        steal = getattr(now, "steal", 0.0) - getattr(then, "steal", 0.0)
        return {
            "host_cpu_busy": min(1.0, max(0.0, (total - idle - steal) / total)),
            "host_cpu_steal": max(0.0, steal / total),
            "host_cpu_run": min(1.0, max(0.0, (run - run_then) / total)),
        }


class StealMeter:
    """CPU time the hypervisor gave to other guests ("steal") since creation, in % of all CPU time.

    On a VM, a vCPU descheduled for a few ms delays client and target alike: latency tails that
    neither caused. Runs record it so the report can say so; 0 on bare metal and non-Linux.
    """

    def __init__(self) -> None:
        self._start = psutil.cpu_times()

    @property
    def percent(self) -> float:
        now = psutil.cpu_times()
        total = sum(now) - sum(self._start)
        steal = getattr(now, "steal", 0.0) - getattr(self._start, "steal", 0.0)
        return 100.0 * steal / total if total > 0 else 0.0
