"""`sharegpt`: ShareGPT conversations: a JSON array (streamed), JSON arrays one after another (JSONL
whose every line is an array of conversations), or JSONL of conversations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmload.workload.formats.common import (
    BadLine,
    Head,
    LogFormat,
    LogRequest,
    Parsed,
    conversation,
    json_records,
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


def _sharegpt_conversation(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """One ShareGPT conversation: a request at each reply, its messages the history before it
    (`common.conversation`), the conversation's `id` kept as its session's.

    Example::

        {"id": "c1", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                                       {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Bye!"}]}

    gives two requests: [user Hi] (reply "Hello!") and [user Hi, assistant Hello!, user Bye]
    (reply "Bye!"). ShareGPT ids are not always unique; the record's place names its session.
    """
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise BadLine("bad conversation: conversations is not a non-empty list")
    messages: list[dict[str, str]] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise BadLine(f"bad conversation: conversations[{index}] is not a {{from, value}} object with text")
        role = _SHAREGPT_ROLES.get(str(turn.get("from")))
        if role is None:
            raise BadLine(f"unsupported speaker: conversations[{index}] is from {turn.get('from')!r}")
        messages.append({"role": role, "content": turn["value"]})
    label = str(record["id"]) if record.get("id") not in (None, "") else None
    return conversation(where, messages, label)


def parse_sharegpt(path: Path) -> Iterator[Parsed]:
    """ShareGPT conversations: JSON arrays (streamed element by element, `common.json_array_items`) or JSONL."""
    return parse_records(json_records(path), _sharegpt_conversation)


def _sniff(head: Head) -> bool:
    """A JSON array whose first element holds `conversations` (or is no object at all: it is read and
    refused element by element), or a first JSON object holding `conversations`."""
    if head.first_line.startswith("["):
        return head.record is None or "conversations" in head.record
    return head.record is not None and "conversations" in head.record


FORMAT = LogFormat(name="sharegpt", title="a ShareGPT log", sniff=_sniff, parse=parse_sharegpt)
