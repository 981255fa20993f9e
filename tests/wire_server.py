"""A loopback HTTP/1.1 server for client tests: canned responses, request bodies kept for inspection."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

# (status, body, streamed as chunked SSE?)
Response = tuple[int, bytes, bool]
Responder = Callable[[dict[str, Any]], Response]


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chat_stream(text_tokens: list[str], prompt_tokens: int = 7) -> bytes:
    """A vLLM-shaped stream: role chunk, one chunk per token, usage, [DONE]."""
    return sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        *({"choices": [{"index": 0, "delta": {"content": t}}]} for t in text_tokens),
        {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text_tokens)}},
    )


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing, with `answer` for a whole (not streamed) body."""

    def answer(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": content_type, **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def canned_server(
    respond: Responder, headers: list[dict[str, str]] | None = None
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Yields (base URL, list of received JSON bodies); each request's headers go to `headers` when given."""
    received: list[dict[str, Any]] = []

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            if headers is not None:
                headers.append(dict(self.headers))
            status, payload, streamed = respond(body)
            if streamed:
                self.send_response(status)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in payload.split(b"\n\n"):
                    if event.strip():
                        part = event + b"\n\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.answer(status, payload, "application/json")

    with serve(Handler) as url:
        yield url, received


Framing = Literal["chunked", "chunked_cut", "close"]


@contextmanager
def paced_bytes(
    pieces: Sequence[bytes],
    *,
    first_s: float,
    pause_s: float,
    framing: Framing = "chunked",
    content_type: str = "text/event-stream",
) -> Iterator[str]:
    """Yields a base URL whose every POST is answered 200 with `pieces` as the body, exactly as given:
    each piece one write of its own (TCP_NODELAY, so one segment), the first `first_s` after the
    request, each next `pause_s` after the one before. `framing`: chunked transfer encoding, one chunk
    a piece, ended (`chunked`) or the connection closed before the last chunk (`chunked_cut`); or no
    length, the body ended by closing the connection (`close`, as HTTP/1.0 servers and some gateways do)."""

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header(*(("Connection", "close") if framing == "close" else ("Transfer-Encoding", "chunked")))
            self.end_headers()
            for index, piece in enumerate(pieces):
                time.sleep(pause_s if index else first_s)
                self.wfile.write(piece if framing == "close" else b"%x\r\n%s\r\n" % (len(piece), piece))
            if framing == "chunked":
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.close_connection = True

    with serve(Handler) as url:
        yield url


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` on 127.0.0.1 (a free port), in a thread, until the block ends; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def text_pages(page: Callable[[str], str | None]) -> type[BaseHTTPRequestHandler]:
    """A GET handler answering `page(path)` as Prometheus text, or 404 when it is None."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = page(self.path)
            self.answer(404 if body is None else 200, (body or "").encode(), "text/plain; version=0.0.4; charset=utf-8")

    return Handler
