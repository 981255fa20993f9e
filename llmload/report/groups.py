"""The judged requests broken down by a record column (the model a mix asked for): each group's counts,
failures and latency, computed once with the summary."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from llmload.models import GroupFigures
from llmload.stats.percentiles import quantile


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
                output_tokens_per_s=float(ok.output_tokens.fillna(0).sum()) / elapsed_s,
            )
        )
    return figures
