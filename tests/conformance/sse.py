"""Server-sent event streams: the bytes of a 200 chat completions stream as servers, gateways and
proxies write them, read by llmload's client and by the openai SDK, the reference parser.

Each case's `given` is a `Body`: the response body's bytes, in the pieces the server writes them
(one write each, the first FIRST_S after the request, each next PAUSE_S later), and how the body
is framed. `expect` holds what llmload must read: `category` (None: ok), `text`, `tokens` (output
chunks timed), `usage` (prompt, completion), `ttft_piece` (the piece whose arrival completes the
first output event: its time is the TTFT), `stream_error_code`, `message` (part of the error
message); and `sdk`, what the SDK does with the same bytes: `reads` them (same text, chunks, usage
and finish_reason), `errs` (raises an APIError, after the same text), or None where it departs
from the standard (it dispatches events with no data line and fails to parse them as JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pyarrow.parquet as pq

from llmload.client import ChatClient, Limits, StreamResult
from llmload.recordlog import RecordWriter, request_record
from llmload.records import write_parquet
from llmload.schedule import RunClock
from llmload.server.request import chat_body
from llmload.sse import EventStream
from tests.conformance import Case
from tests.wire_server import Framing, paced_bytes

KIND = "sse"
FIRST_S, PAUSE_S = 0.06, 0.015
TTFT_SLACK_S = 0.05  # a stamp taken when the stream ends instead is PAUSE_S x the pieces left later
MESSAGES = [{"role": "user", "content": "hello"}]
WHATWG = "WHATWG HTML §9.2.6 (interpreting an event stream)"
TOKENS = ["Hello", ",", " world", "!"]
TEXT = "".join(TOKENS)
VLLM_ERROR = {
    "object": "error",
    "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "type": "InternalServerError",
    "param": None,
    "code": 500,
}


@dataclass(frozen=True)
class Body:
    """A response body as written: its pieces, each one write, and its framing (tests/wire_server.py)."""

    pieces: tuple[bytes, ...]
    framing: Framing = "chunked"


def choice(content: str | None = None, *, role: bool = False, finish: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": content}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}  # fmt: skip


def usage(prompt: int = 7, completion: int = len(TOKENS), cached: int | None = None) -> dict[str, Any]:
    details = {"prompt_tokens_details": {"cached_tokens": cached}} if cached is not None else {}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion, **details}}  # fmt: skip


def answer(*, finish: str = "length") -> list[dict[str, Any]]:
    """vLLM's chunks: the role, one a token, the last with its finish_reason."""
    last = len(TOKENS) - 1
    return [choice(role=True), *(choice(t, finish=finish if i == last else None) for i, t in enumerate(TOKENS))]


def data(chunk: dict[str, Any] | str, eol: bytes = b"\n") -> bytes:
    """One event of one data line (`[DONE]` as given), ended by `eol` twice."""
    text = chunk if isinstance(chunk, str) else json.dumps(chunk)
    return b"data: " + text.encode() + eol + eol


def stream(chunks: list[dict[str, Any]], eol: bytes = b"\n", *, done: bool = True) -> tuple[bytes, ...]:
    """One event a piece, then `[DONE]` (unless not `done`)."""
    return tuple(data(c, eol) for c in chunks) + ((data("[DONE]", eol),) if done else ())


def pretty(chunk: dict[str, Any], eol: bytes) -> bytes:
    """One event whose JSON is pretty-printed, one data line per line of it."""
    return b"".join(b"data: " + line.encode() + eol for line in json.dumps(chunk, indent=2).splitlines()) + eol


def split_line_ends(body: bytes) -> tuple[bytes, ...]:
    """`body` cut between the CR and the LF of every CRLF: CR ends one write, LF starts the next."""
    return tuple(body.replace(b"\r\n", b"\r\0\n").split(b"\0"))


