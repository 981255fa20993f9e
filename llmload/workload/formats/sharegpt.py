"""`sharegpt`: ShareGPT conversations, a JSON array (streamed) or JSONL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmload.workload.formats.common import (
    DETECT_BYTES,
    BadLine,
    Head,
    Issue,
    LogFormat,
    LogRequest,
    Parsed,
    json_lines,
    parse_records,
)

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
_CHUNK_CHARS = 1 << 20
_SEPARATORS = re.compile(r"[\s,]*")


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
        raise BadLine("bad conversation: conversations is not a non-empty list")
    messages: list[dict[str, str]] = []
    requests: list[LogRequest] = []
    session = where  # ShareGPT ids are not always unique; the record's place is
    label = str(record["id"]) if record.get("id") not in (None, "") else None
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise BadLine(f"bad conversation: conversations[{index}] is not a {{from, value}} object with text")
        role = _SHAREGPT_ROLES.get(str(turn.get("from")))
        if role is None:
            raise BadLine(f"unsupported speaker: conversations[{index}] is from {turn.get('from')!r}")
        asks = role == "assistant" and any(m["role"] == "user" for m in messages)
        if asks and messages[-1]["role"] != "assistant":
            requests.append(
                LogRequest(where, messages=list(messages), reply=turn["value"], session=session, label=label)
            )
        messages.append({"role": role, "content": turn["value"]})
    if messages[-1]["role"] != "assistant" and any(m["role"] == "user" for m in messages):
        requests.append(LogRequest(where, messages=messages, session=session, label=label))  # unanswered last
    if not requests:
        raise BadLine("no human message: nothing to replay")
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
        array = handle.read(DETECT_BYTES).lstrip().startswith(b"[")
    return parse_records(_json_array_items(path) if array else json_lines(path), _sharegpt_conversation)


def _sniff(head: Head) -> bool:
    """A JSON array, or a first JSON object holding `conversations`."""
    return head.first_line.startswith("[") or (head.record is not None and "conversations" in head.record)


FORMAT = LogFormat(name="sharegpt", title="a ShareGPT log", sniff=_sniff, parse=parse_sharegpt)
