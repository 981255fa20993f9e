"""What every request-log format shares: the stream of `LogRequest`s and `Issue`s a parser
yields, the `LogFormat` each format module declares, and the helpers the JSON formats parse with."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import numpy as np
import orjson

from llmload.errors import InputError
from llmload.models import Message

_ROLES = frozenset(get_args(Message.model_fields["role"].annotation))
DETECT_BYTES = 1 << 16
_CHUNK_CHARS = 1 << 20
_SEPARATORS = re.compile(r"[\s,]*")
_WHITESPACE = re.compile(r"\s*")


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
    label: str | None = None
    """The log's own name for the conversation (a ShareGPT `id`): the built session keeps it as its id."""
    last: bool = False
    """The conversation's last request: its session can be closed now."""
    hash_ids: np.ndarray | None = None
    """Prefix block ids (int64) of the format's `hash_block_tokens` tokens each (the last one may be
    partial): an array, as a trace's requests wait in open sessions (an agentic corpus holds 92M ids)."""
    parent: str | None = None
    """An agentic trace's subagent: the session that spawned it."""
    waits_for: tuple[str, ...] = ()
    """The subagent sessions an agent waits for before it sends this request."""
    spawns: tuple[str, ...] = ()
    """The subagent sessions an agent starts once this request's reply is back."""
    think_s: float | None = None
    """The pause before this request where the log says it outright (a subagent's first: after the reply
    that spawned it), not from the gap to an earlier request of its session."""
    model_rank: int | None = None
    """Which model of the trace this request used: 0 its main one, then in order of first use."""


@dataclass(frozen=True, slots=True)
class Issue:
    """A line that gives no request: fatal (malformed) or merely ignored (noted in the summary)."""

    where: str
    reason: str
    fatal: bool = True
    category: str | None = None
    """What the skipped-lines count calls it, where the reason does not start with that."""

    @property
    def kind(self) -> str:
        """The reason without its details, for counting skipped lines by reason."""
        return self.category or self.reason.split(":", 1)[0]


Parsed = LogRequest | Issue
Parser = Callable[[Path], Iterator[Parsed]]
Item = tuple[str, Any] | Issue
"""A decoded JSON value and where it starts (`file:line`), or the Issue that ended the read."""


class BadLine(ValueError):
    """Raised inside a parser for one unusable line; becomes an `Issue`."""


class FormatError(InputError):
    """A source whose format cannot be told (or is not the one given)."""


@dataclass(frozen=True, slots=True)
class Head:
    """What format detection read of a log, shown to every format's `sniff`."""

    first_line: str
    """The first non-blank line, whole however long it is, stripped."""
    record: dict[str, Any] | None
    """The first JSON object: that line decoded when it starts with `{`, or the first element of a log
    that is JSON arrays, when that is an object (decoded once, for all the JSON formats)."""
    text: str
    """The first 64 KiB."""


@dataclass(frozen=True, slots=True)
class LogFormat:
    """One request-log format: its `--format` name, how its head looks, and its parser."""

    name: str
    title: str
    """The format in a sentence: "an OpenAI JSONL log"."""
    sniff: Callable[[Head], bool]
    """True when a log's head is of this format."""
    parse: Parser
    fallback: bool = False
    """The sniff is loose (any request body, any vLLM-looking line): it is asked only after every
    other format declined, so that a more specific format with the same sign wins."""
    hash_block_tokens: int | None = None
    """Tokens per hash id, for a format whose requests carry prefix block ids (Mooncake 512, WEKA 64)."""


# --------------------------------------------------------------------------- shared helpers