OK = {"category": None, "text": TEXT, "tokens": len(TOKENS), "ttft_piece": 1, "sdk": "reads", "finish": "length"}
WITH_USAGE = {**OK, "usage": (7, len(TOKENS))}

CASES: list[Case] = [
    Case(
        "lf_vllm",
        "vLLM's OpenAI server (entrypoints/openai/serving_chat.py): `data: {json}\\n\\n` a chunk, usage, [DONE]",
        Body(stream([*answer(), usage()])),
        WITH_USAGE,
    ),
    Case(
        "crlf",
        f"{WHATWG}: a line ends with CRLF, LF or CR; sse-starlette's ServerSentEvent writes CRLF (DEFAULT_SEPARATOR)",
        Body(stream([*answer(finish="stop"), usage()], b"\r\n")),
        {**WITH_USAGE, "finish": "stop"},
    ),
    Case(
        "crlf_usage_cached",
        f"{WHATWG}; usage with prompt_tokens_details as vLLM sends it with --enable-prompt-tokens-details",
        Body(stream([*answer(), usage(prompt=30, cached=16)], b"\r\n")),
        {**OK, "usage": (30, len(TOKENS)), "cached": 16},
    ),
    Case(
        "cr",
        f"{WHATWG}: a bare CR ends a line too (classic Mac line ends)",
        Body(stream([*answer(), usage()], b"\r")),
        WITH_USAGE,
    ),
    Case(
        "mixed_line_ends",
        f"{WHATWG}: line ends may be mixed in one stream; here LF-only first, then CRLF, CR and both",
        Body(
            (
                data(choice(role=True)),
                data(choice(TOKENS[0])),
                data(choice(TOKENS[1]), b"\r\n"),
                b"data: " + json.dumps(choice(TOKENS[2])).encode() + b"\r\n\n",
                data(choice(TOKENS[3], finish="length"), b"\r"),
                b"data: " + json.dumps(usage()).encode() + b"\n\r\n",
                data("[DONE]", b"\r"),
            )
        ),
        WITH_USAGE,
    ),
    Case(
        "crlf_split_between_writes",
        f"{WHATWG}: CR then LF is ONE line end, even when CR ends one TCP write and LF starts the next",
        Body(
            stream(answer()[:2], b"\r\n", done=False)
            + split_line_ends(b"".join(pretty(c, b"\r\n") for c in [*answer()[2:], usage()]) + data("[DONE]", b"\r\n"))
        ),
        WITH_USAGE,
    ),
    Case(
        "bom_split",
        f"{WHATWG}: one UTF-8 BOM at the stream's start is dropped, here split over two writes",
        Body((b"\xef\xbb", b"\xbf" + data(choice(role=True)), *stream(answer()[1:])[:-1], data("[DONE]"))),
        {**OK, "ttft_piece": 2},
    ),
    Case(
        "comments_and_keepalives",
        f"{WHATWG}: a line starting with ':' is a comment; proxies and sse-starlette send `: ping` heartbeats",
        Body(
            (
                b": ping - 2026-11-29 08:00:00\r\n\r\n",
                b":\n\n",
                data(choice(role=True)),
                b": the first token\n" + data(choice(TOKENS[0])),
                *stream(answer()[2:]),
            )
        ),
        {**OK, "ttft_piece": 3},
    ),
    Case(
        "event_id_retry_fields",
        f"{WHATWG}: event, id and retry fields; the openai SDK reads a chat stream's data whatever the event's name",
        Body(
            (
                b"retry: 3000\nevent: message\nid: 0\n" + data(choice(role=True)),
                *(b"id: %d\nevent: chunk\n" % i + data(c) for i, c in enumerate(answer()[1:], start=1)),
                b"event: done\n" + data("[DONE]"),
            )
        ),
        OK,
    ),
    Case(
        "fields_without_data",
        f"{WHATWG}: an event with no data line is not dispatched (the SDK dispatches it and fails on its JSON)",
        Body((data(choice(role=True)), b"id: 1\n\n", b"retry: 500\r\n\r\n", b"event: ping\r\r", *stream(answer()[1:]))),
        {**OK, "ttft_piece": 4, "sdk": None},
    ),
    Case(
        "empty_data_heartbeat",
        f"{WHATWG}: `data:` with no value dispatches an event of empty data; read as a heartbeat, not as JSON",
        Body((data(choice(role=True)), b"data:\n\n", b"data\r\n\r\n", *stream(answer()[1:]))),
        {**OK, "ttft_piece": 3, "sdk": None},
    ),
    Case(
        "multiline_data",
        f"{WHATWG}: the data lines of one event are joined by LF; a gateway pretty-printing each chunk's JSON",
        Body((*(pretty(c, b"\n") for c in [*answer(), usage()]), data("[DONE]"))),
        WITH_USAGE,
    ),
    Case(
        "data_without_space",
        f"{WHATWG}: ONE space after the colon is dropped, if any; `data:{{...}}` and `data:  {{...}}` both hold JSON",
        Body(
            (
                *(b"data:" + b" " * (i % 3) + json.dumps(c).encode() + b"\n\n" for i, c in enumerate(answer())),
                b"data:[DONE]\n\n",
            )
        ),
        OK,
    ),
    Case(
        "no_done_finish_reason",
        "transformers serve 5.17 (docs/servers.md's table): finish_reason on the last chunk, then closed, no [DONE]",
        Body(stream(answer(finish="stop"), b"\r\n", done=False), framing="close"),
        {**OK, "finish": "stop"},
    ),
    Case(
        "crlf_no_end",
        "a proxy's idle timeout closing a CRLF stream between events: neither finish_reason nor [DONE]",
        Body(stream(answer()[:3], b"\r\n", done=False)),
        {**OK, "category": "incomplete", "text": "Hello,", "tokens": 2, "finish": None, "message": "neither"},
    ),
    Case(
        "cut_mid_event",
        f"{WHATWG}: an event the stream's end cuts before its blank line is not dispatched; the answer lost its end",
        Body((*stream(answer()[:3], b"\r\n", done=False), b'data: {"choices": [{"index": 0, "delta": {"con'), "close"),
        {**OK, "category": "stream_error", "text": "Hello,", "tokens": 2, "finish": None, "message": "mid-event"},
    ),
    Case(
        "cut_mid_chunk",
        "RFC 9112 §8 (incomplete messages): a chunked body whose zero-size last chunk never came (an upstream reset)",
        Body((*stream(answer()[:3], b"\r\n", done=False), b'data: {"choices"'), "chunked_cut"),
        {
            **OK,
            "category": "stream_error",
            "text": "Hello,",
            "tokens": 2,
            "message": "cut short",
            "sdk": "errs",
            "finish": None,
        },
    ),
    Case(
        "error_object_in_200",
        "vLLM's in-stream error (serving_chat.py, create_streaming_error_response) when the engine dies",
        Body(
            (*stream(answer()[:3], b"\r\n", done=False), data({"error": VLLM_ERROR}, b"\r\n"), data("[DONE]", b"\r\n"))
        ),
        {**OK, "category": "engine_dead", "text": "Hello,", "tokens": 2, "stream_error_code": 500, "sdk": "errs"},
    ),
    Case(
        "event_error",
        "openai SDK (_streaming.py, Stream.__stream__): `event: error` reads as any event; its error object raises",
        Body(
            (
                *stream(answer()[:2], done=False),
                b"event: error\n"
                + data({"error": {"message": "Rate limit reached for requests", "type": "requests", "code": 429}}),
            )
        ),
        {**OK, "category": "rate_limited", "text": "Hello", "tokens": 1, "stream_error_code": 429, "sdk": "errs"},
    ),
]


