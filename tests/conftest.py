# --- real server fixtures (tests/*_harness.py) --------------------------------------------------
# The session vLLM server is shared by all `@pytest.mark.vllm` tests; the factory starts extra
# servers with custom flags; transformers serve and llama.cpp's llama-server are started once each
# for the tests of other servers. Only LLMLOAD_SKIP_VLLM=1 skips them; a failed venv, build, model or
# start is an error, never a silent skip.
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.llama_cpp_harness import LlamaServer, build_tiny_gguf
from tests.transformers_harness import TransformersServer
from tests.vllm_harness import VllmServer, build_tiny_model, ensure_vllm_venv

VllmServerFactory = Callable[..., VllmServer]


def _skip_if_vllm_disabled() -> None:
    if os.environ.get("LLMLOAD_SKIP_VLLM") == "1":
        pytest.skip("real vLLM tests skipped: LLMLOAD_SKIP_VLLM=1")


@pytest.fixture(scope="session")
def vllm_tiny_model() -> Path:
    """Venv + tiny model dir, built once per session (cached on disk across sessions)."""
    _skip_if_vllm_disabled()
    ensure_vllm_venv()
    return build_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(vllm_tiny_model: Path) -> Iterator[VllmServer]:
    """One shared server (max_model_len 2048, 64 MiB KV); ~40 s to start, so session-scoped."""
    server = VllmServer(vllm_tiny_model, max_model_len=2048, kv_cache_bytes=64 * 2**20)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def vllm_server_factory(vllm_tiny_model: Path) -> Iterator[VllmServerFactory]:
    """``factory(max_model_len=..., kv_cache_bytes=..., extra_args=[...])`` -> started server,
    stopped at the end of the test (for tests that need odd flags or that crash the server)."""
    started: list[VllmServer] = []

    def factory(
        *,
        max_model_len: int = 2048,
        kv_cache_bytes: int = 64 * 2**20,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> VllmServer:
        server = VllmServer(
            vllm_tiny_model,
            max_model_len=max_model_len,
            kv_cache_bytes=kv_cache_bytes,
            extra_args=extra_args,
            log_path=log_path,
        )
        started.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture(scope="session")
def transformers_server(vllm_tiny_model: Path) -> Iterator[TransformersServer]:
    """`transformers serve` of the tiny model with continuous batching, its KV cache sized for the
    sample workload's longest chats (about 8k tokens each); ~8 s to start."""
    with TransformersServer(vllm_tiny_model, cb_num_blocks=1024) as server:
        yield server


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """llama.cpp's llama-server (built from source on first use, ~3 min, then cached) with 4 slots of
    8k tokens: the sample workload's longest chat fits one."""
    _skip_if_vllm_disabled()
    with LlamaServer(build_tiny_gguf(), ctx_size=32_768, parallel=4) as server:
        yield server


# --- end of real server fixtures ----------------------------------------------------------------
