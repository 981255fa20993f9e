"""summary.json's `server` block: server.jsonl read back into frames, and what a report says of
them (the fullest KV cache and GPU, preemptions, the prefix-cache hit rate over the judged stages)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from llmload.models import GpuSummary, ReplicaServerSummary, ReusablePrefix, ServerSummary, SpecDecodeSummary
from llmload.observe.gpu import GpuSample
from llmload.observe.metrics import hit_rate
from llmload.observe.observer import ServerSample
from llmload.observe.scraper import ReplicaSample
from llmload.server.kinds import METRIC_FIELDS

LIST_FIELDS = ("missing", "spec_accepted_by_position")  # server.jsonl's fields that hold lists, not figures


def _server_lines(path: Path) -> list[dict[str, Any]]:
    """server.jsonl's samples; a line that does not parse (the run killed mid-write) is a lost sample."""
    rows = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _gpu_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    gpus = [{"t": row.get("t"), **gpu} for row in rows for gpu in row.get("gpus") or ()]
    frame = pd.DataFrame(gpus, columns=["t", *GpuSample.model_fields])
    numeric = [c for c in frame.columns if c not in ("gpu", "name")]
    frame[numeric] = frame[numeric].astype(float)
    frame["gpu"] = frame.gpu.astype(str)
    frame["memory_used_fraction"] = frame.memory_used_mib / frame.memory_total_mib.where(frame.memory_total_mib > 0)
    return frame.sort_values("t", kind="stable", ignore_index=True)


