"""Workload statistics: request lengths, turns, history growth and arrivals, from a request table.

Everything is computed from one pandas "request table", one row per request, whatever the
workload came from (a workload file: `request_table`; a log: `build.source_table`):

| column | type | meaning |
|---|---|---|
| `session_id` | str | session the request belongs to |
| `turn` | int | 0-based turn index in its session |
| `arrival_s` | float | seconds from the first request; NaN when the source has no times |
| `prompt_tokens` | int | prompt length, history included |
| `output_tokens` | float | output length; NaN when unknown |
| `max_tokens` | float | the request's max_tokens; NaN when unknown |

`workload_stats(table, max_tokens=None) -> WorkloadStats` is the stable entry point (used by
`llmload capacity` for the P99 request length). Percentiles are `llmload.report.percentiles`:
numpy linear interpolation on the raw values, as everywhere else in llmload.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from llmload.format import fmt, percent
from llmload.models import Percentiles, ReusablePrefix, Session
from llmload.stats.percentiles import percentiles
from llmload.workload.files import Workload
from llmload.workload.tokens import get_tokenizer

TABLE_COLUMNS = ("session_id", "turn", "arrival_s", "think_s", "prompt_tokens", "output_tokens", "max_tokens")
MAX_MODEL_LEN_MULTIPLE = 16
_TURN_ROWS_SHOWN = 16


class TurnLengths(BaseModel):
    """Prompt length at one turn index (1 = first turn), as summary.json's `turns[]` counts them."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    requests: int
    prompt_tokens_p50: float
    prompt_tokens_p90: float
    prompt_tokens_p95: float
    prompt_tokens_p99: float


class WorkloadStats(BaseModel):
    """What a workload asks of a server; stored as the workload file's `stats`."""

    model_config = ConfigDict(extra="forbid")

    requests: int
    sessions: int
    prompt_tokens: Percentiles = Field(description="per request, history included")
    output_tokens: Percentiles = Field(description="requests whose output length is known")
    total_tokens: Percentiles = Field(description="prompt + output, requests whose output length is known")
    turns_per_session: Percentiles
    prompt_tokens_by_turn: list[TurnLengths] = Field(description="history growth")
    duration_s: float | None = Field(description="first to last arrival; None without times")
    requests_per_s: float | None = Field(description="mean request rate: 1 / mean inter-arrival time")
    inter_arrival_s: Percentiles
    think_time_s: Percentiles = Field(description="from a turn's arrival to its session's next turn's; follow-up turns")
    think_times: str | None = Field(default=None, description="how the source's think times were found")
    max_tokens_p99: float | None = Field(description="P99 of max_tokens, or of the output length where unset")
    max_tokens: int | None = Field(description="the max_tokens the recommendation assumes")
    max_tokens_configured: bool = Field(description="max_tokens was given, not taken from the source")
    recommended_max_model_len: int | None = Field(description="P99 prompt + max_tokens, rounded up to a multiple of 16")
    no_recommendation: str | None = Field(default=None, description="why there is no recommended_max_model_len")
    unbounded_requests: int = Field(
        default=0, description="requests with neither an output length nor max_tokens: unbounded if replayed"
    )
    reusable_prefix: ReusablePrefix | None = Field(
        default=None, description="prompt tokens an infinite prefix cache could serve (llmload/workload/prefix.py)"
    )
    reusable_prefix_absent: str | None = Field(default=None, description="why there is no reusable_prefix")


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def workload_stats(
    table: pd.DataFrame,
    *,
    max_tokens: int | None = None,
    think_times: str | None = None,
    reusable_prefix: ReusablePrefix | str | None = None,
) -> WorkloadStats:
    """Statistics of a request table; `max_tokens` overrides the source's P99 in the recommendation,
    `think_times` says how the source's think times were found, and `reusable_prefix` is the figure
    of `llmload.workload.prefix` or why it is absent (the table has no text to compute either from)."""
    missing = set(TABLE_COLUMNS) - set(table.columns)
    if missing:
        raise ValueError(f"request table lacks columns {sorted(missing)}")
    turns = table["session_id"].value_counts(sort=False)
    prompt = table["prompt_tokens"].astype(float)
    output = table["output_tokens"].astype(float)
    arrivals = np.sort(table["arrival_s"].dropna().to_numpy(dtype=float))
    gaps = np.diff(arrivals)
    span = float(arrivals[-1] - arrivals[0]) if arrivals.size else None
    by_turn = [
        TurnLengths(
            turn=int(turn) + 1,
            requests=len(rows),
            prompt_tokens_p50=float(np.percentile(rows, 50)),
            prompt_tokens_p90=float(np.percentile(rows, 90)),
            prompt_tokens_p95=float(np.percentile(rows, 95)),
            prompt_tokens_p99=float(np.percentile(rows, 99)),
        )
        for turn, rows in prompt.groupby(table["turn"], sort=True)
    ]
    limit = table["max_tokens"].astype(float).fillna(output)
    limit_p99 = percentiles(limit).p99
    prompt_p99 = percentiles(prompt).p99
    assumed = max_tokens if max_tokens is not None else None if limit_p99 is None else math.ceil(limit_p99)
    recommended = (
        None if prompt_p99 is None or assumed is None else _round_up(prompt_p99 + assumed, MAX_MODEL_LEN_MULTIPLE)
    )
    unbounded = int(limit.isna().sum())
    return WorkloadStats(
        think_times=think_times,
        requests=len(table),
        sessions=len(turns),
        prompt_tokens=percentiles(prompt),
        output_tokens=percentiles(output),
        total_tokens=percentiles(prompt + output),
        turns_per_session=percentiles(turns),
        prompt_tokens_by_turn=by_turn,
        duration_s=span,
        requests_per_s=gaps.size / span if span else None,
        inter_arrival_s=percentiles(gaps),
        think_time_s=percentiles(table["think_s"].astype(float)),
        max_tokens_p99=limit_p99,
        max_tokens=assumed,
        max_tokens_configured=max_tokens is not None,
        recommended_max_model_len=recommended,
        no_recommendation=None
        if recommended is not None
        else "no request says how long its reply may be (no reply, output_tokens or max_tokens in the source):"
        " give --max-tokens N, the longest reply the server should allow",
        unbounded_requests=unbounded,
        reusable_prefix=None if isinstance(reusable_prefix, str) else reusable_prefix,
        reusable_prefix_absent=reusable_prefix if isinstance(reusable_prefix, str) else None,
    )


