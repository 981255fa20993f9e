"""Streaming chat client: one HTTP request, every chunk timed, the outcome classified.

The hot path reads the response event by event as each read of geventhttpclient (the transport
Locust's FastHttpUser wraps) brings it, cutting vLLM's one-line `data:` events straight from the
buffer and any other event shape through the standard's parser (llmload.sse), and parses each
event's JSON with orjson. The openai SDK's chunk objects and Locust's block-wise `iter_lines()`
both distort timing under load (measured on this kind of 2-core machine: about 180 µs of CPU per
SDK chunk object, TTFT p99 off by seconds under load; `iter_lines()` reads 1,024-byte blocks, so
several events share one time stamp), so neither is on this path; the SDK is the reference parser
in tests.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import gevent
import orjson
from geventhttpclient.response import HTTPConnectionClosed
from geventhttpclient.url import URL
from pydantic import PositiveFloat
from pydantic.dataclasses import dataclass as checked_dataclass

from llmload.access import Access
from llmload.cancel import Cut
from llmload.drain import AGE_FACTOR, DrainOver
from llmload.failures import (
    classify_exception,
    classify_http_status,
    classify_stream_error,
    clip,
    parse_error_body,
)
from llmload.models import FailureCategory
from llmload.sse import BOM, EventStream

CHAT_PATH = "/v1/chat/completions"
HEALTH_PATH = "/health"


@checked_dataclass(frozen=True)
class Limits:
    """Per-request limits: a stalled or endless stream ends as `timeout`, never hangs the run (each
    > 0: a limit of 0 would fail every request)."""

    connect_s: PositiveFloat = 10.0
    first_token_s: PositiveFloat = 120.0
    between_tokens_s: PositiveFloat = 30.0
    total_s: PositiveFloat = 600.0


@dataclass(slots=True)
class StreamResult:
    """What one request did, in perf_counter seconds; turned into a record by the runner."""

    sent_at: float
    finished_at: float = 0.0
    http_status: int | None = None  # the response's status line
    stream_error_code: int | None = None  # the `code` of an error object inside a 200 stream, where it has one
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_chunks: int = 0  # chunks whose delta carried reasoning, not answer
    first_answer_at: float | None = None  # the first answer chunk (content, tool call) after any reasoning
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, where sent
    error_category: FailureCategory | None = None
    error_message: str | None = None
    stopped: bool = False  # the run was stopped (Ctrl-C, SIGTERM) while this request was in flight

    @property
    def ok(self) -> bool:
        return self.error_category is None

    @property
    def first_token_at(self) -> float | None:
        return self.token_times[0] if self.token_times else None


NOT_OUTPUT, ANSWER, REASONING = 0, 1, 2
CR, SPACE = b"\r", 0x20


class PlannedCut(Exception):
    """The plan closes this stream here (llmload.cancel): the connection is dropped, as a closed tab's is."""


def _delta_output(delta: dict[str, Any]) -> tuple[int, str]:
    """(what this delta carries: NOT_OUTPUT, ANSWER or REASONING, its answer text).

    Reasoning is vLLM's `reasoning` (0.32 on) or `reasoning_content` (earlier): a delta carrying
    both, the end of thinking, is the first answer when its content is not empty. The role
    announcement (`{"role": "assistant", "content": ""}`) is not output. An empty content delta
    without a role is: vLLM sends those while a token's bytes are an incomplete UTF-8 character,
    and the token was generated at that moment.
    """
    text = delta.get("content")
    if text:
        return ANSWER, text
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return REASONING, ""
    if delta.get("tool_calls"):
        return ANSWER, ""
    return (ANSWER if text is not None and "role" not in delta else NOT_OUTPUT), ""


