"""The client on vLLM 0.32's real wire bytes (captured in tests/data/vllm-0.32), served over loopback HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmload.client import ChatClient, StreamResult, chat_body

CAPTURED = Path(__file__).parent / "data" / "vllm-0.32"
MESSAGES = [{"role": "user", "content": "hi"}]


class _Replay(BaseHTTPRequestHandler):
    """Answers every POST with one captured response: (status, body file, streamed?)."""

    protocol_version = "HTTP/1.1"
    response: tuple[int, str, bool] = (200, "stream_chat.sse", True)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, name, streamed = self.response
        body = (CAPTURED / name).read_bytes()
        self.send_response(status)
        if streamed:
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in body.split(b"\n\n"):
                if event.strip():
                    payload = event + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replay() -> Iterator[tuple[str, type[_Replay]]]:
    handler = type("Handler", (_Replay,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def _send(url: str) -> StreamResult:
    client = ChatClient(url)
    try:
        return client.stream_chat(chat_body("tiny-llama", MESSAGES, max_tokens=None, output_tokens=12))
    finally:
        client.close()


def test_real_stream_counts_every_generated_token(replay: tuple[str, type[_Replay]]) -> None:
    url, _ = replay
    result = _send(url)
    assert result.ok
    # vLLM's random tiny model emits empty-content chunks (half a UTF-8 character): they are tokens;
    # the role announcement is not
    assert len(result.token_times) == result.completion_tokens == 12
    assert result.prompt_tokens == 18
    assert result.text.startswith("est")


@pytest.mark.parametrize(
    ("response", "category", "status"),
    [
        ((400, "error_context_length.json", False), "context_length", 400),
        ((400, "error_context_length_chars.json", False), "context_length", 400),
        ((400, "error_max_tokens.json", False), "http_4xx", 400),
        ((503, "error_busy_503.json", False), "rate_limited", 503),
        ((500, "error_engine_dead_500.json", False), "engine_dead", 500),
        ((200, "stream_error_busy.sse", True), "rate_limited", 503),
        ((200, "stream_error_engine_dead.sse", True), "engine_dead", 500),
    ],
)
def test_real_error_shapes_are_classified(
    replay: tuple[str, type[_Replay]], response: tuple[int, str, bool], category: str, status: int
) -> None:
    url, handler = replay
    handler.response = response
    result = _send(url)
    assert (result.error_category, result.http_status) == (category, status)
    if response[2]:
        assert result.error_message.startswith("in-stream error:")