def _replica_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per replica per sample (a run over several replicas); empty otherwise."""
    replicas = [{"t": row.get("t"), **replica} for row in rows for replica in row.get("replicas") or ()]
    frame = pd.DataFrame(replicas, columns=["t", *ReplicaSample.model_fields])
    numeric = [c for c in frame.columns if c != "host"]
    frame[numeric] = frame[numeric].astype(float)
    return frame.sort_values("t", kind="stable", ignore_index=True)


def _server_frame(rows: list[dict[str, Any]], gpus: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in ServerSample.model_fields if c not in ("gpus", "replicas")]
    frame = pd.DataFrame(rows, columns=columns)
    numeric = [c for c in columns if c not in LIST_FIELDS]
    frame[numeric] = frame[numeric].astype(float)
    frame["gpu_memory_usage"] = frame.t.map(gpus.groupby("t").memory_used_fraction.max()).astype(float)
    return frame.sort_values("t", ignore_index=True)


@dataclass(frozen=True)
class ServerSamples:
    """server.jsonl read once: `frame` one row per sample sorted by `t` (health NaN = unreachable;
    `gpu_memory_usage` the fullest GPU's memory used / total, NaN without GPU data) and `gpus` one
    row per GPU per sample (t, gpu, memory_used_mib, memory_total_mib, utilization_percent,
    memory_used_fraction); both empty when the run has no server.jsonl. `replicas`: a run over several
    replicas, one row per replica per sample (t, host, health, kv_cache_usage, running, waiting,
    preemptions_total); `frame`'s figures are then the fleet's."""

    frame: pd.DataFrame
    gpus: pd.DataFrame
    replicas: pd.DataFrame = field(default_factory=lambda: _replica_frame([]))


def read_server(path: Path) -> ServerSamples:
    rows = _server_lines(path)
    gpus = _gpu_frame(rows)
    return ServerSamples(_server_frame(rows, gpus), gpus, _replica_frame(rows))


def series_max(values: pd.Series) -> float | None:
    """The largest value seen; None when none was (rather than NaN, which JSON and tables mangle)."""
    top = values.max()
    return None if pd.isna(top) else float(top)


def counter_increase(values: pd.Series) -> float | None:
    """How much a counter grew over the series (last − first), counting across server restarts."""
    seen = values.dropna()
    if seen.empty:
        return None
    steps = seen.diff().iloc[1:]
    return float(steps.where(steps >= 0, seen.iloc[1:]).sum())  # after a reset it counts from 0


def _gpu_summaries(gpus: pd.DataFrame) -> list[GpuSummary]:
    return [
        GpuSummary(
            gpu=str(gpu),
            memory_used_max_mib=series_max(rows.memory_used_mib),
            memory_total_mib=series_max(rows.memory_total_mib),
            memory_usage_max=series_max(rows.memory_used_fraction),
            utilization_mean_percent=None if rows.utilization_percent.isna().all() else rows.utilization_percent.mean(),
            utilization_max_percent=series_max(rows.utilization_percent),
        )
        for gpu, rows in gpus.groupby("gpu", sort=False)
    ]


def window_increase(frame: pd.DataFrame, column: str, start: float) -> float | None:
    """How much a counter grew from `start` (unix seconds) to the last sample: from the last sample
    at or before `start` (the first after it when there is none), never from the server's start."""
    seen = frame.loc[frame[column].notna(), ["t", column]]
    before = seen.t[seen.t <= start]
    return counter_increase(seen.loc[seen.t >= (before.iloc[-1] if len(before) else start), column])


def server_summary(
    samples: ServerSamples, judged_from: float = -math.inf, workload_prefix: ReusablePrefix | None = None
) -> ServerSummary | None:
    """summary.json's `server` block; None when no sample read any metric or GPU (or no server.jsonl).
    The prefix-cache figures count from `judged_from` (the first judged stage's start), beside what
    the prompts sent could have hit (`workload_prefix`)."""
    frame, gpus = samples.frame, samples.gpus
    replicas_read = samples.replicas[["kv_cache_usage", "running", "waiting", "preemptions_total"]].notna().any().any()
    if frame[list(METRIC_FIELDS)].isna().all().all() and gpus.empty and not replicas_read:
        return None
    hits = window_increase(frame, "prefix_cache_hits_total", judged_from)
    queries = window_increase(frame, "prefix_cache_queries_total", judged_from)
    return ServerSummary(
        kv_cache_usage_max=series_max(frame.kv_cache_usage),
        preemptions=counter_increase(frame.preemptions_total),
        prefix_cache_hit_rate=hit_rate(hits, queries),
        prefix_cache_queries=queries,
        workload_prefix=workload_prefix,
        waiting_max=series_max(frame.waiting),
        gpu_memory_usage_max=series_max(gpus.memory_used_fraction),
        gpus=_gpu_summaries(gpus),
        spec_decode=_spec_decode(frame, judged_from),
        replicas=_replica_summaries(samples.replicas, judged_from),
    )


def _replica_summaries(replicas: pd.DataFrame, judged_from: float) -> list[ReplicaServerSummary]:
    """Each replica's fullest KV cache, longest queue, preemptions over the judged stages and unanswered
    /health: the one that runs out shows apart from the fleet's figures."""
    return [
        ReplicaServerSummary(
            host=str(host),
            kv_cache_usage_max=series_max(rows.kv_cache_usage),
            preemptions=window_increase(rows, "preemptions_total", judged_from),
            waiting_max=series_max(rows.waiting),
            unanswered_samples=int(rows.health.isna().sum()),
        )
        for host, rows in replicas.groupby("host", sort=False)
    ]


def _spec_decode(frame: pd.DataFrame, judged_from: float) -> SpecDecodeSummary | None:
    """vLLM's speculative decoding from its counters' growth over the judged stages; None when it exports none."""
    drafts = window_increase(frame, "spec_drafts_total", judged_from)
    tokens = window_increase(frame, "spec_draft_tokens_total", judged_from)
    accepted = window_increase(frame, "spec_accepted_tokens_total", judged_from)
    if drafts is None or tokens is None or accepted is None:
        return None
    seen = frame.t[frame.spec_accepted_tokens_total.notna().to_numpy(dtype=bool)]
    seconds = float(seen.iloc[-1]) - max(judged_from, float(seen.iloc[0]))
    return SpecDecodeSummary(
        drafts=drafts, draft_tokens=tokens, accepted_tokens=accepted,
        acceptance_rate=accepted / tokens if tokens else None,
        mean_acceptance_length=1 + accepted / drafts if drafts else None,
        accepted_tokens_per_s=accepted / seconds if seconds > 0 else None,
        acceptance_by_position=_by_position(frame, judged_from, drafts),
    )  # fmt: skip


def _by_position(frame: pd.DataFrame, judged_from: float, drafts: float) -> list[float]:
    """Each draft position's accepted tokens / drafts, each position's counter grown as window_increase
    counts the others; empty without the vector."""
    seen = frame.loc[frame.spec_accepted_by_position.map(lambda v: isinstance(v, list) and len(v) > 0)]
    if seen.empty or not drafts:
        return []
    positions = pd.DataFrame(seen.spec_accepted_by_position.tolist(), index=seen.index).rename(columns=str)
    grown = [window_increase(positions.assign(t=seen.t), k, judged_from) for k in positions.columns]
    return [] if None in grown else [g / drafts for g in grown if g is not None]
