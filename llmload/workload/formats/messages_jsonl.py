"""`messages-jsonl`: JSONL whose every line is one conversation, a JSON array of OpenAI chat messages,
as eval tools and chat exporters write them, or one JSON array of such conversations (a `.json` file).
No times, no token counts: the text only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from llmload.workload.formats.common import (
    DETECT_BYTES,
    Head,
    LogFormat,
    LogRequest,
    Parsed,
    chat_messages,
    conversation,
    json_array_items,
    json_lines,
    parse_records,
)


def _messages_line(where: str, messages: list[Any]) -> Iterator[LogRequest]:
    """One line, one conversation: a request at each assistant reply and one for an unanswered last
    user message (`common.conversation`).

    Example::

        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help you?"},
         {"role": "user", "content": "Write me a poem"}]

    gives two requests: [user Hello] (reply "Hi! How can I help you?") and the whole line, unanswered.
    """
    return conversation(where, chat_messages(messages))


_ARRAY_OF_CONVERSATIONS = re.compile(r'\s*\[\s*\[\s*\{\s*"role"\s*:')
"""A JSON file that is one array of conversations, each an array of messages: `[[{"role": ...`."""


def parse_messages_jsonl(path: Path) -> Iterator[Parsed]:
    """JSONL of message arrays, one conversation a line, or one JSON array of such arrays (streamed
    element by element); a line (or element) that is not an array is a bad line."""
    with path.open("rb") as handle:
        head = handle.read(DETECT_BYTES).decode("utf-8", errors="replace")
    nested = _ARRAY_OF_CONVERSATIONS.match(head) is not None
    return parse_records(json_array_items(path) if nested else json_lines(path), _messages_line, shape=list)


def _sniff(head: Head) -> bool:
    """A first line that is a whole JSON array whose first element is a chat message (has a `role`), or a
    file that opens an array of such arrays."""
    if _ARRAY_OF_CONVERSATIONS.match(head.text):
        return True
    if not (head.first_line.startswith("[") and head.first_line.endswith("]")):
        return False
    try:
        line = orjson.loads(head.first_line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(line, list) and bool(line) and isinstance(line[0], dict) and "role" in line[0]


FORMAT = LogFormat(
    name="messages-jsonl", title="a JSONL log of message arrays", sniff=_sniff, parse=parse_messages_jsonl
)
