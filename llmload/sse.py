"""Server-sent events as the standard defines them: an incremental parser of a `text/event-stream` body.

The rules are WHATWG HTML §9.2.5 "Parsing an event stream" and §9.2.6 "Interpreting an event stream"
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
a line ends with CRLF, a bare LF or a bare CR, mixed at will; one UTF-8 byte order mark at the
start of the stream is dropped; a line starting with `:` is a comment; a line is a field name, a
colon, then the value with at most ONE leading space removed (a line without a colon is a field
named by the whole line, its value empty); the values of the `data` lines of one event are
joined by LF; a blank line dispatches the event, which is only dispatched when it had a `data`
line; and an event the stream's end cuts before its blank line is not dispatched.

Only `data` matters to a chat completions stream: the openai SDK reads every other field of such a
stream (`event`, `id`, `retry`) and then acts on the data alone, whatever the event's name
(openai/_streaming.py, `Stream.__stream__`), so they are read here and not kept.

This parser is the client's general path (llmload.client): the hot path cuts LF-only events
straight from the response's buffer and hands this parser everything else.
"""

from __future__ import annotations

import re

BOM = b"\xef\xbb\xbf"
_LINE_END = re.compile(rb"\r\n|\r|\n")


class EventStream:
    """Bytes in as they arrive, in pieces of any size; out, the data of each event they complete.

    `start`: its first bytes are the stream's first, where a byte order mark is dropped (False: it
    is fed from the middle of a stream, at an event boundary).
    """

    __slots__ = ("_bom", "_cr", "_data", "_line")

    def __init__(self, *, start: bool = True) -> None:
        self._bom = start  # still at the stream's start: a BOM there (even split over pieces) is dropped
        self._cr = False  # the last piece ended with CR: an LF starting the next one ends no line
        self._line = b""  # the unfinished line
        self._data: list[bytes] = []  # the `data` values of the event being read

    def feed(self, piece: bytes) -> list[bytes]:
        """The data of every event `piece` completes, in order (UTF-8 bytes, lines joined by LF;
        empty data included, as the standard dispatches it)."""
        if not piece:
            return []
        if self._cr and piece[0] == 0x0A:
            piece = piece[1:]
        self._cr = piece.endswith(b"\r")
        text = self._line + piece
        if self._bom:
            if len(text) < len(BOM) and BOM.startswith(text):
                self._line = text
                return []
            text = text.removeprefix(BOM)
            self._bom = False
        *lines, self._line = _LINE_END.split(text)
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(b"\n".join(data))
                    data.clear()
            elif line[0] != 0x3A:  # not a comment
                name, _, value = line.partition(b":")
                if name == b"data":
                    data.append(value[1:] if value[:1] == b" " else value)
        return events

    @property
    def unfinished(self) -> bytes:
        """What the stream holds of an event not yet dispatched: its `data` values so far and its
        unfinished line (not a comment), LF-joined; b"" between events. Where the stream ends, this
        event is lost (the standard does not dispatch it)."""
        line = b"" if self._line[:1] == b":" else self._line
        return b"\n".join([*self._data, line]) if self._data or line else b""
