"""The server kinds of kinds.yaml as typed rows: what each accepts, streams and exports.

One file holds the facts (kinds.yaml), so a new server is one entry there, and every part of
llmload that depends on the server (the request's fields, the stream's end, the metrics read,
the commands that need vLLM) asks its row here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, RootModel

from llmload.models import Strict
from llmload.yamlfile import load_yaml_model

KINDS_FILE = Path(__file__).with_name("kinds.yaml")
GENERIC = "generic"

ForceLength = Literal["min_tokens", "min_new_tokens", "ignore_eos", "generation_config", "none"]
MetricField = Literal[
    "kv_cache_usage",
    "running",
    "waiting",
    "preemptions_total",
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "spec_drafts_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
]
METRIC_FIELDS: tuple[str, ...] = MetricField.__args__  # type: ignore[attr-defined]
PositionField = Literal["spec_accepted_by_position"]
FieldName = TypeVar("FieldName", bound=str)
# exported only in some configurations (vLLM's spec_decode counters: with --speculative-config), so absent
# from a server's /metrics they mean "not in use", not "not exported"
CONDITIONAL_FIELDS = frozenset({"spec_drafts_total", "spec_draft_tokens_total", "spec_accepted_tokens_total"})


class Detect(Strict):
    """How a kind is told from the others by requests that change nothing (kinds.yaml's header)."""

    hosts: list[str] = Field(default_factory=list)
    owned_by: str | None = None
    server_header: str | None = None
    probe: str | None = None
    marker: list[str] = Field(default_factory=list)
    version_key: str | None = None
    openapi_paths: list[str] = Field(default_factory=list)


class ServerKind(Strict):
    """One kind of server, as kinds.yaml describes it."""

    name: str = Field(default="", description="its key in kinds.yaml (filled in on loading)")
    label: str
    read_from: str = Field(description="the source (and version) these facts were read from")
    detect: Detect = Detect()
    force_length: ForceLength
    force_note: str | None = Field(default=None, description="why a length is not forced, when it is not")
    unknown_fields: str
    sends_done: bool = Field(description="ends a stream with `data: [DONE]`")
    usage: str = Field(description="where the stream's usage comes")
    health_path: str = "/health"
    metrics_path: str | None = None
    metrics_note: str | None = None
    metrics: dict[MetricField, list[str]] = Field(default_factory=dict)
    by_position: dict[PositionField, list[str]] = Field(
        default_factory=dict, description="counters read as a vector by their `position` label, names as `metrics`"
    )
    metrics_of_every_kind: bool = Field(default=False, description="read any name of any kind (a generic server)")
    tokenize: str | None = None
    calibrates: bool = False
    cache_reset: str | None = Field(default=None, description="the path a POST to which empties its prefix cache")
    cache_reset_note: str | None = Field(default=None, description="when the server offers it")

    @property
    def forces_length(self) -> bool:
        return self.force_length != "none"

    def not_exported(self) -> list[str]:
        """The server.jsonl fields this kind has no metric for."""
        if self.metrics_of_every_kind:
            return []
        return [field for field in METRIC_FIELDS if not self.metrics.get(field)]  # type: ignore[call-overload]


class _Table(RootModel[dict[str, ServerKind]]):
    pass


@functools.cache
def kinds() -> dict[str, ServerKind]:
    """Every kind by name, in kinds.yaml's order; the generic server reads every kind's metric names."""
    table = load_yaml_model(KINDS_FILE, _Table).root
    named = {name: kind.model_copy(update={"name": name}) for name, kind in table.items()}
    every = {
        "metrics": _every_name([kind.metrics for kind in named.values()]),
        "by_position": _every_name([kind.by_position for kind in named.values()]),
    }
    return {name: kind.model_copy(update=every) if kind.metrics_of_every_kind else kind for name, kind in named.items()}


def _every_name(tables: list[dict[FieldName, list[str]]]) -> dict[FieldName, list[str]]:
    """Each field's names in every kind's table, first seen first."""
    every: dict[FieldName, list[str]] = {}
    for table in tables:
        for field, names in table.items():
            every.setdefault(field, []).extend(n for n in names if n not in every.get(field, []))
    return every


def kind(name: str) -> ServerKind:
    """The kind called `name`; KeyError names the known ones."""
    table = kinds()
    if name not in table:
        raise KeyError(f"no server kind {name!r}: one of {', '.join(table)}")
    return table[name]


_FIGURES = {
    "kv_cache_usage": "KV usage", "running": "running", "waiting": "waiting", "preemptions_total": "preemptions",
    "prefix_cache_hits_total": "prefix-cache hits", "prompt_tokens_total": "tokens",
    "spec_drafts_total": "speculative drafts",
}  # fmt: skip


def compatibility_table() -> str:
    """kinds.yaml as the Markdown table docs/servers.md prints (a test keeps the two equal)."""
    rows = [
        "| server | exact output length | unknown fields | ends with `[DONE]` | usage | metrics llmload reads"
        " | tokenize | prefix-cache reset | facts from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in kinds().values():
        forced = "not forced" if not row.forces_length else f"`{row.force_length}`"
        if row.metrics_of_every_kind:
            metrics = "any name of the kinds above"
        elif row.metrics:
            figures = ", ".join(word for field, word in _FIGURES.items() if field in row.metrics)
            metrics = f"`{row.metrics_path}`: {figures}" + (f" ({row.metrics_note})" if row.metrics_note else "")
        else:
            metrics = "none"
        reset = "–" if row.cache_reset is None else f"POST {row.cache_reset}"
        if row.cache_reset_note:
            reset += f" ({row.cache_reset_note})"
        rows.append(
            f"| {row.label} (`{row.name}`) | {forced} | {row.unknown_fields} | {'yes' if row.sends_done else '**no**'}"
            f" | {row.usage} | {metrics} | {row.tokenize or '–'} | {reset} | {row.read_from} |"
        )
    return "\n".join(rows) + "\n"