def table_frame(columns: dict[str, object]) -> pd.DataFrame:
    """A request table from column sequences, with the documented dtypes."""
    frame = pd.DataFrame(columns, columns=list(TABLE_COLUMNS))
    return frame.astype(
        {
            "session_id": str,
            "turn": "int64",
            "arrival_s": "float64",
            "think_s": "float64",
            "prompt_tokens": "int64",
            "output_tokens": "float64",
            "max_tokens": "float64",
        }
    )


def _prompt_lengths(session: Session, tokenizer_name: str) -> list[int]:
    """Turns' prompt_tokens; missing ones (hand-written workloads) estimated as history + new messages."""
    known = [t.prompt_tokens for t in session.turns]
    if all(n is not None for n in known):
        return [int(n or 0) for n in known]
    tokenizer = get_tokenizer(tokenizer_name)
    out: list[int] = []
    history = 0
    for turn, given in zip(session.turns, known, strict=True):
        new = tokenizer.count_chat([m.model_dump() for m in turn.messages])
        history = given if given is not None else history + new
        out.append(history)
        history += turn.output_tokens or turn.max_tokens or 0
    return out


def request_table(workload: Workload) -> pd.DataFrame:
    """The request table of a loaded workload file (arrivals = session offset + the turn's recorded
    time, or + think times where none was recorded; think times where the session's start is known)."""
    columns: dict[str, list[object]] = {name: [] for name in TABLE_COLUMNS}
    for session in workload.sessions:
        start = math.nan if session.offset_s is None else session.offset_s
        arrival = start
        prompts = _prompt_lengths(session, workload.spec.tokenizer)
        for index, (turn, prompt) in enumerate(zip(session.turns, prompts, strict=True)):
            if index:
                arrival = start + turn.at_s if turn.at_s is not None else arrival + turn.think_time_s
            think = turn.think_time_s if index and not math.isnan(start) else math.nan
            for name, value in zip(
                TABLE_COLUMNS,
                (session.id, index, arrival, think, prompt, turn.output_tokens, turn.max_tokens),
                strict=True,
            ):
                columns[name].append(math.nan if value is None else value)
    return table_frame(dict(columns))


# --------------------------------------------------------------------------- rendering


