"""The runs a history is made of: every run directory under the given folders, each labelled from its
run.json, its figures read from summary.json through DuckDB, and sorted into those comparable with one
another and those listed apart with the reason.

A run is labelled from what run.json records (`RunManifest`): the server's kind and version, the model,
the workload file, the plan, the team's `--label`s, the time; the GPU from summary.json's `cost`. Two runs
are comparable when three digests agree, each the first 12 hex digits of the SHA-256 of a canonical JSON:

- the workload: its content (run.json's `workload_sha256`; the file's name in runs before it) and the
  flags that change what is sent (`WORKLOAD_FLAGS`);
- the server configuration: its kind, the model (or models and their shares), the number of replicas
  and the GPUs. The server's version and its URL are not in it: a release changes the version, and
  a history follows releases;
- the plan: the target rate, the stages (percent, seconds, warm-up), the arrival process and the
  goodput SLO.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson
from pydantic import BaseModel, Field

from llmload.errors import InputError
from llmload.models import RunManifest
from llmload.rundir import MANIFEST_FILE, SUMMARY_FILE, read_manifest

WORKLOAD_FLAGS = (
    "scale_tokens", "history_turns", "max_think_s", "think_time_only", "cache_bust", "cancel_share", "cancel_after",
    "first_session",
)  # fmt: skip
MEMORY_LIMIT = "512MB"  # DuckDB's: summary.json files are read in a stream, never all at once
DIGEST_CHARS = 12


@dataclass(frozen=True)
class Figure:
    """One figure a history follows: its name, where summary.json keeps it (a JSON path, or SQL over
    summary.json's `json` when derived), its unit and which way is worse."""

    key: str
    title: str
    sql: str
    unit: str
    higher_is_worse: bool = True
    gated: bool = False  # judged by `compare --baseline history:DIR`


def _at(path: str) -> str:
    return f"json_extract(json, '$.{path}')::DOUBLE"


_LATENCIES = [
    Figure(f"{name}_{q}", f"{name.upper()} {q}", _at(f"latency_ms.{name}.{q}"), "ms", gated=True)
    for name in ("ttft", "tpot", "itl", "e2e")
    for q in ("p50", "p95", "p99")
]
_ANSWERED = "(" + " + ".join(_at(f"requests.{n}") for n in ("ok", "failed", "unfinished")) + ")"
FIGURES: tuple[Figure, ...] = (
    *_LATENCIES,
    Figure("output_tokens_per_s", "output tok/s", _at("throughput.output_tokens_per_s"), "tok/s", False, True),
    Figure("goodput", "goodput", _at("throughput.goodput.requests_per_s"), "req/s", False, True),
    Figure(
        "error_rate",
        "error rate",
        f"({_at('requests.failed')} + {_at('requests.unfinished')}) / nullif({_ANSWERED}, 0)",
        "share",
    ),
    Figure("oom_family", "OOM-family failures", _at("failures.oom_family"), "count"),
    Figure("prefix_cache_hit_rate", "prefix-cache hit rate", _at("server.prefix_cache_hit_rate"), "share", False),
    Figure("joules_per_output_token", "J per output token", _at("cost.hold.joules_per_output_token"), "J"),
    Figure("usd_per_1m_output_tokens", "$ per 1M output tokens", _at("cost.hold.usd_per_1m_output_tokens"), "USD"),
)
FIGURE_BY_KEY = {figure.key: figure for figure in FIGURES}


class HistoryRun(BaseModel):
    """One run as a history names it: where it is, when it started, what it ran against, its digests
    (see the module) and its figures (None where the run has none: no goodput SLO, no GPU energy)."""

    run_id: str
    path: str
    started_at: float = Field(description="unix seconds")
    server: str | None = Field(description="the server's kind and version, `vLLM 0.32.0`; None: not detected")
    model: str | None
    workload: str = Field(description="the workload file's name")
    workload_hash: str
    config: str = Field(description="the server configuration in words: kind, model, replicas, GPUs")
    config_hash: str
    plan: str = Field(description="the plan in words: target rate, stages, arrivals")
    plan_hash: str
    gpu: str | None = Field(description="the GPUs the run's samples saw, `2 × H100`; None: none")
    labels: dict[str, str] = Field(default_factory=dict, description="--label KEY=VALUE, from run.json")
    figures: dict[str, float | None] = Field(default_factory=dict, description="by FIGURES' key")

    @property
    def when(self) -> str:
        """The start, UTC, to the minute."""
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.started_at))

    def key(self) -> tuple[str, str, str]:
        return self.workload_hash, self.config_hash, self.plan_hash

    def differs(self, other: HistoryRun) -> str | None:
        """Why this run is not comparable with `other` (its workload, configuration or plan, in words),
        None when it is."""
        reasons = [
            f"{what} {mine} (#{my_hash}), not {theirs} (#{their_hash})"
            for what, mine, my_hash, theirs, their_hash in (
                ("workload", self.workload, self.workload_hash, other.workload, other.workload_hash),
                ("server configuration", self.config, self.config_hash, other.config, other.config_hash),
                ("plan", self.plan, self.plan_hash, other.plan, other.plan_hash),
            )
            if my_hash != their_hash
        ]
        return "; ".join(reasons) or None


