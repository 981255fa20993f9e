"""Fault injection: which requests fail, and what each kind of failure looks like on the wire.

The kinds mirror what a load tester meets in front of vLLM (ARCHITECTURE.md, failure
categories). A non-streaming request cannot carry an in-stream error, so stream faults answer it
the way vLLM answers a non-streaming request in the same situation: `stream_busy` with the HTTP
503 at once, `stream_engine_dead` with an HTTP 500 when the engine dies mid-generation, `cut`
by dropping the connection then, `stall` by answering `stall_s` late.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from llmload.sim import wire
from llmload.sim.config import FaultKind, FaultSpec

# Tokens a stream delivers before a mid-stream fault strikes ("a few"), capped below the length.
TOKENS_BEFORE_FAULT = 3


@dataclass(frozen=True, slots=True)
class Strike:
    """What a drawn fault does to one request, decided once (`Fault.strike`) so every way of serving
    it (the paced stream, the paced whole response, the engine) reads the same decisions."""

    refusal: wire.VllmError | None = None
    """Answered at once with this HTTP error; nothing is generated."""
    page: bool = False
    """Answered at once with HTTP 200 and an HTML page."""
    at_arrival: bool = False
    """Strikes before generation starts: a stream's error leaves at once, not after the first token's time."""
    end_at: int = -1
    """The output token the response ends at (-1: none): in a stream `tail` replaces it."""
    error: wire.VllmError | None = None
    """What ends it at `end_at`: an SSE event in a stream, the HTTP error of a whole response."""
    event: bytes = b""
    """Replaces token `end_at` in a stream when there is no `error`, and the stream closes."""
    cut: bool = False
    """The connection is dropped at `end_at`."""
    pause_at: int = -1
    """The output token delivered `pause_s` late (-1: none); the response then goes on."""
    pause_s: float = 0.0
    finish: bool = True
    """The last token carries its finish_reason (and the usage follows)."""
    done: bool = True
    """`data: [DONE]` closes the stream."""

    @property
    def completes(self) -> bool:
        """Delivers all its tokens and ends as vLLM does (a pause only delays them)."""
        return self.end_at < 0 and self.finish and self.done

    @property
    def tail(self) -> bytes:
        """What replaces token `end_at` in a stream: the error's event and [DONE], or the fault's event."""
        return self.error.sse_event() + wire.DONE if self.error is not None else self.event

    def ending(self, usage: bytes) -> bytes:
        """What follows the last token: the usage (when the last token finished) and [DONE], as asked."""
        return (usage if self.finish else b"") + (wire.DONE if self.done else b"")


NO_STRIKE = Strike()


@dataclass(frozen=True, slots=True)
class Fault:
    """One row of the fault table: where the fault acts (`at_arrival`) and what it does (`action`):
    `error` answers with `error` (an HTTP error at arrival, an SSE event mid-stream or `in_stream`);
    `cut` drops the connection; `stall` delays a token by the configured stall; `event` replaces a
    token with `event` and the stream closes; `end` ends the stream its own way (`finish`, `done`);
    `page` is HTTP 200 with an HTML page. `strike` turns the row into what one request meets."""

    kind: FaultKind
    action: Literal["error", "cut", "stall", "event", "end", "page"]
    error: wire.VllmError | None = None
    in_stream: bool = False
    """A streaming request gets HTTP 200 and the error as an SSE event, then [DONE]."""
    at_arrival: bool = True
    """Strikes before generation starts; otherwise after TOKENS_BEFORE_FAULT tokens."""
    event: bytes = b""
    finish: bool = True
    done: bool = True

    def strike(self, *, stream: bool, output_tokens: int, stall_s: float) -> Strike:
        """What this fault does to a request of `output_tokens` tokens. A mid-stream fault strikes
        after a few tokens, never past the last, so it always shows; a stream's ending (`end`,
        `event`) means nothing to a whole response, which is served as if no fault was drawn."""
        index = 0 if self.at_arrival else min(TOKENS_BEFORE_FAULT, output_tokens - 1)
        if self.action == "page":
            return Strike(page=True)
        if self.action == "error" and self.at_arrival and not (self.in_stream and stream):
            return Strike(refusal=self.error)
        if self.action in ("end", "event") and not stream:
            return NO_STRIKE
        if self.action == "stall":
            return Strike(pause_at=index, pause_s=stall_s)
        if self.action == "end":
            return Strike(finish=self.finish, done=self.done)
        return Strike(
            at_arrival=self.at_arrival, end_at=index, error=self.error, event=self.event, cut=self.action == "cut"
        )


FAULTS: dict[str, Fault] = {
    f.kind: f
    for f in (
        Fault("http_429", "error", wire.RATE_LIMITED),
        Fault("http_503", "error", wire.ENGINE_BUSY),
        Fault("http_500", "error", wire.INTERNAL_ERROR),
        Fault("engine_dead", "error", wire.ENGINE_DEAD),
        Fault("oom", "error", wire.CUDA_OOM),
        # vLLM admits a burst of streams before its queue check fails inside the generator.
        Fault("stream_busy", "error", wire.ENGINE_BUSY, in_stream=True),
        Fault("stream_engine_dead", "error", wire.ENGINE_DEAD, in_stream=True, at_arrival=False),
        Fault("cut", "cut", at_arrival=False),
        Fault("stall", "stall", at_arrival=False),
        # how other servers end a stream: transformers serve sends no [DONE]; a lost end has neither
        Fault("no_done", "end", at_arrival=False, done=False),
        Fault("no_end", "end", at_arrival=False, finish=False, done=False),
        # transformers serve's in-band error: a bare string, then the stream closes
        Fault("error_chunk", "event", at_arrival=False, event=wire.STRING_ERROR_EVENT),
        Fault("bad_json", "event", at_arrival=False, event=b'data: {"choices": [{"delta": {"content": "x"\n\n'),
        Fault("html", "page"),
    )
}


class FaultPicker:
    """One uniform draw per request, in arrival order, picks at most one fault: reproducible by seed."""

    def __init__(self, specs: Sequence[FaultSpec], seed: int) -> None:
        self._rng = random.Random(seed)
        edges = itertools.accumulate(s.probability for s in specs)
        self._table = [(edge, FAULTS[s.kind]) for edge, s in zip(edges, specs, strict=True)]

    def draw(self) -> Fault | None:
        if not self._table:
            return None
        u = self._rng.random()
        for edge, fault in self._table:
            if u < edge:
                return fault
        return None
