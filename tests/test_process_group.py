"""Children in a process group of their own, in our session: stopped whole, including a grandchild
that ignores SIGTERM and would outlive its parent."""

from __future__ import annotations

import os
import subprocess

from llmload.process_group import group_alive, start_in_group, stop_group


def test_a_group_is_stopped_whole_and_stays_in_our_session() -> None:
    # the shell and its background sleep both ignore SIGTERM: only the SIGKILL after the grace ends them
    proc = start_in_group(["sh", "-c", "trap '' TERM; sleep 60 & echo $!; wait"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    try:
        assert os.getpgid(grandchild) == proc.pid != os.getpgid(0)
        # a session of its own would be a scheduler autogroup of its own (docs/ARCHITECTURE.md, Timing)
        assert os.getsid(grandchild) == os.getsid(0)
    finally:
        stop_group(proc, timeout_s=0.5)
    assert proc.returncode == -9 and not group_alive(proc.pid)
    stop_group(proc, timeout_s=0.5)  # a second stop is harmless