def integer(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadLine(f"not an integer: {what} is {value!r}")
    if value < minimum:
        raise BadLine(f"out of range: {what} is {value}, below {minimum}")
    return value


def optional_integer(value: object, what: str, *, minimum: int = 0) -> int | None:
    return None if value is None else integer(value, what, minimum=minimum)


def token_count(value: object, what: str) -> int | None:
    """A logged token count, None where the log has none: gateways and tracers write 0 for a count they
    did not get (LiteLLM, Langfuse), and 0 taken for a count would replay an empty prompt or reply."""
    return optional_integer(value, what) or None


def object_field(record: dict[str, Any], key: str) -> dict[str, Any]:
    """`record[key]` as an object, {} where it is missing or null; BadLine where it is something else."""
    value = record.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadLine(f"bad record: {key} is not an object")
    return value


def milliseconds(value: object, what: str) -> float | None:
    """A duration in milliseconds (≥ 0) as seconds; None where the log has none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BadLine(f"bad {what}: {value!r} is not a number of milliseconds ≥ 0")
    return value / 1000


def log_timestamp(value: object) -> float | None:
    """Unix seconds, unix milliseconds (> 1e11) or an ISO 8601 string (naive = UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadLine(f"bad timestamp: {value!r}")
    if isinstance(value, int | float):
        return value / 1000 if value > 1e11 else float(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise BadLine(f"bad timestamp: {value!r} is not ISO 8601") from None
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    raise BadLine(f"bad timestamp: {value!r}")


_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content part types that hold text (`text`: OpenAI chat and Anthropic; `input_text`/`output_text`: the
OpenAI Responses API). Any other part (an image, audio, a file) is refused: replaying the text alone
would send a different, shorter prompt."""


_CALL_PARTS = frozenset({"tool_use", "thinking", "redacted_thinking"})
"""Anthropic content blocks that carry no prompt text of their own (sent as an OpenAI tool-call turn's
null content is: nothing); a `tool_result` block's text is the tool's output, kept."""


def _content(value: object, where: str) -> str:
    """Message content as text: a string, null (tool-call turns) or a list of text parts (a part may
    also be a bare string; Anthropic's tool_use and thinking blocks give none, a tool_result its content,
    an OpenAI refusal part its text)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _CALL_PARTS:
                continue  # a tool call or reasoning: no text, as an OpenAI tool-call turn's null content
            if kind == "tool_result":
                texts.append(_content(part.get("content"), where))
                continue
            if kind == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
                continue
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise BadLine(f"unsupported content: {where} has a {kind or part!r} part (text only)")
            texts.append(part["text"])
        return "".join(texts)
    raise BadLine(f"unsupported content: {where} is a {type(value).__name__}")


def chat_messages(value: object) -> list[dict[str, str]]:
    """OpenAI chat messages reduced to role and text content (the replay sends nothing else)."""
    if not isinstance(value, list) or not value:
        raise BadLine("no messages: messages is not a non-empty list")
    out = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadLine(f"bad message: messages[{index}] is not an object")
        role = message.get("role")
        if role not in _ROLES:
            raise BadLine(f"unsupported role: messages[{index}] has role {role!r}")
        content = message.get("content")
        if type(content) is str and len(message) == 2:
            out.append(message)  # already {role, content}: keep the decoded dict
        else:
            out.append({"role": role, "content": _content(content, f"messages[{index}]")})
    return out


def request_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """A request body's messages, with an Anthropic Messages API body's top-level `system` (a string or a
    list of text blocks) put first as a system message, as the model sees it."""
    messages = chat_messages(body.get("messages"))
    system = body.get("system")
    if not system:
        return messages
    return [{"role": "system", "content": _content(system, "system")}, *messages]


def responses_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """An OpenAI Responses API request's prompt as chat messages: `instructions` as a system message, then
    `input`, a string (one user message) or a list of message items (`{"role", "content"}`, text parts
    `input_text`); other items (function calls, their outputs, reasoning) are refused by name."""
    value = body.get("input")
    items = [{"role": "user", "content": value}] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise BadLine("no messages: input is neither text nor a list")
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type", "message") != "message":
            raise BadLine(f"unsupported input: input[{index}] is a {item['type']!r} item (messages only)")
    instructions = body.get("instructions")
    system = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    return system + chat_messages(items)


def request_max_tokens(body: dict[str, Any]) -> int | None:
    """A request's output limit: `max_completion_tokens`, else `max_tokens`, else the Responses API's
    `max_output_tokens` (None: no limit given)."""
    limit = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens")))
    return optional_integer(limit, "max_tokens", minimum=1)


def _reply_text(response: dict[str, Any]) -> str | None:
    """The reply of a chat completion (`choices[0].message.content`, text or text parts), a text
    completion (`choices[0].text`), an Anthropic message (the text blocks of `content`) or a Responses API
    response (the `output_text` parts of its `output` messages)."""
    output = response.get("output")
    if isinstance(output, list) and response.get("object") == "response":  # the Responses API
        texts = [_reply_text({"type": "message", "content": item.get("content")})
                 for item in output if isinstance(item, dict) and item.get("type") == "message"]  # fmt: skip
        return "".join(t for t in texts if t is not None)
    choices = response.get("choices")
    if isinstance(choices, list):
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else choice.get("text")
    else:
        content = response.get("content") if response.get("type") == "message" else None
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in _TEXT_PARTS]
        return "".join(t for t in texts if isinstance(t, str))
    return content if isinstance(content, str) else None


def _streamed(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed response logged as its chunks (`chat.completion.chunk`s, or text completion chunks) as
    one completion: the deltas' text joined, the last `usage` given (the final chunk's, with
    `stream_options.include_usage`), the first chunk's `created`."""
    texts: list[str] = []
    usage = None
    for chunk in chunks:
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            texts.append(text)
        usage = chunk.get("usage") or usage
    created = chunks[0].get("created") if chunks else None
    reply = {"role": "assistant", "content": "".join(texts)}
    return {"choices": [{"message": reply}], "usage": usage, "created": created}


def chat_completion(response: object, what: str) -> tuple[str | None, int | None, int | None]:
    """(reply text, prompt tokens, output tokens) of an OpenAI `chat.completion` (or `text_completion`)
    object's choices and `usage` {prompt_tokens, completion_tokens}, or an Anthropic message's content and
    `usage` {input_tokens, output_tokens}, or a streamed response logged as its list of chunks; None for
    each one it lacks (and all three for a null response); BadLine where it is none of these."""
    if response is None:
        return None, None, None
    if isinstance(response, list) and all(isinstance(chunk, dict) for chunk in response):
        response = _streamed(response)
    if not isinstance(response, dict):
        raise BadLine(f"bad record: {what} is not an object")
    usage = object_field(response, "usage")
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    output = usage.get("completion_tokens", usage.get("output_tokens"))
    return (
        _reply_text(response),
        optional_integer(prompt, f"{what}.usage.prompt_tokens"),
        optional_integer(output, f"{what}.usage.completion_tokens"),
    )


def conversation(where: str, messages: list[dict[str, str]], label: str | None = None) -> Iterator[LogRequest]:
    """A whole logged conversation as the requests that made it: one at each reply, its messages the
    history before it, and one for a last user message left unanswered. The conversation is one
    explicit session (named `label` where the log names it), closed at its last request.

    [user Hi, assistant Hello!, user Bye, assistant Bye!] gives two requests: [user Hi] (reply
    "Hello!") and [user Hi, assistant Hello!, user Bye] (reply "Bye!"). A reply directly after a reply
    joins the next request's messages; assistant messages before the first user message are history.
    BadLine for a conversation with no user message (nothing to replay)."""
    requests: list[LogRequest] = []
    asked = False
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and asked and messages[index - 1]["role"] != "assistant":
            requests.append(
                LogRequest(where, messages=messages[:index], reply=message["content"], session=where, label=label)
            )
        asked = asked or message["role"] == "user"
    if asked and messages[-1]["role"] != "assistant":
        requests.append(LogRequest(where, messages=messages, session=where, label=label))  # unanswered last
    if not requests:
        raise BadLine("no user message: nothing to replay")
    requests[-1].last = True
    yield from requests


# --------------------------------------------------------------------------- reading JSON


def json_lines(path: Path) -> Iterator[Item]:
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


def json_array_items(path: Path) -> Iterator[Item]:
    """(where, element) for each element of a file of JSON arrays, without loading an array whole.

    The file is one array (a ShareGPT dump of hundreds of MB, a UI's JSON export) or several one after
    another (JSONL whose every line is an array): elements are decoded one at a time from a sliding
    buffer, each array's after the last one's. Anything else after an array's end is an Issue, "data
    after the end of the JSON array", at its line. A malformed element ends the read (there is no
    resynchronizing), as an Issue at its line. Commas between elements may repeat or trail (some
    exporters write `{...},\\n]`)."""
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as handle:
        buffer, position, line, eof = "", 0, 1, False

        def refill() -> None:
            nonlocal buffer, position, eof
            chunk = handle.read(_CHUNK_CHARS)
            eof = not chunk
            buffer, position = buffer[position:] + chunk, 0

        def skip(pattern: re.Pattern[str]) -> bool:
            """Past `pattern`'s characters, counting lines; False at the end of the file."""
            nonlocal position, line
            while True:
                end = pattern.match(buffer, position).end()  # type: ignore[union-attr]  # `*`: always matches
                line += buffer.count("\n", position, end)
                position = end
                if position < len(buffer):
                    return True
                if eof:
                    return False
                refill()

        arrays, inside = 0, False
        while skip(_SEPARATORS if inside else _WHITESPACE):
            where = f"{path}:{line}"
            if not inside:
                if not buffer.startswith("[", position):
                    yield Issue(
                        where, "data after the end of the JSON array" if arrays else "not valid JSON: not a JSON array"
                    )
                    return
                arrays, inside, position = arrays + 1, True, position + 1
                continue
            if buffer.startswith("]", position):
                inside, position = False, position + 1
                continue
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
        if inside:
            yield Issue(f"{path}:{line}", "not valid JSON: the file ends inside a JSON array")


_ENVELOPE_KEYS = frozenset({"meta", "error", "object", "has_more", "first_id", "last_id", "pagination"})
_DATA_ARRAY = re.compile(r'"data"\s*:\s*\[')


def envelope(value: object) -> list[Any] | None:
    """The records of an API response page, `{"data": [...], ...}` with nothing but paging beside it
    (Langfuse's `GET /api/public/observations` `{data, meta}`, Helicone's `/v1/request/query`
    `{data, error}`, an OpenAI list `{object, data, has_more}`); None for any other value."""
    if isinstance(value, dict) and isinstance(value.get("data"), list) and set(value) - {"data"} <= _ENVELOPE_KEYS:
        return value["data"]
    return None


def _element_lines(text: str, start: int, end: int, line: int, count: int) -> list[int] | None:
    """The line of each element of the `data` array of the envelope text[start:end] (which starts at
    `line`), None where they cannot be told apart."""
    decoder = json.JSONDecoder()
    for match in _DATA_ARRAY.finditer(text, start, end):
        position, lines = match.end(), []
        try:
            while True:
                position = _SEPARATORS.match(text, position).end()  # type: ignore[union-attr]  # `*`: always matches
                if position >= end or text.startswith("]", position):
                    break
                lines.append(line + text.count("\n", start, position))
                position = decoder.raw_decode(text, position)[1]
        except json.JSONDecodeError:
            continue
        if len(lines) == count:
            return lines
    return None


def json_values(path: Path) -> Iterator[Item]:
    """(where, value) for each JSON value of a file of JSON values one after another, each over many
    lines (the OpenTelemetry Python SDK's `ConsoleSpanExporter` writes spans so, indented; a saved API
    response is one indented object), decoded one at a time from a sliding buffer. An API response page
    (`envelope`) gives its records, each at its own line. A malformed value is an Issue at its line, and
    the read goes on from the next line that opens an object (every value after it is still read)."""
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as handle:
        buffer, position, line, eof = "", 0, 1, False
        while True:
            end = _WHITESPACE.match(buffer, position).end()  # type: ignore[union-attr]  # `*`: always matches
            line += buffer.count("\n", position, end)
            position = end
            if position >= len(buffer):
                if eof:
                    return
                chunk = handle.read(_CHUNK_CHARS)
                eof = not chunk
                buffer, position = buffer[position:] + chunk, 0
                continue
            try:
                value, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError as exc:
                if not eof:  # a value cut by the buffer's end: read on and retry
                    chunk = handle.read(_CHUNK_CHARS)
                    eof = not chunk
                    buffer, position = buffer[position:] + chunk, 0
                    continue
                yield Issue(f"{path}:{line}", f"not valid JSON: {exc.msg}")
                restart = buffer.find("\n{", position)  # read on from the next object that opens a line
                if restart < 0:
                    return
                line += buffer.count("\n", position, restart + 1)
                position = restart + 1
                continue
            records = envelope(value)
            if records is None:
                yield f"{path}:{line}", value
            else:
                lines = _element_lines(buffer, position, end, line, len(records)) or [line] * len(records)
                yield from ((f"{path}:{n}", record) for n, record in zip(lines, records, strict=True))
            line += buffer.count("\n", position, end)
            position = end


def _unwrapped(items: Iterator[Item]) -> Iterator[Item]:
    """Values as they are, and an API response page (`envelope`) as its records, each where the page is."""
    for item in items:
        records = None if isinstance(item, Issue) else envelope(item[1])
        if isinstance(item, Issue) or records is None:
            yield item
        else:
            yield from ((item[0], record) for record in records)


def _layout(path: Path) -> str:
    """How a file of JSON holds its values: "array" (JSON arrays), "lines" (JSONL) or "values" (JSON
    values over many lines each, one after another: the first line does not end its value)."""
    with path.open("rb") as handle:
        head = handle.read(DETECT_BYTES).lstrip()
        if head.startswith(b"["):
            return "array"
        handle.seek(0)
        first = next((line.strip() for line in handle if line.strip()), b"")
    return "values" if first.startswith(b"{") and not first.endswith(b"}") else "lines"


def json_records(path: Path) -> Iterator[Item]:
    """The JSON values of a log that is JSONL, JSON arrays of the same values (as UI exports write
    them), or indented JSON values one after another, by its first line: `json_array_items`,
    `json_lines` or `json_values`; an API response page (`envelope`) gives its records."""
    layout = _layout(path)
    if layout == "array":
        return json_array_items(path)
    return json_values(path) if layout == "values" else _unwrapped(json_lines(path))


def csv_header(head: Head) -> frozenset[str]:
    """The column names of a log whose first line is a CSV header (empty for a JSON log)."""
    if head.first_line[:1] in ("{", "["):
        return frozenset()
    return frozenset(name.strip().strip('"') for name in next(csv.reader([head.first_line]), []))


def csv_records(path: Path) -> Iterator[Item]:
    """(where, row) for each row of a CSV export with a header, the row a dict of the header's names;
    an empty cell is None (the exporters write null so). Values stay text: each format reads its own
    columns (JSON text, numbers). A row with more cells than the header has is an Issue."""
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return
        names = [name.strip() for name in header]
        line = reader.line_num + 1
        for row in reader:
            where, line = f"{path}:{line}", reader.line_num + 1
            if not any(cell.strip() for cell in row):
                continue
            if len(row) > len(names):
                yield Issue(where, f"bad row: {len(row)} cells under a header of {len(names)}")
                continue
            yield where, {name: (cell if cell != "" else None) for name, cell in zip(names, row, strict=False)}


def table_records(path: Path) -> Iterator[Item]:
    """The records of a log exported as JSON (`json_records`) or as CSV with a header (`csv_records`),
    by its first non-blank character."""
    with path.open("rb") as handle:
        first = handle.read(DETECT_BYTES).lstrip()[:1]
    return json_records(path) if first in (b"{", b"[") else csv_records(path)


def parse_records(
    items: Iterator[Item], parse: Callable[[str, Any], Iterator[Parsed]], *, shape: type = dict
) -> Iterator[Parsed]:
    """Run a per-record parser over decoded JSON values, each a JSON object (`shape` dict) or array
    (`shape` list), turning its `BadLine` into Issues."""
    for item in items:
        if isinstance(item, Issue):
            yield item
            continue
        where, value = item
        try:
            if not isinstance(value, shape):
                raise BadLine(f"not a JSON {'object' if shape is dict else 'array'}: a {type(value).__name__}")
            yield from parse(where, value)
        except BadLine as exc:
            yield Issue(where, str(exc))