class ApartRun(BaseModel):
    """A run a history lists apart: unfinished (no summary.json), unreadable, or not comparable."""

    run_id: str
    path: str
    started_at: float | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    kind: Literal["unfinished", "unreadable", "not comparable"]
    reason: str


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:DIGEST_CHARS]


def find_run_dirs(directories: Sequence[Path]) -> list[Path]:
    """Every run directory (one holding run.json) under `directories`, each once; an InputError for a
    directory that does not exist."""
    found: dict[Path, None] = {}
    for directory in directories:
        if not directory.is_dir():
            raise InputError(f"{directory}: no such directory")
        for manifest in sorted(directory.rglob(MANIFEST_FILE)):
            found.setdefault(manifest.parent.resolve())
    return list(found)


def _gpu(kinds: list[str], count: int | None) -> str | None:
    if not kinds:
        return None
    return f"{count} × {', '.join(kinds)}" if count else ", ".join(kinds)


def _label(run_dir: Path, manifest: RunManifest, figures: dict[str, float | None], gpu: str | None) -> HistoryRun:
    server = manifest.server
    models = [[share.name, share.weight] for share in manifest.model_mix] or manifest.model
    replicas = max(1, len(manifest.replicas))
    config = {"kind": server.kind if server else None, "model": models, "replicas": replicas, "gpu": gpu}
    workload_name = Path(manifest.workload).name
    sent = manifest.workload_sha256 or workload_name  # its content where recorded; runs before that, its name
    workload = {"workload": sent, **{flag: manifest.flags.get(flag) for flag in WORKLOAD_FLAGS}}
    stages = [[s.percent, s.duration_s, s.warmup, s.sessions] for s in manifest.stages]
    slo = manifest.goodput_slo.model_dump(mode="json") if manifest.goodput_slo else None
    plan = {"target_qps": manifest.target_qps, "stages": stages, "arrival": manifest.arrival,
            "burstiness": manifest.burstiness, "time_scale": manifest.time_scale, "goodput_slo": slo}  # fmt: skip
    scale = manifest.flags.get("scale_tokens", 1.0)
    judged = manifest.judged_stages
    return HistoryRun(
        run_id=manifest.run_id,
        path=str(run_dir),
        started_at=manifest.started_at,
        server=server.name if server else None,
        model=manifest.model,
        workload=workload_name + (f" ×{scale:g}" if scale != 1.0 else ""),
        workload_hash=_digest(workload),
        config=", ".join(
            part
            for part in (
                server.kind if server else "server not detected",
                f"model {manifest.model or '?'}" if not manifest.model_mix else f"{len(manifest.model_mix)} models",
                f"{replicas} replicas" if replicas > 1 else "",
                gpu or "",
            )
            if part
        ),
        config_hash=_digest(config),
        plan=f"{manifest.target_qps:g} req/s, {manifest.arrival}, stages "
        + "/".join(f"{s.percent:g}%" for s in judged)
        + (f" × {judged[0].duration_s:g} s" if judged and len({s.duration_s for s in judged}) == 1 else ""),
        plan_hash=_digest(plan),
        gpu=gpu,
        labels=manifest.labels,
        figures=figures,
    )


