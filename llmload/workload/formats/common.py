"""What every request-log format shares: the stream of `LogRequest`s and `Issue`s a parser
yields, the `LogFormat` each format module declares, and the helpers the JSON formats parse with."""

from __future__ import annotations

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
    """That line decoded, when it starts with `{` (decoded once, for all the JSON formats)."""
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


def json_lines(path: Path) -> Iterator[tuple[str, Any] | Issue]:
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


def parse_records(
    items: Iterator[tuple[str, Any] | Issue], parse: Callable[[str, dict[str, Any]], Iterator[LogRequest]]
) -> Iterator[Parsed]:
    """Run a per-record parser over decoded JSON values, turning its `BadLine` into Issues."""
    for item in items:
        if isinstance(item, Issue):
            yield item
            continue
        where, value = item
        try:
            if not isinstance(value, dict):
                raise BadLine(f"not a JSON object: a {type(value).__name__}")
            yield from parse(where, value)
        except BadLine as exc:
            yield Issue(where, str(exc))
