"""The client on vLLM 0.32's real wire bytes (captured in tests/data/vllm-0.32), served over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmload.client import ChatClient, StreamResult
from llmload.server.request import chat_body
from tests.wire_server import canned_server

CAPTURED = Path(__file__).parent / "data" / "vllm-0.32"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def captured() -> Iterator[tuple[str, list[tuple[int, str, bool]]]]:
    """A loopback server answering with the captured response named in the yielded list."""
    current: list[tuple[int, str, bool]] = [(200, "stream_chat.sse", True)]

    def respond(_: dict[str, object]) -> tuple[int, bytes, bool]:
        status, name, streamed = current[0]
        return status, (CAPTURED / name).read_bytes(), streamed

    with canned_server(respond) as (url, _):
        yield url, current


def _send(url: str) -> StreamResult:
    client = ChatClient(url)
    try:
        return client.stream_chat(chat_body("tiny-llama", MESSAGES, max_tokens=None, output_tokens=12))
    finally:
        client.close()


def test_real_stream_counts_every_generated_token(captured: tuple[str, list[tuple[int, str, bool]]]) -> None:
    url, _ = captured
    result = _send(url)
    assert result.ok
    # vLLM's random tiny model emits empty-content chunks (half a UTF-8 character): they are tokens;
    # the role announcement is not
    assert len(result.token_times) == result.completion_tokens == 12
    assert result.prompt_tokens == 18
    assert result.text.startswith("est")


@pytest.mark.parametrize(
    ("response", "category", "status", "code"),
    [
        ((400, "error_context_length.json", False), "context_length", 400, None),
        ((400, "error_context_length_chars.json", False), "context_length", 400, None),
        ((400, "error_max_tokens.json", False), "http_4xx", 400, None),
        ((503, "error_busy_503.json", False), "rate_limited", 503, None),
        ((500, "error_engine_dead_500.json", False), "engine_dead", 500, None),
        # an error object inside a 200 stream: the status line's 200 and the object's code, both kept
        ((200, "stream_error_busy.sse", True), "rate_limited", 200, 503),
        ((200, "stream_error_engine_dead.sse", True), "engine_dead", 200, 500),
    ],
)
def test_real_error_shapes_are_classified(
    captured: tuple[str, list[tuple[int, str, bool]]],
    response: tuple[int, str, bool],
    category: str,
    status: int,
    code: int | None,
) -> None:
    url, current = captured
    current[0] = response
    result = _send(url)
    assert (result.error_category, result.http_status, result.stream_error_code) == (category, status, code)
    if response[2]:
        assert result.error_message.startswith("in-stream error:")
