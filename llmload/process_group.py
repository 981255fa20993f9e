"""Child processes started in a process group of their own, so that stopping one stops all it started.

A group, not a session (`start_new_session`): on Linux with `sched_autogroup_enabled`, a session
is a scheduler autogroup, and a CPU-bound vLLM server in an autogroup of its own held the load
generator off the CPU for 2-4 s at a time (docs/ARCHITECTURE.md, Timing). A group stays in our
session: a Ctrl-C at the terminal still reaches only the foreground group, and whoever started the
child decides how it ends.

The long commands (demo, soak, search, sweep) turn SIGINT and SIGTERM into `Stopped` (`stop_signals`):
the Locust run they wait on is told to stop and given STOP_GRACE_S to write what it measured
(`run_to_end`), their servers are stopped on the way out, and the command exits 128 + the signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import IO, Any

KILL_WAIT_S = 10.0
STOP_GRACE_S = 7.0  # a Locust run told to stop writes its report in this long, else its group is stopped
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM reached a long command: a KeyboardInterrupt, so every way out Ctrl-C already
    takes (a probe stopped, a sweep's server stopped, what was measured saved) is the same for both."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM raise Stopped while inside, even where SIGINT was inherited ignored (a command
    started with `&` in a script); a second signal is noted, not raised, so the stopping itself is not cut
    short (it is bounded). Yields the signals received."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def start_in_group(command: Sequence[str], *, stdout: IO[Any] | int | None, **popen: Any) -> subprocess.Popen[bytes]:
    """The child, leader of a new process group in our session, its stdin /dev/null (a background
    group must not read the terminal); stderr goes with stdout unless given."""
    popen.setdefault("stderr", subprocess.STDOUT)
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, process_group=0, **popen)


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still there (a group id reused by another user's process is not ours)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM to the child's group, up to `timeout_s` for all of it to go, then SIGKILL to what is left
    (children that outlived their leader included) until it is gone or KILL_WAIT_S pass; the leader is
    reaped. Harmless when already stopped."""
    pgid = proc.pid  # start_in_group made the child its group's leader
    if proc.poll() is None or group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while (proc.poll() is None or group_alive(pgid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        deadline = time.monotonic() + KILL_WAIT_S  # bounded: an orphan zombie no one reaps stays in the group
        while (proc.poll() is None or group_alive(pgid)) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
    proc.wait()


def run_to_end(command: Sequence[str], *, stdout: IO[Any] | int | None = None) -> int:
    """The child's exit code, run in a group of its own. Stopped or a Ctrl-C while it runs: SIGINT to it
    (Locust then writes its report, its requests in flight cancelled), STOP_GRACE_S to end, then its
    whole group stopped, and the interrupt raised on."""
    proc = start_in_group(command, stdout=stdout, stderr=None if stdout is None else subprocess.STDOUT)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # the leader only: the helpers it started stop with it
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_S)
        stop_group(proc, timeout_s=1.0)
        raise
