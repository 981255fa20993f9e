"""Request logs in, `LogRequest`s out: format detection and one streaming parser per format.

Parsers read one line (or one JSON value) at a time and yield, in file order, a `LogRequest`
for each request or an `Issue` for each line they cannot use, so a caller can report every bad
line as `file:line: reason` and memory stays flat however long the log is. They keep what the
log tells and nothing more: fields a log lacks stay None, and tokenizing, grouping into
sessions and synthesis are the builder's job (`llmload.workload.build`).
"""

from __future__ import annotations

import ast
import csv
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import orjson

from llmload.models import Message
from llmload.workload.files import WorkloadError

MOONCAKE_BLOCK_TOKENS = 512
_ROLES = frozenset(get_args(Message.model_fields["role"].annotation))
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
}
_DETECT_BYTES = 1 << 16
_CHUNK_CHARS = 1 << 20
_SEPARATORS = re.compile(r"[\s,]*")


@dataclass(slots=True)
class LogRequest:
    """One request as a log tells it; fields the log lacks stay None."""

    where: str
    timestamp: float | None = None
    """Seconds on the log's clock (unix time, or the trace's own origin): only differences matter."""
    messages: list[dict[str, str]] | None = None
    """The chat messages as sent, history included; None for length-only traces."""
    max_tokens: int | None = None
    prompt_tokens: int | None = None
    """The server's own count (usage, prompt_token_ids) or the trace's length."""
    output_tokens: int | None = None
    reply: str | None = None
    """The assistant's reply text, when the log holds it."""
    finished: float | None = None
    """When the response ended, on the same clock as `timestamp`, when the log says."""
    session: str | None = None
    """An explicit conversation id (ShareGPT); other formats are grouped by message prefix."""
    last: bool = False
    """The conversation's last request: its session can be closed now."""
    hash_ids: list[int] | None = None
    """Mooncake prefix blocks (512 tokens each, the last one may be partial)."""


@dataclass(frozen=True, slots=True)
class Issue:
    """A line that gives no request: fatal (malformed) or merely ignored (noted in the summary)."""

    where: str
    reason: str
    fatal: bool = True

    @property
    def kind(self) -> str:
        """The reason without its details, for counting skipped lines by reason."""
        return self.reason.split(":", 1)[0]


Parsed = LogRequest | Issue
Parser = Callable[[Path], Iterator[Parsed]]


class _Bad(ValueError):
    """Raised inside a parser for one unusable line; becomes an `Issue`."""


# --------------------------------------------------------------------------- shared helpers


def _int(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"not an integer: {what} is {value!r}")
    if value < minimum:
        raise _Bad(f"out of range: {what} is {value}, below {minimum}")
    return value


def _optional_int(value: object, what: str, *, minimum: int = 0) -> int | None:
    return None if value is None else _int(value, what, minimum=minimum)


def _timestamp(value: object) -> float | None:
    """Unix seconds, unix milliseconds (> 1e11) or an ISO 8601 string (naive = UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _Bad(f"bad timestamp: {value!r}")
    if isinstance(value, int | float):
        return value / 1000 if value > 1e11 else float(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise _Bad(f"bad timestamp: {value!r} is not ISO 8601") from None
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    raise _Bad(f"bad timestamp: {value!r}")


def _content(value: object, where: str) -> str:
    """Message content as text: a string, null (tool-call turns) or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise _Bad(f"unsupported content: {where} has a {kind or part!r} part (text only)")
            texts.append(part["text"])
        return "".join(texts)
    raise _Bad(f"unsupported content: {where} is a {type(value).__name__}")


def _messages(value: object) -> list[dict[str, str]]:
    """OpenAI chat messages reduced to role and text content (the replay sends nothing else)."""
    if not isinstance(value, list) or not value:
        raise _Bad("no messages: messages is not a non-empty list")
    out = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise _Bad(f"bad message: messages[{index}] is not an object")
        role = message.get("role")
        if role not in _ROLES:
            raise _Bad(f"unsupported role: messages[{index}] has role {role!r}")
        content = message.get("content")
        if type(content) is str and len(message) == 2:
            out.append(message)  # already {role, content}: keep the decoded dict
        else:
            out.append({"role": role, "content": _content(content, f"messages[{index}]")})
    return out