class ChatClient:
    """A connection to one target; not shared between concurrent sessions (one per Locust user)."""

    def __init__(self, base_url: str, *, access: Access | None = None, limits: Limits | None = None) -> None:
        url = URL(base_url)
        self.limits = limits or Limits()
        prefix = url.path.rstrip("/")
        self.path = (prefix[: -len("/v1")] if prefix.endswith("/v1") else prefix) + CHAT_PATH
        access = access or Access()
        self._secrets = access.secrets
        self._http = access.http_client(
            url,
            concurrency=1,
            connection_timeout=self.limits.connect_s,
            network_timeout=self.limits.first_token_s,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        self._health_path = self.path[: -len(CHAT_PATH)] + HEALTH_PATH
        self._health = access.http_client(url, concurrency=1, connection_timeout=2.0, network_timeout=2.0)

    def close(self) -> None:
        self._http.close()
        self._health.close()

    def probe_health(self) -> int | None:
        """GET /health on a connection of its own: the status, or None when the server is unreachable."""
        try:
            response = self._health.get(self._health_path)
            response.read()
            return int(response.get_code())
        except Exception:
            return None

    def stream_chat(
        self,
        body: bytes,
        *,
        deadline: float | None = None,
        headers: dict[str, str] | None = None,
        cut: Cut | None = None,
    ) -> StreamResult:
        """Send one streaming chat completion and time every output chunk.

        `deadline` (perf_counter) is the end of the run's drain: a request still running then is
        `unfinished` (the target did not keep up), so a run always ends by itself. `headers`: this
        request's own, beside the client's (the session's id for a router's affinity). `cut`: where the
        plan closes this stream on purpose (`abandoned`; llmload.cancel).
        """
        result = StreamResult(sent_at=time.perf_counter())
        budget = self.limits.total_s
        run_ends_first = deadline is not None and deadline - result.sent_at < budget
        if deadline is not None and run_ends_first:
            budget = max(0.0, deadline - result.sent_at)
        response = None
        cut_s = gevent.Timeout(cut.seconds, PlannedCut) if cut is not None and cut.seconds is not None else None
        cut_tokens = cut.tokens if cut is not None and cut.tokens is not None else 0
        try:
            with gevent.Timeout(budget), cut_s or contextlib.nullcontext():
                response = self._post(body, headers)
                result.http_status = response.get_code()
                if result.http_status != 200:
                    message, param = parse_error_body(response.read())
                    result.error_category = classify_http_status(result.http_status, message, param)
                    result.error_message = clip(message, self._secrets)
                elif not_a_stream(response.get("content-type")):
                    result.error_category = "malformed"
                    snippet = response.read(200).decode("utf-8", "replace")
                    result.error_message = clip(
                        f"HTTP 200 {response.get('content-type')}, not an event stream: {snippet}", self._secrets
                    )
                else:
                    self._read_stream(response, result, cut_tokens)
        except gevent.Timeout:
            if run_ends_first:
                result.error_category = "unfinished"
                ran = time.perf_counter() - result.sent_at
                result.error_message = f"still running when the drain after the plan ended, after {ran:.1f} s"
            else:
                result.error_category = "timeout"
                result.error_message = f"no complete response within {self.limits.total_s:g} s"
        except DrainOver:
            ran = time.perf_counter() - result.sent_at
            result.error_category = "unfinished"
            result.error_message = (
                f"still running when the drain after the plan ended, after {ran:.1f} s: older than"
                f" {AGE_FACTOR:g}× the longest answer seen, with no answer for as long, so not waited for"
            )
        except PlannedCut:
            result.error_category = "abandoned"
            result.error_message = (
                f"cut by the plan after {len(result.token_times)} tokens, {time.perf_counter() - result.sent_at:.2f} s"
                " (--cancel-share), as a user who closes the tab"
            )
        except gevent.GreenletExit:
            # recorded by the caller, which then lets the stop go on
            result.error_category = "cancelled"
            result.error_message = "run stopped while the request was in flight"
            result.stopped = True
        except Exception as exc:
            category, message = classify_exception(exc, got_response=response is not None)
            if category == "timeout":
                limit = self.limits.between_tokens_s if result.token_times else self.limits.first_token_s
                phase = "next token" if result.token_times else "first token"
                message = f"no {phase} within {limit:g} s"
            result.error_category = category
            result.error_message = clip(message, self._secrets)
        finally:
            result.finished_at = time.perf_counter()
            if response is not None:
                response.release()  # back to the pool when complete, closed when not
        return result

    def _post(self, body: bytes, headers: dict[str, str] | None) -> Any:
        """POST, retrying once when a pooled keep-alive connection turns out closed by the server."""
        try:
            return self._http.request("POST", self.path, body=body, headers=headers)
        except (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError):
            return self._http.request("POST", self.path, body=body, headers=headers)

    def _read_stream(self, response: Any, result: StreamResult, cut_tokens: int) -> None:
        """Every event until `[DONE]` or the end of the body. A stream is complete with a `[DONE]` or a
        choice's finish_reason (transformers serve never sends `[DONE]`); one that ends with neither lost
        its end (`incomplete`), one that ends mid-event was cut (`stream_error`), and an event that is not
        JSON is `malformed`. An error object inside it fails the request. With `cut_tokens`, PlannedCut
        is raised once that many output chunks came.

        Events are read as the standard defines them (llmload.sse). While the stream is LF-only, as
        vLLM's is, each one-line `data:` event is cut straight from the response's buffer the moment its
        blank line is there; any other event goes through the general parser, and so does the whole rest
        of the stream from its first CR (or a BOM at its start). Each event is timed when the read that
        completed it returned."""
        sock = response._sock
        buffer: bytearray = response._body_buffer  # the body received and not yet read, appended to in place
        find = buffer.find
        now = time.perf_counter
        loads = orjson.loads
        token_times = result.token_times
        parts: list[str] = []
        timeout_switched = False
        reasoning, first_answer = 0, None  # kept in locals while the stream runs: every chunk passes here
        last: dict[str, Any] = {}  # the last choice: a stream without [DONE] is complete if it has a finish_reason
        while not buffer and _receive(response):
            pass
        general = buffer[:1] == BOM[:1] or CR in buffer  # every event through the parser from here on
        parser = EventStream(start=general)
        ready: list[bytes] = []  # events the parser completed, not yet taken, the next one last
        t = 0.0  # when the event being read came
        try:
            while True:
                if ready:
                    payload: bytes | bytearray = ready.pop()
                elif not general and (end := find(b"\n\n")) >= 0:
                    t = now()
                    if buffer.startswith(b"data:") and find(b"\n", 0, end) < 0:  # one data line: the common case
                        payload = buffer[6:end] if buffer[5] == SPACE else buffer[5:end]
                        del buffer[: end + 2]
                    else:
                        ready = parser.feed(bytes(buffer[: end + 2]))[::-1]
                        del buffer[: end + 2]
                        continue
                elif general and buffer:  # bytes the parser has not seen
                    t = now()
                    ready = parser.feed(bytes(buffer))[::-1]
                    del buffer[:]
                    continue
                else:
                    seen = len(buffer)
                    more = _receive(response)
                    if general and not more:  # the body ended: mid-event, if the parser holds part of one
                        if result.error_category is None:
                            finished = last.get("finish_reason") is not None
                            _stream_closed(result, parser.unfinished, len(token_times), finished)
                        break
                    if not more or find(CR, seen) >= 0:  # what is left of an LF-only stream goes to the parser
                        general = True
                    continue
                if payload.startswith(b"[DONE]"):
                    response.read()  # the closing chunk, so the connection can be reused
                    break
                try:
                    chunk = loads(payload)
                except orjson.JSONDecodeError:
                    if not payload.strip():
                        continue  # an event with empty data: nothing to read
                    result.error_category = "malformed"
                    message = f"an event after {len(token_times)} tokens is not JSON: {bytes(payload[:200])!r}"
                    result.error_message = clip(message, self._secrets)
                    break
                choices = chunk.get("choices")
                if choices:
                    last = choices[0]
                    output, text = _delta_output(last.get("delta") or {})
                    if output:
                        token_times.append(t)
                        if cut_tokens and len(token_times) >= cut_tokens:
                            raise PlannedCut
                        if output == REASONING:
                            reasoning += 1
                        elif first_answer is None:
                            first_answer = t
                        if text:
                            parts.append(text)
                        if not timeout_switched and sock is not None:
                            sock.settimeout(self.limits.between_tokens_s)
                            timeout_switched = True
                elif error := chunk.get("error"):  # as the openai SDK: a null or empty error is none
                    category, result.stream_error_code, message = classify_stream_error(error)
                    result.error_category = category
                    result.error_message = clip(message, self._secrets)
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = details.get("cached_tokens")
                    result.reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        finally:
            if timeout_switched and sock is not None:
                sock.settimeout(self.limits.first_token_s)
            result.text = "".join(parts)
            result.reasoning_chunks, result.first_answer_at = reasoning, first_answer


def _receive(response: Any) -> bool:
    """One read from the connection into the response's body buffer (`_body_buffer`, de-chunked), as
    geventhttpclient's own `readline` reads: False when the body had already ended. Raises
    HTTPParseError when the connection closes before the body's end, TimeoutError past the socket's
    timeout."""
    if response.message_complete:
        return False
    sock = response._sock
    if sock is None:
        raise HTTPConnectionClosed("connection closed.")
    response.feed(sock.recv(response.block_size))
    return True


def not_a_stream(content_type: str | None) -> bool:
    """A 200 whose body cannot be the stream asked for: an HTML page, a JSON answer (stream ignored)."""
    return content_type is not None and not content_type.startswith("text/event-stream")


def _stream_closed(result: StreamResult, tail: bytes, tokens: int, finished: bool) -> None:
    """The server closed the stream before `[DONE]`: complete if its last choice had a finish_reason
    (some servers send no `[DONE]`), else the request failed, and how."""
    if tail:
        result.error_category = "stream_error"
        result.error_message = f"stream cut short mid-event after {tokens} tokens: {tail[:120]!r}"
    elif not finished:
        result.error_category = "incomplete"
        result.error_message = (
            f"the stream closed after {tokens} tokens with neither a finish_reason nor [DONE]: its end was lost"
        )
