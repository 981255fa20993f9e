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
class Fault:
    kind: FaultKind
    action: Literal["error", "cut", "stall", "event", "end", "page"]
    """`event`: `event` replaces a token and the stream closes; `end`: the stream ends its own way
    (`finish`, `done`); `page`: HTTP 200 with an HTML page."""
    error: wire.VllmError | None = None
    in_stream: bool = False
    """A streaming request gets HTTP 200 and the error as an SSE event, then [DONE]."""
    at_arrival: bool = True
    """Strikes before generation starts; otherwise after TOKENS_BEFORE_FAULT tokens."""
    event: bytes = b""
    finish: bool = True
    """`end`: the last token carries its finish_reason (and the usage follows)."""
    done: bool = True
    """`end`: `data: [DONE]` closes the stream."""

    def ending(self, usage: bytes) -> bytes:
        """What follows the last token: the usage (when the last token finished) and [DONE], as asked."""
        if self.action != "end":
            return usage + wire.DONE
        return (usage if self.finish else b"") + (wire.DONE if self.done else b"")

    def strike_index(self, output_tokens: int) -> int:
        """The token the fault replaces (or delays): never past the last, so it always shows."""
        return 0 if self.at_arrival else min(TOKENS_BEFORE_FAULT, output_tokens - 1)


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