def render_stats(stats: WorkloadStats) -> str:
    """The statistics as Markdown tables, for a terminal or a report."""
    lines = [
        f"{stats.requests:,} requests in {stats.sessions:,} sessions",
        "",
        "| per request | p50 | p90 | p95 | p99 | max | mean | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p, digits in (
        ("prompt tokens", stats.prompt_tokens, 0),
        ("output tokens", stats.output_tokens, 0),
        ("total tokens", stats.total_tokens, 0),
        ("turns per session", stats.turns_per_session, 1),
        ("inter-arrival s", stats.inter_arrival_s, 3),
        ("think time s", stats.think_time_s, 2),
    ):
        cells = " | ".join(fmt(v, digits) for v in (p.p50, p.p90, p.p95, p.p99, p.max, p.mean))
        lines.append(f"| {name} | {cells} | {p.count:,} |")
    lines += ["", "| turn | requests | prompt tokens p50 | prompt tokens p99 |", "|---:|---:|---:|---:|"]
    for row in stats.prompt_tokens_by_turn[:_TURN_ROWS_SHOWN]:
        lines.append(f"| {row.turn} | {row.requests:,} | {row.prompt_tokens_p50:,.0f} | {row.prompt_tokens_p99:,.0f} |")
    hidden = len(stats.prompt_tokens_by_turn) - _TURN_ROWS_SHOWN
    if hidden > 0:
        lines.append(f"| … | {hidden} more turn indexes (see --json) | | |")
    lines.append("")
    if stats.requests_per_s is not None:
        lines.append(f"Arrivals: {stats.requests_per_s:.3f} requests/s over {stats.duration_s:,.1f} s.")
    elif stats.duration_s is not None:  # timed, but all at one instant: no rate to give
        lines.append(f"Arrivals: all {stats.requests:,} requests at one time: no rate.")
    else:
        lines.append("Arrivals: the source has no timestamps.")
    if stats.think_times is not None:
        lines.append(f"Think times: {stats.think_times}.")
    if stats.recommended_max_model_len is not None:
        origin = "given" if stats.max_tokens_configured else "P99 of max_tokens, or of output where unset"
        lines.append(
            f"Recommended max_model_len: {stats.recommended_max_model_len:,} = P99 prompt "
            f"{fmt(stats.prompt_tokens.p99, 0)} + max_tokens {stats.max_tokens:,} ({origin}), "
            f"rounded up to a multiple of {MAX_MODEL_LEN_MULTIPLE}."
        )
    else:
        lines.append(f"Recommended max_model_len: none: {stats.no_recommendation}.")
    if stats.unbounded_requests:
        lines.append(
            f"Output lengths: {stats.unbounded_requests:,} of {stats.requests:,} requests have no reply, output_tokens"
            " or max_tokens (a server would generate up to max_model_len): `workload build --output-tokens"
            " DISTRIBUTION` draws theirs."
        )
    lines += _render_reuse(stats)
    return "\n".join(lines) + "\n"


def _render_reuse(stats: WorkloadStats) -> list[str]:
    reuse = stats.reusable_prefix
    if reuse is None:
        absent = stats.reusable_prefix_absent
        return [] if absent is None else [f"Reusable prefix: none ({absent})."]
    lines = [
        "",
        f"Reusable prefix (an infinite prefix cache, {reuse.block_size}-token blocks, from {reuse.basis}): "
        f"{percent(reuse.share, 1)} of {reuse.prompt_tokens:,} prompt tokens: "
        f"history {percent(reuse.history_share, 1)}, shared with other sessions {percent(reuse.shared_share, 1)}.",
        "",
        "| turn | requests | reusable |",
        "|---:|---:|---:|",
    ]
    if reuse.by_conversation is not None:
        lines[2:2] = ["", f"By conversation: {reuse.by_conversation.describe()}."]
    shown = reuse.by_turn[:_TURN_ROWS_SHOWN]
    lines += [f"| {row.turn} | {row.requests:,} | {percent(row.share, 1)} |" for row in shown]
    hidden = len(reuse.by_turn) - _TURN_ROWS_SHOWN
    if hidden > 0:
        lines.append(f"| … | {hidden} more turn indexes (see --json) | |")
    return lines


def plot_stats(table: pd.DataFrame, stats: WorkloadStats, path: Path) -> Path:
    """A PNG: length histograms, history growth by turn, arrivals over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    lengths, growth, arrivals, turns = axes.flat
    total = table["prompt_tokens"] + table["output_tokens"]
    for label, values in (("prompt", table["prompt_tokens"]), ("output", table["output_tokens"]), ("total", total)):
        data = values.dropna()
        if len(data):
            lengths.hist(data, bins=60, histtype="step", label=label)
    lengths.set(title="tokens per request", xlabel="tokens", ylabel="requests", yscale="log")
    lengths.legend()
    rows = stats.prompt_tokens_by_turn
    growth.plot([r.turn for r in rows], [r.prompt_tokens_p50 for r in rows], marker="o", label="p50")
    growth.plot([r.turn for r in rows], [r.prompt_tokens_p99 for r in rows], marker="o", label="p99")
    growth.set(title="prompt tokens by turn (history growth)", xlabel="turn", ylabel="prompt tokens")
    growth.legend()
    times = table["arrival_s"].dropna()
    if len(times):
        width = max(1.0, float(times.max()) / 120)
        counts, edges = np.histogram(times, bins=np.arange(0.0, float(times.max()) + width, width))
        arrivals.plot(edges[:-1], counts / width)
    else:  # an empty panel would read as a plotting fault
        arrivals.text(0.5, 0.5, "no arrival times in this log", ha="center", va="center", transform=arrivals.transAxes)
    arrivals.set(title="arrivals", xlabel="seconds from the first request", ylabel="requests/s")
    depth = table.groupby("session_id").size()
    # one bar per turn count, on a linear axis: on a log one, 166 sessions against 167 looked far apart
    turns.bar(*np.unique(depth, return_counts=True), width=0.8)
    turns.set(title="turns per session", xlabel="turns", ylabel="sessions")
    for axis in (growth, turns):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
