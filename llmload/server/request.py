"""The chat request a server of a given kind is sent: the workload's messages and length, in the
fields that server understands.

A forced output length is asked for the kind's own way (kinds.yaml `force_length`), and only where
the kind has one: OpenAI, transformers serve and Triton refuse a field they do not know, and TGI or
Ollama drop it silently, so a "fixed" length would not be fixed and nobody would be told. A field
llmload added that a server refuses anyway (HTTP 400/422 naming it) is dropped for the rest of the
run: `refused` finds it in the error, and the caller retries the request once without it. The
user's own fields (`--extra-body`) and the workload's are never dropped.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmload.errors import InputError, json_object
from llmload.models import Message, ServerIdentity
from llmload.server.kinds import ServerKind, kind

log = logging.getLogger("llmload")

STREAM_OPTIONS = "stream_options"
# the fields each way of forcing a length adds to max_tokens = N
_FORCING: dict[str, tuple[str, ...]] = {
    "min_tokens": ("min_tokens", "ignore_eos"),
    "min_new_tokens": ("min_new_tokens", "ignore_eos"),
    "ignore_eos": ("ignore_eos",),
    "generation_config": ("generation_config",),
    "none": (),
}
ADDED_FIELDS = frozenset({STREAM_OPTIONS, *(name for names in _FORCING.values() for name in names)})
REFUSAL_STATUSES = frozenset({400, 422})


def _forcing_value(name: str, tokens: int) -> Any:
    if name == "ignore_eos":
        return True
    if name == "generation_config":  # transformers serve reads a JSON string; eos -1: never stops early
        return orjson.dumps({"min_new_tokens": tokens, "eos_token_id": -1}).decode()
    return tokens


def parse_extra_body(text: str | None) -> dict[str, Any]:
    """`--extra-body '{"top_k": 20}'`: a JSON object of the user's own fields; InputError otherwise."""
    if not text:
        return {}
    value = json_object(text, "--extra-body")
    reserved = sorted(set(value) & {"model", "messages", "stream"})
    if reserved:
        raise InputError(f"--extra-body may not set {', '.join(reserved)}: llmload sets them for every request")
    return value


@dataclass
class RequestShape:
    """How this process's requests are written for one server kind; `dropped` grows when the server
    refuses a field llmload added (shared by every user of the process)."""

    kind: ServerKind
    extra: dict[str, Any] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)

    @property
    def forcing(self) -> tuple[str, ...]:
        """The fields that force a length on this kind, none of them dropped."""
        return tuple(name for name in _FORCING[self.kind.force_length] if name not in self.dropped)

    @property
    def forces_length(self) -> bool:
        """A requested length is exact: the kind has a way, and the server took every field of it."""
        wanted = _FORCING[self.kind.force_length]
        return bool(wanted) and not (set(wanted) & self.dropped)

    def body(
        self, model: str, messages: list[Message] | list[dict[str, str]], *, max_tokens: int | None,
        output_tokens: int | None,
    ) -> bytes:  # fmt: skip
        """The streaming request: usage asked for, a workload's exact length forced where the kind can."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [m.model_dump() if isinstance(m, Message) else m for m in messages],
            "stream": True,
        }
        if STREAM_OPTIONS not in self.dropped:
            body[STREAM_OPTIONS] = {"include_usage": True}
        if output_tokens is not None:
            body["max_tokens"] = output_tokens
            body.update({name: _forcing_value(name, output_tokens) for name in self.forcing})
        elif max_tokens is not None:
            body["max_tokens"] = max_tokens
        body.update(self.extra)
        return orjson.dumps(body)

    def refused(self, status: int | None, error_body: bytes | str, sent: bytes) -> list[str]:
        """The fields llmload added to the request `sent` that an HTTP 400/422 names (never the user's or
        the workload's): dropped from now on, with a warning the first time (another request may have
        dropped them meanwhile). Empty: the refusal is about something else, and nothing is retried."""
        if status not in REFUSAL_STATUSES:
            return []
        text = error_body if isinstance(error_body, str) else error_body.decode("utf-8", "replace")
        carried = set(orjson.loads(sent)) & ADDED_FIELDS - set(self.extra)
        named = [name for name in sorted(carried) if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text)]
        new = [name for name in named if name not in self.dropped]
        if new:
            self.dropped.update(new)
            log.warning(
                "llmload: %s refused %s (HTTP %s: %s): sent without it for the rest of the run%s",
                self.kind.label, ", ".join(new), status, text.strip()[:200],
                "; output lengths are no longer forced" if set(new) & set(_FORCING[self.kind.force_length]) else "",
            )  # fmt: skip
        return named


def chat_body(
    model: str, messages: list[Message] | list[dict[str, str]], *, max_tokens: int | None, output_tokens: int | None
) -> bytes:
    """The request vLLM (and the embedded target) is sent: for code that only ever talks to vLLM
    (calibration, the vLLM tests and benchmarks)."""
    return RequestShape(kind("vllm")).body(model, messages, max_tokens=max_tokens, output_tokens=output_tokens)


def server_line(server: ServerIdentity, shape: RequestShape, *, lengths_asked: bool) -> str:
    """The console's line on the target: which server, how it was told, and whether lengths are forced
    (`lengths_asked`: the workload asks for exact output lengths; else its turns carry max_tokens only)."""
    told = f"target: {server.name} (told by {server.evidence})"
    if not lengths_asked:
        return f"{told}; the workload asks for no exact output lengths: each request carries its max_tokens"
    if shape.kind.forces_length:
        return f"{told}; exact output lengths asked for with {' + '.join(shape.forcing)}"
    return f"{told}; output lengths not forced: {shape.kind.force_note}"
