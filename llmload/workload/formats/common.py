"""What every request-log format shares: the stream of `LogRequest`s and `Issue`s a parser
yields, the `LogFormat` each format module declares, and the helpers the JSON formats parse with."""

from __future__ import annotations

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


def request_max_tokens(body: dict[str, Any]) -> int | None:
    """A chat request's output limit: `max_completion_tokens`, else `max_tokens` (None: no limit given)."""
    return optional_integer(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens", minimum=1)


def chat_completion(response: object, what: str) -> tuple[str | None, int | None, int | None]:
    """(reply text, usage.prompt_tokens, usage.completion_tokens) of an OpenAI `chat.completion` object,
    None for each one it lacks (and all three for a null response); BadLine where it is not an object."""
    if response is None:
        return None, None, None
    if not isinstance(response, dict):
        raise BadLine(f"bad record: {what} is not an object")
    usage = object_field(response, "usage")
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    reply = message.get("content") if isinstance(message, dict) else None
    return (
        reply if isinstance(reply, str) else None,
        optional_integer(usage.get("prompt_tokens"), f"{what}.usage.prompt_tokens"),
        optional_integer(usage.get("completion_tokens"), f"{what}.usage.completion_tokens"),
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


def _is_array_file(path: Path) -> bool:
    """The file's first non-blank character opens a JSON array."""
    with path.open("rb") as handle:
        return handle.read(DETECT_BYTES).lstrip().startswith(b"[")


def json_records(path: Path) -> Iterator[Item]:
    """The JSON values of a log that is JSONL or JSON arrays of the same values (as UI exports write
    them), by its first character: `json_array_items` or `json_lines`."""
    return json_array_items(path) if _is_array_file(path) else json_lines(path)


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