def read_figures(summaries: Sequence[Path]) -> dict[Path, tuple[dict[str, float | None], str | None]]:
    """Each summary.json's figures (by FIGURES' key) and its GPUs in words, read in one DuckDB query in
    bounded memory (MEMORY_LIMIT): only the figures leave the database, never a whole summary."""
    if not summaries:
        return {}
    columns = ", ".join(f"{figure.sql} AS {figure.key}" for figure in FIGURES)
    query = (
        f"SELECT filename, {columns}, json_extract_string(json, '$.cost.gpu_kinds') AS gpu_kinds,"
        " json_extract(json, '$.cost.gpu_count')::INTEGER AS gpu_count"
        " FROM read_json_objects(?, filename = true, format = 'unstructured')"
    )
    with duckdb.connect(config={"memory_limit": MEMORY_LIMIT}) as con:
        rows = con.execute(query, [[str(path) for path in summaries]]).fetchall()
    read: dict[Path, tuple[dict[str, float | None], str | None]] = {}
    for filename, *values, gpu_kinds, gpu_count in rows:
        figures = {figure.key: value for figure, value in zip(FIGURES, values, strict=True)}
        read[Path(filename)] = figures, _gpu(orjson.loads(gpu_kinds) if gpu_kinds else [], gpu_count)
    return read


def read_runs(directories: Sequence[Path]) -> tuple[list[HistoryRun], list[ApartRun]]:
    """The finished runs under `directories`, oldest first, and those apart: unfinished (no summary.json:
    killed before its end) or unreadable (a run.json this llmload refuses, with its reason). An InputError
    when a directory does not exist, or a summary.json is not JSON (DuckDB's message names the file)."""
    manifests: dict[Path, RunManifest] = {}
    apart: list[ApartRun] = []
    for run_dir in find_run_dirs(directories):
        try:
            manifests[run_dir] = read_manifest(run_dir)
        except InputError as exc:
            apart.append(ApartRun(run_id=run_dir.name, path=str(run_dir), kind="unreadable", reason=str(exc)))
    finished = [run_dir for run_dir in manifests if (run_dir / SUMMARY_FILE).is_file()]
    for run_dir in manifests.keys() - set(finished):
        manifest = manifests[run_dir]
        apart.append(
            ApartRun(run_id=manifest.run_id, path=str(run_dir), started_at=manifest.started_at,
                     labels=manifest.labels, kind="unfinished",
                     reason=f"no {SUMMARY_FILE}: killed before its end (`llmload report {run_dir}` writes it)")
        )  # fmt: skip
    try:
        figures = read_figures([run_dir / SUMMARY_FILE for run_dir in finished])
    except duckdb.Error as exc:
        raise InputError(f"a {SUMMARY_FILE} under {', '.join(map(str, directories))} is not JSON: {exc}") from None
    runs = [_label(run_dir, manifests[run_dir], *figures[run_dir / SUMMARY_FILE]) for run_dir in finished]
    return sorted(runs, key=lambda run: run.started_at), sorted(apart, key=lambda run: run.started_at or 0.0)


def comparable(runs: Iterable[HistoryRun], like: HistoryRun) -> tuple[list[HistoryRun], list[ApartRun]]:
    """The runs comparable with `like` (same workload, server configuration and plan), in their order, and
    the others apart with what differs."""
    kept: list[HistoryRun] = []
    apart: list[ApartRun] = []
    for run in runs:
        reason = run.differs(like)
        if reason is None:
            kept.append(run)
        else:
            apart.append(ApartRun(run_id=run.run_id, path=run.path, started_at=run.started_at, labels=run.labels,
                                  kind="not comparable", reason=reason))  # fmt: skip
    return kept, apart
