"""What every real server the tests start has in common (vLLM, transformers serve, llama.cpp's
llama-server): a process group of its own that stop() ends whole, a log under the cache, `/health`
awaited before a test uses it, offline settings, one-time installs under a lock, and the developer
CLI: its parser and serve-until-Ctrl-C loop. Each server's module says only how it is installed and started."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Self, TypedDict

from llmload.process_group import start_in_group, stop_group
from llmload.sweep.server import free_port, health_status

CACHE_ROOT = Path(os.environ.get("LLMLOAD_CACHE", "~/.cache/llmload")).expanduser()
SERVED_MODEL_NAME = "tiny-llama"

# Offline: no model hub here, and usage stats would try to phone home.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def child_env() -> dict[str, str]:
    """Env for the servers' processes: offline, and free of the suite venv's Python settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OFFLINE_ENV)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive fcntl lock so parallel test sessions don't install/build at the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def tail(path: Path, n: int = 40) -> str:
    try:
        with path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=n))
    except OSError:
        return "<no log>"


_EXC_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR .*?\] )?(\w+(?:Error|Exception): .*)$")


def failure_report(path: Path) -> str:
    """Log tail plus the exception lines, which servers often print far above the tail."""
    causes: list[str] = []
    try:
        with path.open(errors="replace") as fh:
            for line in fh:
                m = _EXC_LINE.match(line.rstrip("\n"))
                if m and m.group(1) not in causes:
                    causes.append(m.group(1))
    except OSError:
        pass
    head = "".join(f"  {c[:400]}\n" for c in causes[:6])
    return f"exceptions in log:\n{head}last 40 lines of {path}:\n{tail(path)}"


class HarnessOptions(TypedDict, total=False):
    """What every server takes beside its own settings (`HarnessServer.__init__`)."""

    program: Path | None
    extra_args: Sequence[str]
    log_path: Path | None
    startup_timeout: float


class HarnessServer:
    """One server of one model on loopback in its own process group. Subclasses give `label`,
    `install()` and `command()`, and may change the environment in `env()`.

    `program`: what serves (an interpreter or a binary), installed by `install()` on the first start
    when None; `extra_args`: appended to its command line; `startup_timeout`: how long `/health` is
    awaited, the class's `startup_timeout_s` when None."""

    label = "server"
    stop_timeout_s = 20.0
    startup_timeout_s = 240.0

    def __init__(
        self,
        model: Path,
        *,
        program: Path | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        startup_timeout: float | None = None,
    ) -> None:
        self.model = Path(model)
        self.program = program
        self.extra_args = tuple(extra_args)
        self.startup_timeout = self.startup_timeout_s if startup_timeout is None else startup_timeout
        self.port: int | None = None
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what a subclass says --------------------------------------------------------------------
    def command(self) -> list[str]:
        raise NotImplementedError

    def install(self) -> Path:
        """The program that serves, installed or built (cached)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Before the first start: the program, unless one was given."""
        if self.program is None:
            self.program = self.install()

    def env(self) -> dict[str, str]:
        return child_env()

    @property
    def served_model_name(self) -> str:
        """What a request's `model` must be."""
        return SERVED_MODEL_NAME

    # -- attributes that only make sense once started --------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.label} not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.label} not started")
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            raise RuntimeError(f"{self.label} not started")
        return self._log_path

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Self:
        """Launch and block until `/health` is 200; raise RuntimeError with the log's story if not."""
        if self._proc is not None:
            raise RuntimeError(f"{self.label} already started")
        self.prepare()
        self.port = free_port()
        if self._log_path is None:
            logs = CACHE_ROOT / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"\W+", "-", self.label.lower()).strip("-")
            self._log_path = logs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with self._log_path.open("ab") as log:
            # cwd = log dir: `python -m` puts cwd on sys.path; keep the repo's packages off it
            self._proc = start_in_group(command, stdout=log, env=self.env(), cwd=str(self._log_path.parent))
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise RuntimeError(f"{self.label} exited early (code {rc}); {failure_report(self.log_path)}")
            if self.health() == 200:
                return
            time.sleep(0.25)
        raise RuntimeError(
            f"{self.label} not healthy after {self.startup_timeout:.0f}s; {failure_report(self.log_path)}"
        )

    def health(self, timeout: float = 2.0) -> int | None:
        """HTTP status of `GET /health`, or None when nothing answers."""
        return health_status(self.url, timeout)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM our process group, wait, then SIGKILL what is left of it."""
        if self._proc is not None:
            stop_group(self._proc, self.stop_timeout_s if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL the server process only (a simulated crash); stop() still cleans the group."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve_until_interrupted(server: HarnessServer) -> int:
    """The developer CLIs (`python -m tests.<server>_harness serve`): start, say where, wait for Ctrl-C."""
    # SIGTERM (and SIGINT even if a non-interactive shell ignored it) must reach the finally below, or
    # the server's process group would be orphaned
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    print(f"starting {server.label} ...", flush=True)
    server.start()
    try:
        print(f"healthy after {time.monotonic() - t0:.1f}s", flush=True)
        print(f"URL: {server.url}  (OpenAI base_url {server.base_url}, model {server.served_model_name!r})")
        print(f"PID: {server.pid}  log: {server.log_path}", flush=True)
        print("Ctrl-C to stop.", flush=True)
        while server.is_running():
            time.sleep(1)
        print(f"server exited on its own; see {server.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
        print("stopped.", flush=True)


def developer_cli(
    argv: Sequence[str] | None,
    *,
    server: str,
    flags: str,
    serve_options: Callable[[argparse.ArgumentParser], None],
    start: Callable[[argparse.Namespace], HarnessServer],
    commands: Mapping[str, tuple[str, Callable[[], None]]] = MappingProxyType({}),
) -> int:
    """The developer CLI of every harness, `python -m tests.<server>_harness serve [its options] [-- extra
    flags]`: `start` makes the server from the parsed options (`extra` without its `--`), which then serves
    until interrupted; `server` and `flags` name it in the help; `commands` are the harness's others, by
    name: (help, what it runs). The module defining `start` gives the CLI its name and description (its
    docstring), whether it runs with -m or is imported."""
    harness = sys.modules[start.__module__]
    assert harness.__spec__ is not None
    parser = argparse.ArgumentParser(prog=f"python -m {harness.__spec__.name}", description=harness.__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, (summary, _) in commands.items():
        sub.add_parser(name, help=summary)
    serve = sub.add_parser("serve", help=f"start a tiny-model {server} until Ctrl-C")
    serve_options(serve)
    serve.add_argument("extra", nargs=argparse.REMAINDER, help=f"extra {flags} flags, after `--`")
    args = parser.parse_args(argv)
    if args.cmd != "serve":
        commands[args.cmd][1]()
        return 0
    if args.extra[:1] == ["--"]:
        args.extra = args.extra[1:]
    return serve_until_interrupted(start(args))
