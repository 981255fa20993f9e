"""The judged requests broken down by a record column (the model a mix asked for, the replica a session
went to): each group's counts, failures and latency, computed once with the summary, and the replica that
is slower than the others, said."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from llmload.format import figure
from llmload.models import GroupFigures, ReplicaServerSummary
from llmload.stats.percentiles import quantile

# A replica is called slower when its median is this much above the others' AND its sessions rank above
# theirs by Mann-Whitney's test at one-sided p < 0.0005 (z > 3.29). The test is over sessions (each one's
# median), not requests: a session's turns share its prompt lengths, so its requests are not independent,
# and over requests the test cried wolf in 4.5% of same-speed runs (tests/test_replicas.py measures both).
# The ratio keeps a difference nobody would act on quiet.
SLOWER_RATIO = 1.2
SLOWER_Z = 3.29
SLOWER_MIN_SESSIONS = 10  # each side's sessions with a successful request, below which nothing is said
_SLOWER_METRICS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
# A replica whose KV cache peaked this full, at least twice as full as every other's peak, is said to run
# out alone: a routing or sizing imbalance the fleet's figure (its fullest replica's) does not tell apart.
FULL_KV = 0.8
FULL_KV_RATIO = 2.0


def group_figures(df: pd.DataFrame, column: str, elapsed_s: float, shares: Mapping[str, float]) -> list[GroupFigures]:
    """`df`: the judged stages' records; `shares`: each group's share as asked, in the order to list them
    (a group asked for that sent nothing is listed with zeros; one not asked for after them)."""
    groups = {str(name): part for name, part in df[df[column].notna()].groupby(column, observed=True)}
    figures = []
    for name in [*shares, *(name for name in groups if name not in shares)]:
        part = groups.get(name, df.iloc[:0])
        ok = part[(part.status == "ok").to_numpy(dtype=bool)]
        failed = part[part.status.isin(["failed", "unfinished"]).to_numpy(dtype=bool)]
        figures.append(
            GroupFigures(
                name=name,
                share=shares.get(name),
                sent=int(part.sent_at.notna().sum()),
                ok=len(ok),
                failed=len(failed),
                failures={str(k): int(v) for k, v in failed.error_category.value_counts().items() if v},
                ttft_p50_ms=quantile(ok.ttft_ms, 50),
                ttft_p99_ms=quantile(ok.ttft_ms, 99),
                e2e_p50_ms=quantile(ok.e2e_ms, 50),
                e2e_p99_ms=quantile(ok.e2e_ms, 99),
                tpot_p50_ms=quantile(ok.tpot_ms, 50),
                output_tokens_per_s=float(ok.output_tokens.fillna(0).sum()) / elapsed_s,
            )
        )
    return figures


def rank_z(mine: np.ndarray, others: np.ndarray) -> float:
    """Mann-Whitney's U as a z score (normal approximation, ties ranked by their mean): > 0 when `mine`
    ranks above `others`."""
    n1, n2 = len(mine), len(others)
    ranks = pd.Series(np.concatenate([mine, others])).rank().to_numpy()
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    return (u - n1 * n2 / 2) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)


def slower_replicas(df: pd.DataFrame) -> list[str]:
    """A warning for each replica whose sessions' TTFT or TPOT is slower than the other replicas'
    (`df`: the judged stages' records, `host` set)."""
    ok = df[(df.status == "ok").to_numpy(dtype=bool) & df.host.notna().to_numpy(dtype=bool)]
    warnings = []
    for label, column in _SLOWER_METRICS:
        sessions = ok.groupby(["host", "session_id"], observed=True)[column].median().dropna().reset_index()
        for host in sessions.host.unique():
            mine = (sessions.host == host).to_numpy()
            a, b = sessions[column].to_numpy()[mine], sessions[column].to_numpy()[~mine]
            if min(len(a), len(b)) < SLOWER_MIN_SESSIONS:
                continue
            p50, others_p50 = float(np.median(a)), float(np.median(b))
            if others_p50 > 0 and p50 >= SLOWER_RATIO * others_p50 and rank_z(a, b) > SLOWER_Z:
                warnings.append(
                    f"replica {host} is slower than the others: {label} p50 {figure(p50)} ms, {p50 / others_p50:.1f}×"
                    f" theirs ({figure(others_p50)} ms; its sessions rank above theirs, p < 0.001)"
                )
    return warnings


def fuller_replicas(replicas: list[ReplicaServerSummary]) -> list[str]:
    """A warning for the replica whose KV cache ran full while the others' stayed well below it."""
    peaks = {r.host: r.kv_cache_usage_max for r in replicas if r.kv_cache_usage_max is not None}
    warnings = []
    for host, peak in peaks.items():
        others = max((p for h, p in peaks.items() if h != host), default=None)
        if others is not None and peak >= FULL_KV and peak >= FULL_KV_RATIO * others:
            warnings.append(
                f"replica {host}'s KV cache peaked at {peak:.0%} while the others stayed under"
                f" {math.ceil(others * 100 + 1e-9):.0f}%: it runs out first (its sessions' prompts, or a smaller"
                " cache)"
            )
    return warnings