def _json_lines(path: Path) -> Iterator[tuple[str, Any] | Issue]:
    """(where, value) for each non-blank line of a JSONL file, or an Issue for invalid JSON."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield Issue(where, f"not valid JSON: {exc}")


def _records(
    items: Iterator[tuple[str, Any] | Issue], parse: Callable[[str, dict[str, Any]], Iterator[LogRequest]]
) -> Iterator[Parsed]:
    """Run a per-record parser over decoded JSON values, turning its `_Bad` into Issues."""
    for item in items:
        if isinstance(item, Issue):
            yield item
            continue
        where, value = item
        try:
            if not isinstance(value, dict):
                raise _Bad(f"not a JSON object: a {type(value).__name__}")
            yield from parse(where, value)
        except _Bad as exc:
            yield Issue(where, str(exc))


# --------------------------------------------------------------------------- openai-jsonl


def _openai_record(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """A bare chat-completions request body, or a `{timestamp, request, response}` record. The
    response's end, when given as `response_timestamp` or `latency_ms`, separates a user's think
    time from the time the reply took.

    Example lines::

        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
        {"timestamp": "2026-11-20T10:00:00Z", "latency_ms": 840, "request": {"messages": [...], "max_tokens": 64},
         "response": {"choices": [{"message": {"role": "assistant", "content": "Hello"}}],
                      "usage": {"prompt_tokens": 9, "completion_tokens": 2}}}
    """
    body = record.get("request", record)
    if not isinstance(body, dict):
        raise _Bad("bad record: request is not an object")
    response = record.get("response") or {}
    if not isinstance(response, dict):
        raise _Bad("bad record: response is not an object")
    usage = response.get("usage") or {}
    if not isinstance(usage, dict):
        raise _Bad("bad record: response.usage is not an object")
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    reply = message.get("content") if isinstance(message, dict) else None
    timestamp = _timestamp(record.get("timestamp"))
    finished = _timestamp(record.get("response_timestamp"))
    latency_ms = record.get("latency_ms")
    if latency_ms is not None:
        if not isinstance(latency_ms, (int, float)) or isinstance(latency_ms, bool) or latency_ms < 0:
            raise _Bad(f"bad latency_ms: {latency_ms!r} is not a number of milliseconds ≥ 0")
        if timestamp is not None:
            finished = timestamp + latency_ms / 1000
    yield LogRequest(
        where=where,
        timestamp=timestamp,
        finished=finished,
        messages=_messages(body.get("messages")),
        max_tokens=_optional_int(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens", minimum=1),
        prompt_tokens=_optional_int(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        output_tokens=_optional_int(usage.get("completion_tokens"), "usage.completion_tokens"),
        reply=reply if isinstance(reply, str) else None,
    )


def parse_openai_jsonl(path: Path) -> Iterator[Parsed]:
    """OpenAI chat-completions request logs, one JSON object per line (see `_openai_record`)."""
    return _records(_json_lines(path), _openai_record)


# --------------------------------------------------------------------------- sharegpt


def _sharegpt_conversation(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """One ShareGPT conversation: a request at each reply, its messages the history before it.

    Example::

        {"id": "c1", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                                       {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Bye!"}]}

    gives two requests: [user Hi] (reply "Hello!") and [user Hi, assistant Hello!, user Bye]
    (reply "Bye!"). Replies directly after a reply join the next request's messages.
    """
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise _Bad("bad conversation: conversations is not a non-empty list")
    messages: list[dict[str, str]] = []
    requests: list[LogRequest] = []
    session = where  # ShareGPT ids are not always unique; the record's place is
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise _Bad(f"bad conversation: conversations[{index}] is not a {{from, value}} object with text")
        role = _SHAREGPT_ROLES.get(str(turn.get("from")))
        if role is None:
            raise _Bad(f"unsupported speaker: conversations[{index}] is from {turn.get('from')!r}")
        asks = role == "assistant" and any(m["role"] == "user" for m in messages)
        if asks and messages[-1]["role"] != "assistant":
            requests.append(LogRequest(where, messages=list(messages), reply=turn["value"], session=session))
        messages.append({"role": role, "content": turn["value"]})
    if messages[-1]["role"] != "assistant" and any(m["role"] == "user" for m in messages):
        requests.append(LogRequest(where, messages=messages, session=session))  # unanswered last message
    if not requests:
        raise _Bad("no human message: nothing to replay")
    requests[-1].last = True
    yield from requests


def _skip_separators(text: str, position: int) -> int:
    match = _SEPARATORS.match(text, position)
    return match.end() if match else position


def _json_array_items(path: Path) -> Iterator[tuple[str, Any] | Issue]:
    """(where, item) for each element of a top-level JSON array, without loading the whole file.

    ShareGPT dumps are single arrays of hundreds of MB; elements are decoded one at a time from
    a sliding buffer. A malformed element ends the array (there is no resynchronizing).
    """
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as handle:
        buffer, position, line, eof = "", 0, 1, False

        def refill() -> None:
            nonlocal buffer, position, eof
            chunk = handle.read(_CHUNK_CHARS)
            eof = not chunk
            buffer, position = buffer[position:] + chunk, 0

        refill()
        opening = _skip_separators(buffer, 0)
        if not buffer.startswith("[", opening):
            yield Issue(f"{path}:1", "not valid JSON: not a JSON array")
            return
        line += buffer.count("\n", 0, opening)
        position = opening + 1
        while True:
            skip = _skip_separators(buffer, position)
            line += buffer.count("\n", position, skip)
            position = skip
            if position == len(buffer) and not eof:
                refill()
                continue
            where = f"{path}:{line}"
            if buffer.startswith("]", position):
                return
            try:
                item, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError as exc:
                if not eof:  # an element cut by the buffer's end: read on and retry
                    refill()
                    continue
                yield Issue(where, f"not valid JSON: {exc.msg}")
                return
            yield where, item
            line += buffer.count("\n", position, end)
            position = end


def parse_sharegpt(path: Path) -> Iterator[Parsed]:
    """ShareGPT conversations: a JSON array (streamed element by element) or JSONL."""
    with path.open("rb") as handle:
        array = handle.read(_DETECT_BYTES).lstrip().startswith(b"[")
    return _records(_json_array_items(path) if array else _json_lines(path), _sharegpt_conversation)


# --------------------------------------------------------------------------- mooncake


def _mooncake_record(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """A Mooncake trace line; `hash_ids` name the prompt's 512-token blocks (shared = same prefix).

    Example::

        {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 59]}
    """
    stamp = record.get("timestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        raise _Bad(f"bad timestamp: {stamp!r} is not a number of milliseconds")
    length = _int(record.get("input_length"), "input_length", minimum=1)
    hash_ids = record.get("hash_ids") or []
    if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
        raise _Bad("bad hash_ids: not a list of integers")
    if hash_ids and len(hash_ids) != -(-length // MOONCAKE_BLOCK_TOKENS):
        raise _Bad(f"bad hash_ids: {len(hash_ids)} blocks for input_length {length} (512 tokens per block)")
    yield LogRequest(
        where=where,
        timestamp=stamp / 1000,
        prompt_tokens=length,
        output_tokens=_int(record.get("output_length"), "output_length"),
        hash_ids=hash_ids or None,
    )


def parse_mooncake(path: Path) -> Iterator[Parsed]:
    """Mooncake-style JSONL traces (timestamp in ms, input_length, output_length, hash_ids)."""
    return _records(_json_lines(path), _mooncake_record)


# --------------------------------------------------------------------------- azure-trace

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_azure_trace(path: Path) -> Iterator[Parsed]:
    """Azure LLM inference trace CSV (2023/2024): one request per row, lengths only.

    Example::

        TIMESTAMP,ContextTokens,GeneratedTokens
        2023-11-16 18:15:46.6805900,374,44
    """
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != _AZURE_COLUMNS:
            yield Issue(f"{path}:1", f"bad header: not {','.join(_AZURE_COLUMNS)}")
            return
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:
                continue
            try:
                stamp, context, generated = row[:3]
                yield LogRequest(
                    where=where,
                    timestamp=_timestamp(stamp.strip()),
                    prompt_tokens=_int(int(context), "ContextTokens", minimum=1),
                    output_tokens=_int(int(generated), "GeneratedTokens"),
                )
            except ValueError as exc:  # includes _Bad, short rows and non-integer fields
                yield Issue(where, f"bad row: {exc}")


# --------------------------------------------------------------------------- vllm-log

_PY_STR = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|None)"""
_TOKEN_IDS = r"(\[[\d, ]*\]|None)"
# vLLM ≥ 0.10: details at DEBUG, then the INFO line, from one call (RequestLogger.log_inputs).
_DETAILS = re.compile(rf"Request (\S+) details: prompt: ({_PY_STR}), prompt_token_ids: {_TOKEN_IDS}")
_RECEIVED = re.compile(r"Received request (\S+): params: (.*)")
_BODY = re.compile(r"Request (\S+) JSON body: (.*)")
# vLLM ≤ 0.9: one INFO line with everything.
_RECEIVED_OLD = re.compile(
    rf"Received request (\S+): prompt: ({_PY_STR}), (?:sampling_)?params: (.*?), prompt_token_ids: {_TOKEN_IDS}"
)
_STAMP_FULL = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)")
_STAMP_SHORT = re.compile(r"(?<![\d-])(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_VLLM_LINE = re.compile(r"(?:INFO|DEBUG|WARNING|ERROR) \d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_PENDING_MAX = 10_000


def _sampling(params: str) -> tuple[int | None, int | None]:
    """(max_tokens, forced output) from a SamplingParams repr; ignore_eos forces max_tokens out."""
    found = re.search(r"\bmax_tokens=(\d+)", params)
    max_tokens = int(found.group(1)) if found else None
    forced = max_tokens if "ignore_eos=True" in params else None
    return max_tokens, forced


def _count_ids(ids: str) -> int | None:
    return None if ids == "None" else (0 if ids == "[]" else ids.count(",") + 1)


class _VllmClock:
    """vLLM's default log time is `MM-DD hh:mm:ss` (no year): keep it monotonic across new year."""

    def __init__(self) -> None:
        self.year, self.last = 2000, 0.0

    def read(self, line: str) -> float | None:
        full = _STAMP_FULL.search(line)
        if full:
            return _timestamp(full.group(1).replace(",", "."))
        short = _STAMP_SHORT.search(line)
        if not short:
            return None
        month, day, hour, minute, second = (int(g) for g in short.groups()[:5])
        fraction = float(f"0.{short.group(6)}") if short.group(6) else 0.0
        stamp = datetime(self.year, month, day, hour, minute, second, tzinfo=UTC).timestamp() + fraction
        if stamp < self.last - 180 * 86400:
            self.year += 1
            stamp = datetime(self.year, month, day, hour, minute, second, tzinfo=UTC).timestamp() + fraction
        self.last = stamp
        return stamp


def _bounded_put(pending: OrderedDict[str, Any], key: str, value: Any) -> None:
    pending[key] = value
    if len(pending) > _PENDING_MAX:
        pending.popitem(last=False)


def parse_vllm_log(path: Path) -> Iterator[Parsed]:
    """vLLM server logs with `--enable-log-requests`; other lines are skipped.

    vLLM ≥ 0.10 (checked against 0.32's `RequestLogger`) logs at INFO only
    `Received request chatcmpl-…: params: SamplingParams(… max_tokens=…), lora_request: None.`;
    the prompt comes at DEBUG (`VLLM_LOGGING_LEVEL=DEBUG`), just before, as
    `Request chatcmpl-… details: prompt: '<templated>', prompt_token_ids: [...]`, and the request
    body before that as `Request … JSON body: {...}`. Older vLLM logs one line:
    `Received request chatcmpl-…: prompt: '…', params: SamplingParams(…), prompt_token_ids: [...]`.

    The prompt length is `prompt_token_ids` (the server's own count). The messages are the JSON
    body's when it was logged, so multi-turn chats group into sessions; otherwise the templated
    prompt becomes one user message. `ignore_eos=True` means the output was `max_tokens` long.
    """
    clock = _VllmClock()
    prompts: OrderedDict[str, tuple[str | None, int | None]] = OrderedDict()
    bodies: OrderedDict[str, str] = OrderedDict()
    logs_bodies = False
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            if "equest " not in raw:
                continue
            line = _ANSI.sub("", raw) if "\x1b" in raw else raw
            where = f"{path}:{number}"
            try:
                if (body := _BODY.search(line)) is not None:
                    logs_bodies = True
                    _bounded_put(bodies, body.group(1), body.group(2))
                elif (details := _DETAILS.search(line)) is not None:
                    prompt = ast.literal_eval(details.group(2))
                    _bounded_put(prompts, details.group(1), (prompt, _count_ids(details.group(3))))
                elif (old := _RECEIVED_OLD.search(line)) is not None:
                    _, prompt, params, ids = old.groups()
                    stamp = clock.read(line[: old.start()])
                    yield from _vllm_request(
                        where, stamp, prompt=ast.literal_eval(prompt), n_ids=_count_ids(ids), params=params, body=None
                    )
                elif (received := _RECEIVED.search(line)) is not None:
                    request_id, params = received.groups()
                    if params.startswith("None"):
                        prompts.pop(request_id, None)
                        yield Issue(where, f"not a generation request (no sampling params): {request_id}", False)
                        continue
                    if request_id not in prompts:
                        raise _Bad(
                            f"no prompt logged: request {request_id} (vLLM ≥ 0.10 logs prompts at DEBUG level: "
                            "run it with VLLM_LOGGING_LEVEL=DEBUG and --enable-log-requests)"
                        )
                    prompt, n_ids = prompts.pop(request_id)
                    body_text = bodies.pop(request_id.removeprefix("chatcmpl-"), None)
                    if body_text is None and logs_bodies and request_id.startswith("chatcmpl-"):
                        yield Issue(where, f"templated prompt used: no JSON body matches {request_id}", False)
                    stamp = clock.read(line[: received.start()])
                    yield from _vllm_request(where, stamp, prompt=prompt, n_ids=n_ids, params=params, body=body_text)
                elif "Received request" in line:
                    raise _Bad("unreadable vLLM request line: cut short, or a format this parser does not know")
            except (_Bad, SyntaxError, ValueError) as exc:
                yield Issue(where, str(exc) if isinstance(exc, _Bad) else f"unreadable vLLM request line: {exc}")


def _vllm_request(
    where: str, stamp: float | None, *, prompt: str | None, n_ids: int | None, params: str, body: str | None
) -> Iterator[Parsed]:
    if prompt is None and n_ids is None:
        raise _Bad("no prompt logged: neither a prompt nor prompt_token_ids")
    # Token ids without text (a client sent ids): a length-only request, synthesized like a trace.
    messages = None if prompt is None else [{"role": "user", "content": prompt}]
    if body is not None:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
            yield Issue(where, "templated prompt used: JSON body cut short (--max-log-len)", False)
        if isinstance(parsed, dict) and "messages" in parsed:
            messages = _messages(parsed["messages"])
    max_tokens, forced = _sampling(params)
    yield LogRequest(
        where=where,
        timestamp=stamp,
        messages=messages,
        max_tokens=max_tokens,
        prompt_tokens=n_ids,
        output_tokens=forced,
    )


# --------------------------------------------------------------------------- detection

PARSERS: dict[str, Parser] = {
    "openai-jsonl": parse_openai_jsonl,
    "sharegpt": parse_sharegpt,
    "vllm-log": parse_vllm_log,
    "azure-trace": parse_azure_trace,
    "mooncake": parse_mooncake,
}
FORMATS = tuple(PARSERS)


class FormatError(WorkloadError):
    """A source whose format cannot be told (or is not the one given)."""


def detect_format(path: Path) -> str:
    """The format of a log from its first non-blank line, read whole however long it is (one JSON
    request may be megabytes), and, for vLLM logs, its first 64 KiB."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_DETECT_BYTES)
            handle.seek(0)
            first_line = next((line for line in handle if line.strip()), b"")
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    text = head.decode("utf-8", errors="replace")
    first = first_line.decode("utf-8", errors="replace").strip()
    if first.startswith("["):
        return "sharegpt"
    if first.startswith("{"):
        try:
            record = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise FormatError(f"{path}:1: first line is not a JSON object; use --format") from None
        if "conversations" in record:
            return "sharegpt"
        if "hash_ids" in record or "input_length" in record:
            return "mooncake"
        if "messages" in record or "request" in record:
            return "openai-jsonl"
        raise FormatError(f"{path}:1: a JSON object of no known log format (keys {sorted(record)[:8]})")
    if first.split(",")[:3] == list(_AZURE_COLUMNS):
        return "azure-trace"
    if "Received request" in text or _VLLM_LINE.search(text):
        return "vllm-log"
    raise FormatError(f"{path}: cannot tell the log format; use --format ({', '.join(FORMATS)})")


def read_log(path: Path, fmt: str | None = None) -> tuple[str, Iterator[Parsed]]:
    """The format (given or detected) and the stream of parsed requests and issues of one file."""
    fmt = fmt or detect_format(path)
    if fmt not in PARSERS:
        raise FormatError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    return fmt, PARSERS[fmt](path)
