"""Run Hugging Face ``transformers serve`` (CPU) on the tiny model, a second OpenAI-compatible target.

``transformers serve`` comes with the ``transformers`` that vLLM's venv already holds (with FastAPI,
uvicorn and openai); it only lacks ``accelerate``, without which loading the model fails ("requires
`accelerate`"). So the harness adds that one package to the vLLM venv, once, under a lock, and
checks that vLLM still imports (pip pulls nothing else: all of accelerate's dependencies are there).
Measured on a 2-core machine: pip takes about 2 s (the import checks around it about 10 s more), and
the server answers ``/health`` 5-8 s after it starts (the model is loaded before it listens).

What it serves differs from vLLM in ways a load tester sees (transformers 5.19):

* the model is preloaded from the positional ``FORCE_MODEL`` argument, and a request's ``model``
  must be that exact string (or be left out), else 400; responses name it ``<path>@main``;
* streams never end with ``data: [DONE]``: the last event carries ``finish_reason`` and ``usage``;
* unknown fields (``ignore_eos``, ``min_tokens``) are refused with 422; an exact output length
  takes ``max_tokens`` plus a ``generation_config`` JSON *string*: ``min_new_tokens`` on the
  sequential path, ``eos_token_id: -1`` with continuous batching (llmload sends both);
* without ``--continuous-batching`` requests run one at a time; with it, the KV cache is sized
  from free *system RAM* unless given (19 GB on a 24 GB machine), hence ``cb_num_blocks``; a prompt
  larger than that cache kills the CB worker for good (503 on every request and on ``/health``).

CLI for developers: ``python -m tests.transformers_harness serve [--sequential]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Unpack

from tests.server_harness import (
    CACHE_ROOT,
    HarnessOptions,
    HarnessServer,
    child_env,
    developer_cli,
    file_lock,
)
from tests.vllm_harness import build_tiny_model, ensure_vllm_venv, import_check, python_check, venv_dir

ACCELERATE_VERSION = "1.15.0"
_SERVE_CHECK = "import accelerate, fastapi, openai, uvicorn; from transformers.cli.serve import Serve"


def _marker() -> Path:
    """Inside the vLLM venv: a rebuilt venv loses it and gets accelerate again."""
    return venv_dir() / ".llmload-transformers-serve-ready"


def serve_env() -> dict[str, str]:
    """``child_env()`` plus: no PyPI update check by the ``transformers`` CLI, and an empty HF hub
    cache of our own, which ``GET /v1/models`` scans (it 500s when the cache dir is missing)."""
    env = child_env()
    hub = CACHE_ROOT / "hf-hub-empty"
    hub.mkdir(parents=True, exist_ok=True)
    env["HF_HUB_CACHE"] = str(hub)
    env["HF_HUB_DISABLE_UPDATE_CHECK"] = "1"
    return env


def ensure_transformers_serve() -> Path:
    """The python that runs ``transformers serve``: the vLLM venv's, with ``accelerate`` added once."""
    python = ensure_vllm_venv()
    if _marker().exists():
        return python
    log = CACHE_ROOT / "transformers-serve-install.log"
    with file_lock(CACHE_ROOT / ".transformers-serve.lock"):
        if _marker().exists():  # another process finished while we waited
            return python
        if not python_check(python, _SERVE_CHECK, serve_env()):
            cmd = [str(python), "-m", "pip", "install", f"accelerate=={ACCELERATE_VERSION}"]
            with log.open("a") as out:
                out.write(f"\n$ {' '.join(cmd)}\n")
                out.flush()
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), check=False).returncode
                out.write(f"exit {rc}\n")
            if rc != 0:
                raise RuntimeError(f"installing accelerate into the vLLM venv failed (exit {rc}); see {log}")
            if not python_check(python, _SERVE_CHECK, serve_env()):
                raise RuntimeError(f"accelerate installed but `{_SERVE_CHECK}` fails; see {log}")
        if not import_check(python):  # the vLLM venv must stay usable for the vLLM tests
            raise RuntimeError(f"the vLLM venv no longer imports vLLM after adding accelerate; see {log}")
        _marker().write_text(f"accelerate=={ACCELERATE_VERSION} ready {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    return python


class TransformersServer(HarnessServer):
    """One `transformers serve` of the tiny model; with continuous batching by default, the mode a
    server under load runs (without it, requests are served one at a time)."""

    label = "transformers serve"
    startup_timeout_s = 120.0

    def __init__(
        self,
        model_dir: Path,
        *,
        continuous_batching: bool = True,
        cb_num_blocks: int | None = 128,
        cb_max_batch_tokens: int | None = 2048,
        **options: Unpack[HarnessOptions],
    ) -> None:
        super().__init__(model_dir, **options)
        self.continuous_batching = continuous_batching
        self.cb_num_blocks = cb_num_blocks
        self.cb_max_batch_tokens = cb_max_batch_tokens

    @property
    def served_model_name(self) -> str:
        """What a request's `model` must be: the preloaded model exactly as given on the command line."""
        return str(self.model)

    def install(self) -> Path:
        return ensure_transformers_serve()

    def env(self) -> dict[str, str]:
        return serve_env()

    def command(self) -> list[str]:
        assert self.port is not None and self.program is not None
        cmd = [
            str(self.program),
            "-m", "transformers.cli.transformers",
            "serve", str(self.model),
            "--device", "cpu",
            "--dtype", "float32",
            "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        if self.continuous_batching:
            cmd.append("--continuous-batching")
            # Unset, the KV cache takes 80-90 % of free system RAM on CPU.
            if self.cb_num_blocks is not None:
                cmd += ["--cb-num-blocks", str(self.cb_num_blocks)]
            if self.cb_max_batch_tokens is not None:
                cmd += ["--cb-max-batch-tokens", str(self.cb_max_batch_tokens)]
        return [*cmd, *self.extra_args]


def _server(args: argparse.Namespace) -> TransformersServer:
    return TransformersServer(build_tiny_model(), continuous_batching=not args.sequential, extra_args=args.extra)


def _serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--sequential", action="store_true", help="without continuous batching: one request at a time")


def main(argv: Sequence[str] | None = None) -> int:
    return developer_cli(
        argv, server="transformers server", flags="`transformers serve`", serve_options=_serve_options, start=_server
    )


if __name__ == "__main__":
    sys.exit(main())