def check(case: Case, tmp_path: Path) -> None:
    body: Body = case.given
    expect = case.expect
    with paced_bytes(body.pieces, first_s=FIRST_S, pause_s=PAUSE_S, framing=body.framing) as url:
        client = ChatClient(url, limits=Limits(first_token_s=2.0, between_tokens_s=1.0, total_s=5.0))
        result = client.stream_chat(chat_body("m", MESSAGES, max_tokens=8, output_tokens=None))
        client.close()
        sdk_chunks, sdk_error = _sdk_read(url) if expect["sdk"] else ([], None)
    read = (
        f"read {result.error_category}: {result.error_message}, {result.text!r} in {len(result.token_times)} chunks,"
        f" usage {result.prompt_tokens}/{result.completion_tokens} ({result.cached_tokens} cached)"
    )
    assert result.error_category == expect["category"], read
    assert expect.get("message", "") in (result.error_message or ""), read
    assert (result.text, len(result.token_times)) == (expect["text"], expect["tokens"]), read
    assert (result.prompt_tokens, result.completion_tokens) == expect.get("usage", (None, None)), read
    assert result.cached_tokens == expect.get("cached"), read
    ttft_s = result.token_times[0] - result.sent_at
    earliest = FIRST_S + PAUSE_S * expect["ttft_piece"]
    assert earliest <= ttft_s < earliest + TTFT_SLACK_S, (
        f"TTFT {ttft_s * 1000:.0f} ms, its piece came at {earliest * 1000:.0f}"
    )
    _check_record(result, expect, tmp_path)
    if expect["sdk"]:
        _check_sdk(sdk_chunks, sdk_error, result, expect)
    # the parser reads the same events whatever the reads' boundaries: here one byte a read
    raw, bytewise = b"".join(body.pieces), EventStream()
    assert [event for i in range(len(raw)) for event in bytewise.feed(raw[i : i + 1])] == EventStream().feed(raw)


