"""Run the simulator in a child process: what tests, the demo and benchmarks use.

A separate process keeps the simulator's CPU off the client's core and its event loop apart from
the code under test; only the one PID started here is ever signalled.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from types import TracebackType
from typing import IO, Any, NoReturn

import orjson

from llmload.errors import InputError

_LISTENING = re.compile(rb"^llmload sim listening on (https?://\S+)$")
# the embedded target (no --host): answers like a small model on a fast GPU, prefill 20k tok/s, 8 ms per token
EMBEDDED_TARGET_ARGS = ("--ttft-ms", "25", "--itl-ms", "8", "--prefill-tokens-per-s", "20000")


class SimProcess:
    """`with SimProcess("--ttft-ms", "100") as sim: ... sim.url ...`

    Starts `python -m llmload.sim --host 127.0.0.1 --port 0 ARGS` (later ARGS win), waits for its
    listening line, and on exit sends SIGTERM, then SIGKILL after `stop_timeout_s`.
    """

    def __init__(self, *cli_args: str, startup_timeout_s: float = 60.0, stop_timeout_s: float = 5.0) -> None:
        self.args = [sys.executable, "-m", "llmload.sim", "--host", "127.0.0.1", "--port", "0", *cli_args]
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("SimProcess is not running")
        return self._proc.pid

    def stats(self) -> dict[str, Any]:
        """GET /sim/stats: requests served and the emission lag (actual minus scheduled write, ms)."""
        with urllib.request.urlopen(self.url + "/sim/stats", timeout=10) as response:
            stats: dict[str, Any] = orjson.loads(response.read())
        return stats

    def reset_stats(self) -> None:
        """DELETE /sim/stats: forget a warm-up."""
        urllib.request.urlopen(urllib.request.Request(self.url + "/sim/stats", method="DELETE"), timeout=10).close()

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        # A file, not a pipe, for stderr: a chatty child never blocks on it. Closed in stop().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        # a group of its own (llmload/process_group.py): a Ctrl-C at the terminal reaches only its starter,
        # which stops the load first, then this target
        self._proc = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, process_group=0
        )
        try:
            self.url = self._read_url()
        except BaseException:
            self.stop()
            raise

    def _read_url(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        deadline = time.monotonic() + self.startup_timeout_s
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._fail(f"did not report listening within {self.startup_timeout_s:g} s")
                if not selector.select(remaining):
                    continue
                data = os.read(stdout.fileno(), 4096)
                if not data:
                    self._proc.wait(self.stop_timeout_s)
                    self._fail(f"exited with code {self._proc.returncode} before listening")
                buffer += data
        line = buffer.split(b"\n", 1)[0].strip()
        match = _LISTENING.match(line)
        if match is None:
            self._fail(f"printed {line!r} instead of its listening line")
        return match.group(1).decode()

    def _fail(self, what: str) -> NoReturn:
        assert self._stderr is not None
        self._stderr.seek(0)
        stderr = self._stderr.read().decode(errors="replace").strip()
        raise InputError(f"llmload sim ({' '.join(self.args[1:])}) {what}; stderr:\n{stderr}")

    def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
        self._proc = self._stderr = None
