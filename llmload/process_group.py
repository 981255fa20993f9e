"""Child processes started in a process group of their own, so that stopping one stops all it started.

A group, not a session (`start_new_session`): on Linux with `sched_autogroup_enabled`, a session
is a scheduler autogroup, and a CPU-bound vLLM server in an autogroup of its own held the load
generator off the CPU for 2-4 s at a time (docs/ARCHITECTURE.md, Timing). A group stays in our
session: a Ctrl-C at the terminal still reaches only the foreground group, and whoever started the
child decides how it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import IO, Any

KILL_WAIT_S = 10.0


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
