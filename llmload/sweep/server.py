"""One configuration's server: the user's `--serve` command started in its own process group, its
log kept, `/health` awaited, its startup figures (or the reason it did not start) read from that
log, and the whole group stopped afterwards, whatever happened in between."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from llmload.capacity.vllm_log import explain_vllm_log
from llmload.errors import InputError
from llmload.process_group import start_in_group, stop_group
from llmload.sim.profiles import STARTUP_WARNING

PLACEHOLDERS = ("{config}", "{port}")
STOP_TIMEOUT_S = 20.0  # SIGTERM, then this long before SIGKILL to the group (vLLM shuts down in a few seconds)
_EXCEPTION = re.compile(r"(\w+(?:Error|Exception): .+)$")
LOG_TAIL_LINES = 3  # a start that failed without vLLM's error or an exception: the log's last lines say why
LOG_LINE_CHARS = 200


def health_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of `GET {url}/health`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def serve_command(template: str, config: Path, port: int) -> list[str]:
    """The `--serve` template with {config} and {port} filled in, split as a shell would split it."""
    missing = [p for p in PLACEHOLDERS if p not in template]
    if missing:
        raise InputError(f"--serve {template!r} lacks {' and '.join(missing)}: the sweep fills them in")
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise InputError(f"--serve {template!r}: {exc}") from None
    return [w.replace("{config}", str(config)).replace("{port}", str(port)) for w in words]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Startup:
    """What a start showed: the seconds to healthy, or why not; vLLM's KV lines when it printed them."""

    started: bool
    seconds: float
    reason: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None  # the request length max_concurrency is quoted for (max_model_len)
    kv_cache_gib: float | None = None  # the memory vLLM gave the KV cache, when it says
    warnings: tuple[str, ...] = ()  # the simulator's own about its prediction (STARTUP_WARNING lines)


def read_startup(log_text: str, *, started: bool, seconds: float, fallback: str | None = None) -> Startup:
    """The startup figures from a server's log, through the startup-log explainer; for a server that
    did not start, vLLM's reason in its own numbers, else its last exception, else `fallback` with the
    log's last lines (a server refusing a flag says so in one line)."""
    explanation = explain_vllm_log(log_text)
    facts: dict[str, float | int | str] = {}
    for finding in explanation.findings:
        facts.update(finding.values)
    reason = None
    if not started:
        # the cause vLLM names first (a symptom alone, such as a dead worker, says less than the last exception)
        failure = next(
            (f for f in explanation.findings if f.kind == explanation.failure_kind and f.role == "cause"), None
        )
        exceptions = _EXCEPTION.findall(log_text)
        reason = failure.meaning if failure else exceptions[-1][:300] if exceptions else _with_tail(fallback, log_text)
    memory = facts.get("available_kv_gib", facts.get("kv_set_gib"))
    return Startup(
        started=started,
        seconds=seconds,
        reason=reason,
        kv_cache_tokens=_int(facts.get("tokens")),
        max_concurrency=float(facts["concurrency"]) if "concurrency" in facts else None,
        concurrency_tokens=_int(facts.get("request_tokens")),
        kv_cache_gib=float(memory) if isinstance(memory, int | float) else None,
        warnings=tuple(line.split(STARTUP_WARNING, 1)[1] for line in log_text.splitlines() if STARTUP_WARNING in line),
    )


def _with_tail(fallback: str | None, log_text: str) -> str | None:
    """`fallback; its log ends: line | line | line`, the last non-empty lines trimmed; `fallback` for an empty log."""
    tail = [line.strip()[:LOG_LINE_CHARS] for line in log_text.splitlines() if line.strip()][-LOG_TAIL_LINES:]
    if not tail:
        return fallback
    return "; ".join(part for part in (fallback, "its log ends: " + " | ".join(tail)) if part)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


class ServerProcess:
    """`with ServerProcess(command, log) as server: server.wait_healthy(...)`: the process group it
    started, and only that, is stopped on leaving (SIGTERM, wait, SIGKILL), exceptions and Ctrl-C included."""

    def __init__(self, command: list[str], log_path: Path, port: int) -> None:
        self.command = command
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = time.monotonic()

    def __enter__(self) -> ServerProcess:
        with self.log_path.open("wb") as log:
            try:
                self._proc = start_in_group(self.command, stdout=log)  # stopped whole, engine included
            except OSError as exc:
                raise InputError(f"--serve: cannot run {self.command[0]!r}: {exc.strerror}") from None
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def wait_healthy(self, timeout_s: float) -> Startup:
        """Until `/health` answers 200, the process exits, or `timeout_s` passes."""
        assert self._proc is not None
        deadline = self._started + timeout_s
        fallback = None
        while True:
            code = self._proc.poll()
            if code is not None:
                fallback = f"exited with code {code} before /health answered"
                break
            if health_status(self.url) == 200:
                return read_startup(self._log(), started=True, seconds=time.monotonic() - self._started)
            if time.monotonic() >= deadline:
                fallback = f"/health did not answer 200 within {timeout_s:g} s"
                break
            time.sleep(0.5)
        seconds = time.monotonic() - self._started
        self.stop()  # a server still starting is stopped before its log is read: the log is then whole
        return read_startup(self._log(), started=False, seconds=seconds, fallback=fallback)

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the group, up to STOP_TIMEOUT_S for it to go, then SIGKILL; the leader is reaped."""
        if self._proc is not None:
            stop_group(self._proc, STOP_TIMEOUT_S)