def _check_record(result: StreamResult, expect: dict[str, Any], tmp_path: Path) -> None:
    """Both facts reach requests.parquet: the status line's 200 and an in-stream error's own code."""
    record = request_record(run_id="r", worker=0, stage="s", session_id="c", turn=0, scheduled=result.sent_at,
                            result=result, clock=RunClock.now())  # fmt: skip
    jsonl = tmp_path / "requests.jsonl"
    writer = RecordWriter(jsonl)
    writer.write([record])
    writer.close()
    write_parquet(jsonl, tmp_path / "requests.parquet")
    table = pq.read_table(tmp_path / "requests.parquet", columns=["http_status", "stream_error_code"]).to_pylist()
    assert table == [{"http_status": 200, "stream_error_code": expect.get("stream_error_code")}]


def _sdk_read(url: str) -> tuple[list[Any], Exception | None]:
    """The openai SDK's chunks of the same body, and the exception that ended its reading, if any."""
    sdk = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=5.0)
    chunks: list[Any] = []
    try:
        for chunk in sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
            chunks.append(chunk)
    except Exception as exc:
        return chunks, exc
    finally:
        sdk.close()
    return chunks, None


def _check_sdk(chunks: list[Any], error: Exception | None, result: StreamResult, expect: dict[str, Any]) -> None:
    """llmload reads what the SDK reads: the same text in as many output chunks, the same usage and
    finish_reason; where the SDK raises, it does so after the same text, with the same error code."""
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert ("".join(content), len(content)) == (result.text, len(result.token_times))
    if expect["sdk"] == "errs":
        assert isinstance(error, openai.APIError), error
        code = error.body.get("code") if isinstance(error.body, dict) else None
        assert code == result.stream_error_code
        return
    assert error is None, error
    told = next((c.usage for c in chunks if c.usage), None)
    assert ((told.prompt_tokens, told.completion_tokens) if told else (None, None)) == (
        result.prompt_tokens,
        result.completion_tokens,
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ([expect["finish"]] if expect["finish"] else [])
