"""report.html: one self-contained page per run, to open offline, attach to a ticket, archive.

Charts are matplotlib SVGs embedded as data: URIs (each image its own document, so the ids
inside the SVGs never clash); there is no script and no external resource, and a
Content-Security-Policy makes the browser refuse any that slipped in. Jinja's autoescape escapes
every text: error messages come from servers. Figures come from the raw records, the summary
(percentiles as in summary.json) and server.jsonl when the observer ran.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import io
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import matplotlib
import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox
from matplotlib.typing import RcKeyType

from llmload.cancel import cut_line
from llmload.fleet import lost_line, worker_name
from llmload.format import fmt, percent
from llmload.models import FAILURE_CATEGORIES, OOM_FAMILY, RunManifest, Stage, Summary
from llmload.observe.gpu import GPU_SOURCES
from llmload.observe.summary import series_max
from llmload.report import notes
from llmload.report.markdown import server_facts, turn_depths
from llmload.report.summary import RunItl
from llmload.rundir import HTML_FILE
from llmload.rundir import Run as FinishedRun
from llmload.stats import windows
from llmload.stats.percentiles import percentiles
from llmload.stats.sketch import quantiles

MAX_WINDOWS = 60  # points per time series: enough to see a trend, few enough to read
MAX_SERVER_POINTS = 600  # server samples drawn: a 2-hour run has 7,200
NICE_WINDOWS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
CATEGORY_COLORS = dict(
    zip(
        FAILURE_CATEGORIES,
        (
            "#9467bd",
            "#c49c94",
            "#7f0000",
            "#d62728",
            "#ff7f0e",
            "#e7ba52",
            "#8c564b",
            "#bcbd22",
            "#17becf",
            "#1f77b4",
            "#e377c2",
            "#7f7f7f",
            "#393b79",
            "#637939",
            "#843c39",
            "#aec7e8",
            "#5254a3",
        ),
        strict=True,
    )
)
P50, P99 = "#1f77b4", "#d62728"
RC: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "svg.fonttype": "path",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
}


@contextlib.contextmanager
def drawing() -> Iterator[None]:
    """Where every llmload chart is drawn: in the house style (RC), the cyclic garbage collector paused.
    A figure is thousands of small objects in cycles, alive until it is saved; drawn with the collector
    on, a report's charts set off a full collection of every object in the process (0.1 s of a report
    in a Locust process, more in a test's), which frees none of theirs. Dropped figures are freed by
    the next young collection after this."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with matplotlib.rc_context(RC):
            yield
    finally:
        if collecting:
            gc.enable()


@dataclass
class Chart:
    title: str
    image: str | None = None  # data: URI of the SVG
    note: str | None = None  # said instead of a chart that has nothing to show


@dataclass
class Page:
    """Everything the page draws, times relative to the run's start (seconds)."""

    manifest: RunManifest
    summary: Summary
    records: pd.DataFrame  # without ITL gaps: `itl` has them counted per window
    failures: pd.DataFrame  # the failed records' category and server state (records.FAILURE_COLUMNS)
    server: pd.DataFrame
    gpus: pd.DataFrame  # one row per GPU per sample; empty when the run read no GPU
    span_s: float  # plan and drain: the x range of every time chart
    window_s: float
    itl: RunItl

    @property
    def stages(self) -> list[Stage]:
        return self.manifest.stages

    def rel(self, unix: pd.Series) -> np.ndarray:
        return (unix - self.manifest.started_at).to_numpy(dtype=float)


def _span_s(manifest: RunManifest, finished_at: float) -> float:
    """Plan and drain: the x range of every time chart."""
    return max(manifest.stages[-1].end_s if manifest.stages else 0.0, finished_at - manifest.started_at)


def chart_window_s(run: FinishedRun) -> float:
    """The latency chart's window: ITL histograms are counted per window of it."""
    return _window_s(_span_s(run.manifest, run.finished_at))


def _window_s(span_s: float) -> float:
    """A round window giving at most MAX_WINDOWS points over the run."""
    for window in NICE_WINDOWS_S:
        if span_s / window <= MAX_WINDOWS:
            return float(window)
    return float(math.ceil(span_s / MAX_WINDOWS))


def tight_bbox(fig: Figure) -> Bbox:
    """What savefig's bbox_inches="tight" crops to (the drawn content and savefig.pad_inches, in inches),
    measured without drawing: "tight" first draws the whole figure to measure it, then again to save it
    (0.1 s more of a report's 0.9 s). Agg's text extents are within 1 pt of SVG's: the padding covers it."""
    renderer = RendererAgg(int(fig.bbox.width), int(fig.bbox.height), fig.dpi)
    return fig.get_tightbbox(renderer).padded(matplotlib.rcParams["savefig.pad_inches"])


def svg_data_uri(fig: Figure, salt: str) -> str:
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):  # stable ids: the same run renders the same bytes
        fig.savefig(buffer, format="svg", bbox_inches=tight_bbox(fig), metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode()


def _time_axis(ax: Axes, run: Page, *, names: bool) -> None:
    """The run's time range, stage boundaries dotted (names on top), the end of the plan dashed."""
    ax.set_xlim(0, run.span_s)
    for stage in run.stages:
        if stage.start_s > 0:
            ax.axvline(stage.start_s, color="0.4", linestyle=":", linewidth=1)
        if names:
            ax.text(stage.start_s + stage.duration_s / 2, 1.0, stage.name, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color="0.3")  # fmt: skip
    if run.stages:
        ax.axvline(run.stages[-1].end_s, color="0.4", linestyle="--", linewidth=1)


def legend(ax: Axes, **kwargs: Any) -> None:
    """Beside the plot, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), **kwargs)


def _windowed(times: np.ndarray, values: np.ndarray, window: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Window midpoints, p50 and p99 of the values in each window that has any."""
    low, high = (windows.per_window(times, values, window, reduce) for reduce in (windows.p50, windows.p99))
    return low.index.to_numpy(), low.to_numpy(), high.to_numpy()


def _windowed_itl(run: Page) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As _windowed, for the gaps of successful requests by their send time: one histogram a window."""
    counts = run.itl.by_window()
    seen = np.flatnonzero(counts.sum(axis=1))
    p50, p99 = quantiles(counts[seen], np.array([50, 99])).T
    return (seen + 0.5) * run.window_s, p50, p99


def _latency_chart(run: Page) -> Figure | str:
    ok = run.records[run.records.status == "ok"]
    if ok.empty:
        return "No successful requests: no latencies to show."
    sent = run.rel(ok.sent_at)
    series = [("TTFT (ms)", *_windowed(sent, ok.ttft_ms.to_numpy(), run.window_s))]
    series += [("ITL (ms)", *_windowed_itl(run)), ("E2E (ms)", *_windowed(sent, ok.e2e_ms.to_numpy(), run.window_s))]
    fig = Figure(figsize=(10, 6.6))
    axes = fig.subplots(3, 1, sharex=True)
    for i, (ax, (label, x, p50, p99)) in enumerate(zip(axes, series, strict=True)):
        ax.plot(x, p50, color=P50, marker=".", label="p50")
        ax.plot(x, p99, color=P99, marker=".", label="p99")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        _time_axis(ax, run, names=i == 0)
    legend(axes[0])
    axes[-1].set_xlabel(f"seconds since start (by send time, {run.window_s:g} s windows)")
    return fig


def _qps_chart(run: Page) -> Figure | str:
    stages = run.summary.stages
    if not stages:
        return "The run had no stages."
    x = np.arange(len(stages))
    fig = Figure(figsize=(10, 3.2))
    ax = fig.subplots()
    ax.bar(x - 0.27, [s.target_qps for s in stages], 0.27, color="0.8", label="target")
    ax.bar(x, [s.offered_qps for s in stages], 0.27, color=P50, label="offered (scheduled)")
    achieved = ax.bar(x + 0.27, [s.achieved_qps for s in stages], 0.27, color="#2ca02c", label="achieved (sent)")
    for bar, stage in zip(achieved, stages, strict=True):
        if stage.shortfall:
            ax.annotate("shortfall", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=8, color=P99)  # fmt: skip
    ax.set_xticks(x, [s.name for s in stages])
    ax.set_ylabel("requests/s")
    legend(ax)
    return fig


def _peaks(samples: pd.DataFrame) -> pd.DataFrame:
    """At most MAX_SERVER_POINTS of a time series' samples (`t`, sorted, and numeric or boolean
    columns) for a chart, each the max of its share of the run: no spike or outage disappears (the
    summary uses them all)."""
    if len(samples) <= MAX_SERVER_POINTS:
        return samples
    start = samples.t.iloc[0]
    slot = ((samples.t - start) // ((samples.t.iloc[-1] - start) / MAX_SERVER_POINTS)).clip(upper=MAX_SERVER_POINTS - 1)
    peaks = samples.drop(columns="t").groupby(slot).max()
    peaks["t"] = samples.t.groupby(slot).mean()
    return peaks.reset_index(drop=True)


def _server_chart(run: Page) -> Figure | str:
    server = run.server
    if server.empty:
        return "No server metrics: the run has no server.jsonl (the observer did not run)."
    if server[["kv_cache_usage", "waiting", "running"]].isna().all().all():
        answered = int((server.health == 200).sum())
        return (
            f"No server metrics: {len(server)} samples, /health 200 in {answered}, but /metrics gave none of "
            "vLLM's KV cache or queue metrics."
        )
    columns = ["t", "kv_cache_usage", "waiting", "running", "preemptions_total"]
    server = _peaks(server[columns].assign(unhealthy=server.health != 200))
    t = run.rel(server.t)
    fig = Figure(figsize=(10, 4.4))
    kv_ax, queue_ax = fig.subplots(2, 1, sharex=True)
    kv_ax.plot(t, server.kv_cache_usage * 100, color="#9467bd")
    kv_ax.set_ylabel("KV cache usage (%)")
    kv_ax.set_ylim(0, 105)
    queue_ax.plot(t, server.waiting, color=P99, label="waiting")
    queue_ax.plot(t, server.running, color=P50, label="running")
    preempted = server.preemptions_total - server.preemptions_total.dropna().min()
    queue_ax.plot(t, preempted, color="0.3", linestyle="--", label="preempted (total)")
    queue_ax.set_ylabel("requests")
    queue_ax.set_ylim(bottom=0)
    queue_ax.set_xlabel("seconds since start")
    unhealthy = t[server.unhealthy.to_numpy(dtype=bool)]
    half = float(np.median(np.diff(t))) / 2 if len(t) > 1 else 0.5  # a band as wide as the sample
    for ax in (kv_ax, queue_ax):
        _time_axis(ax, run, names=ax is kv_ax)
        for at in unhealthy:  # samples where /health was not 200 or nothing answered
            ax.axvspan(at - half, at + half, color=P99, alpha=0.15, linewidth=0)
    legend(queue_ax, title="red: /health not 200" if len(unhealthy) else None)
    return fig


def _gpu_chart(run: Page) -> Figure | str | None:
    """Memory used (% of total) and utilisation per GPU, on the time axis of the KV-cache chart.
    A run without a GPU source shows nothing; one whose source gave nothing says so."""
    if run.gpus.empty:
        if not any(isinstance(names, list) and GPU_SOURCES & set(names) for names in run.server.missing):
            return None
        return "No GPU metrics: the GPU source (--gpu-metrics or nvidia-smi) gave none; the run's log says why."
    fig = Figure(figsize=(10, 4.4))
    memory_ax, util_ax = fig.subplots(2, 1, sharex=True)
    for gpu, samples in run.gpus.groupby("gpu", sort=False):
        peaks = _peaks(samples[["t", "memory_used_fraction", "utilization_percent"]])
        total = series_max(samples.memory_total_mib)
        label = f"GPU {gpu}" + ("" if total is None else f" ({total:,.0f} MiB)")
        t = run.rel(peaks.t)
        memory_ax.plot(t, peaks.memory_used_fraction * 100, label=label)
        util_ax.plot(t, peaks.utilization_percent, label=label)
    memory_ax.set_ylabel("GPU memory used (%)")
    util_ax.set_ylabel("GPU utilisation (%)")
    util_ax.set_xlabel("seconds since start")
    for ax in (memory_ax, util_ax):
        ax.set_ylim(0, 105)
        _time_axis(ax, run, names=ax is memory_ax)
    legend(memory_ax)
    return fig


def _failures_chart(run: Page) -> Figure | str:
    failed = run.records[run.records.status.isin(["failed", "unfinished"])]
    if failed.empty:
        return "No failures."
    at = run.rel(failed.finished_at.fillna(failed.sent_at).fillna(failed.scheduled_at))
    window = np.floor(at / run.window_s).astype(int)
    counts = pd.crosstab(window, failed.error_category.fillna("unknown").to_numpy())
    fig = Figure(figsize=(10, 3.2))
    ax = fig.subplots()
    bottom = np.zeros(len(counts))
    x = (counts.index.to_numpy() + 0.5) * run.window_s
    for category in counts.columns:
        heights = counts[category].to_numpy()
        color = CATEGORY_COLORS.get(str(category), "0.5")
        ax.bar(x, heights, run.window_s * 0.9, bottom=bottom, color=color, label=str(category))
        bottom += heights
    _time_axis(ax, run, names=True)
    ax.set_ylabel(f"failures per {run.window_s:g} s")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("seconds since start (by end time)")
    legend(ax)
    return fig


def _turns_chart(run: Page) -> Figure | str:
    turns = [t for t in run.summary.turns if t.ttft_p50_ms is not None]
    if not turns:
        return "No successful requests: nothing to show by turn."
    x = [t.turn for t in turns]
    fig = Figure(figsize=(10, 3.2))
    prompt_ax, ttft_ax = fig.subplots(1, 2)
    prompt_ax.plot(x, [t.prompt_tokens_p50 for t in turns], color=P50, marker="o", label="p50")
    prompt_ax.plot(x, [t.prompt_tokens_p99 for t in turns], color=P99, marker="o", label="p99")
    prompt_ax.set_ylabel("prompt tokens (history included)")
    ttft_ax.plot(x, [t.ttft_p50_ms for t in turns], color=P50, marker="o", label="p50")
    ttft_ax.plot(x, [t.ttft_p99_ms for t in turns], color=P99, marker="o", label="p99")
    ttft_ax.set_ylabel("TTFT (ms)")
    for ax in (prompt_ax, ttft_ax):
        ax.set_xlabel("turn")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(ttft_ax)
    return fig


def _tokens_chart(run: Page) -> Figure | str:
    ok = run.records[run.records.status == "ok"]
    if ok.empty:
        return "No successful requests: no token lengths to show."
    fig = Figure(figsize=(10, 3.0))
    for ax, (label, values, color) in zip(
        fig.subplots(1, 2),
        (("prompt tokens", ok.prompt_tokens, P50), ("output tokens", ok.output_tokens, "#2ca02c")),
        strict=True,
    ):
        data = values.dropna().to_numpy()
        ax.hist(data, bins=min(50, max(1, len(np.unique(data)))), color=color)
        p = percentiles(data)
        for q, style in ((p.p50, "-"), (p.p99, "--")):
            if q is not None:
                ax.axvline(q, color="0.2", linestyle=style, linewidth=1)
        ax.set_xlabel(f"{label} (lines: p50, p99)")
        ax.set_ylabel("requests")
    return fig


CHARTS: Sequence[tuple[str, Callable[[Page], Figure | str | None]]] = (  # None: the chart does not apply
    ("Latency over time (p50, p99)", _latency_chart),
    ("Offered vs achieved rate by stage", _qps_chart),
    ("Server: KV cache and queue", _server_chart),
    ("Server: GPU memory and utilisation", _gpu_chart),
    ("Failures over time by category", _failures_chart),
    ("By turn: prompt length and TTFT", _turns_chart),
    ("Token lengths (successful requests)", _tokens_chart),
)


def _failure_rows(run: Page) -> list[dict[str, object]]:
    """Per category: count, an example, and the server's state the run recorded with each failure
    (when it observed the server): the fullest KV cache, the longest queue, /health not 200."""
    examples = run.summary.failures.examples
    failed = run.failures
    rows = []
    for category, count in sorted(run.summary.failures.by_category.items(), key=lambda kv: -kv[1]):
        row: dict[str, object] = {
            "category": category,
            "count": count,
            "oom": category in OOM_FAMILY,
            "example": examples.get(category, "")[:300],
        }
        if not run.server.empty:
            group = failed[failed.error_category == category]
            kv = series_max(group.server_kv_cache_usage)
            row["kv"] = percent(kv)
            row["waiting"] = fmt(series_max(group.server_waiting), 0)
            row["unhealthy"] = int((group.server_health != 200).sum())  # null: /health did not answer
        rows.append(row)
    return rows


STYLE = """body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1100px;
       padding: 1.2em 1.5em 3em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.15em; margin: 1.6em 0 .5em; }
.meta { color: #555; margin-top: 0; }
.verdict { padding: .7em 1em; border-radius: 6px; margin: 1em 0; border: 2px solid; }
.verdict.pass { background: #e9f7ec; border-color: #2ca02c; }
.verdict.fail { background: #fdecea; border-color: #d62728; }
.verdict.inconclusive { background: #fff6e0; border-color: #e6a700; }
.verdict strong { font-size: 1.4em; } .verdict ul { margin: .3em 0 0; }
.warn { background: #fff6e0; border-left: 4px solid #e6a700; padding: .4em 1em; margin: 1em 0; }
table { border-collapse: collapse; margin: .4em 0 1em; font-variant-numeric: tabular-nums;
  display: block; max-width: 100%; overflow-x: auto; }  /* a wide table scrolls in its box, not the page */
.verdict li, .warn { overflow-wrap: anywhere; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; } td.msg { text-align: left; max-width: 34em;
  overflow-wrap: anywhere; font-family: ui-monospace, monospace; font-size: .85em; }
tr.oom td:first-child { color: #b00; font-weight: 600; }
.note { color: #666; font-style: italic; padding: .8em 1em; background: #f7f7f7; border-radius: 4px; }
figure { margin: 0 0 1.2em; } figure img { width: 100%; height: auto; display: block; }
"""  # shared with the search page (llmload.search)
ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)  # shared with the search page
ENV.filters["fmt"] = fmt
ENV.filters["turn_depths"] = turn_depths
ENV.filters["percent"] = percent
PAGE_START = ENV.from_string("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>llmload {{ kind }} {{ name }}</title>
<style>
{{ style | safe }}</style></head><body>
<h1>llmload {{ kind }} <code>{{ name }}</code></h1>""")


def page_start(kind: str, name: str, style: str) -> Markup:
    """The head every llmload page shares (self-contained: the CSP lets in inline styles and data: images
    only) and its title: `llmload run ID`, `llmload search ID`, `llmload sweep ID`."""
    return Markup(PAGE_START.render(kind=kind, name=name, style=style))


TEMPLATE = ENV.from_string("""{{ start }}
<p class="meta">Target {{ s.run.host }}{% if s.by_host %} and {{ s.by_host | length - 1 }} more
replica(s){% endif %}{% if s.run.server %}, {{ s.run.server.name }}{% endif %} (model
{{ s.run.model or "?" }}), workload {{ s.run.workload }},
{{ s.run.arrival }} arrivals, target {{ s.run.target_qps | fmt(2) }} req/s, {{ s.run.workers }} load-generator
process(es), {{ (s.run.finished_at - s.run.started_at) | fmt(0) }} s.</p>
{% if s.verdict %}
<div class="verdict {{ s.verdict.outcome }}"><strong>{{ s.verdict.label }}</strong>{% if s.verdict.reasons
  %}<ul>{% for r in s.verdict.reasons %}<li>{{ r }}</li>{% endfor %}</ul>{% endif %}</div>
{% endif %}
{% for w in s.run.warnings %}<div class="warn">{{ w }}</div>{% endfor %}
<h2>Requests</h2>
<table><tr><th>scheduled</th><th>sent</th><th>ok</th><th>failed</th><th>unfinished</th><th>cancelled</th>
<th>not sent</th><th>lost</th><th>OOM family</th><th>warm-up (not judged)</th></tr>
<tr><td>{{ s.requests.scheduled }}</td><td>{{ s.requests.sent }}</td><td>{{ s.requests.ok }}</td>
<td>{{ s.requests.failed }}</td><td>{% if s.requests.unfinished %}<b>{{ s.requests.unfinished }}</b>{% else
%}0{% endif %}</td><td>{{ s.requests.cancelled }}</td><td>{{ s.requests.not_sent }}</td>
<td>{{ s.requests.lost }}</td><td>{{ s.failures.oom_family }}</td><td>{{ s.requests.warmup }}</td></tr></table>
<p class="note">{{ notes.REQUESTS_NOTE }}</p>
{% if s.requests.lost %}<div class="warn">{{ notes.lost_note(s.requests.lost) }}</div>
{% endif %}{% if cancel_line %}<p class="note">{{ cancel_line }}</p>{% endif %}{% if s.workers %}<h2>Workers</h2>
<table><tr><th class="l">worker</th><th>sent</th><th>ok</th><th>failed</th><th>lost</th><th>sent, its own count</th>
<th>took over</th><th>CPU max</th></tr>
{% for w in s.workers %}<tr><td class="l">{{ w.index }} ({{ w.host }})</td><td>{{ w.sent }}</td><td>{{ w.ok }}</td>
<td>{{ w.failed }}</td><td>{{ w.lost }}</td><td>{{ w.sent_reported }}</td><td>{{ w.adopted }}</td>
<td>{{ w.cpu_max_percent | fmt(0) }}%</td></tr>{% endfor %}</table>
{% for line in worker_lines %}<div class="warn">{{ line }}</div>{% endfor %}{% endif %}
{% macro groups(title, label, rows, note) %}<h2>{{ title }}</h2>
<table><tr><th class="l">{{ label }}</th><th>share asked</th><th>sent</th><th>ok</th><th>failed</th><th>TTFT p50</th>
<th>TTFT p99</th><th>TPOT p50</th><th>E2E p50</th><th>E2E p99</th><th>output tok/s</th></tr>
{% for g in rows %}<tr><td class="l">{{ g.name }}</td><td>{{ (100 * g.share) | fmt(0) if g.share is not none
else "–" }}%</td><td>{{ g.sent }}</td><td>{{ g.ok }}</td><td>{{ g.failed }}{% for c, n in g.failures.items() %}
{{ c }} {{ n }}{% endfor %}</td><td>{{ g.ttft_p50_ms | fmt(0) }}</td><td>{{ g.ttft_p99_ms | fmt(0) }}</td>
<td>{{ g.tpot_p50_ms | fmt }}</td><td>{{ g.e2e_p50_ms | fmt(0) }}</td><td>{{ g.e2e_p99_ms | fmt(0) }}</td>
<td>{{ g.output_tokens_per_s | fmt }}</td></tr>{% endfor %}</table>
<p class="meta">The judged stages' requests, latency in ms; {{ note }}</p>{% endmacro %}
{% if s.by_model %}{{ groups("By model", "model", s.by_model,
"each session asks for one model, drawn by its share.") }}{% endif %}
{% if s.by_host %}{{ groups("By replica", "replica", s.by_host,
"all turns of a session go to one replica; its server kind and model list are the first's.") }}
{% endif %}{% if s.server and s.server.replicas %}<table><tr><th class="l">replica</th><th>KV cache peak</th>
<th>preemptions</th><th>waiting peak</th><th>/health unanswered</th></tr>
{% for r in s.server.replicas %}<tr><td class="l">{{ r.host }}</td><td>{{ r.kv_cache_usage_max | percent }}</td>
<td>{{ r.preemptions | fmt(0) }}</td><td>{{ r.waiting_max | fmt(0) }}</td><td>{{ r.unanswered_samples }}</td></tr>
{% endfor %}</table>
<p class="meta">{{ notes.REPLICA_SERVER_NOTE }}</p>{% endif %}<h2>Latency (ms, successful requests, from send)</h2>
<table><tr><th class="l">metric</th><th>p50</th><th>p95</th><th>p99</th><th>max</th><th>n</th></tr>
{% for name, p in latency %}<tr><td class="l">{{ name }}</td><td>{{ p.p50 | fmt }}</td><td>{{ p.p95 | fmt }}</td>
<td>{{ p.p99 | fmt }}</td><td>{{ p.max | fmt }}</td><td>{{ p.count }}</td></tr>{% endfor %}</table>
<p class="meta">{{ notes.ITL_NOTE }}</p>
<p>Throughput {{ s.throughput.requests_per_s | fmt(2) }} req/s, {{ s.throughput.output_tokens_per_s | fmt(0) }}
output tok/s, {{ s.throughput.total_tokens_per_s | fmt(0) }} total tok/s.{% for fact in server_facts %}
{{ fact }}{% endfor %}
{% if s.turns | selectattr("cached_share", "ne", none) | list %}Prompt tokens from the prefix cache, by turn:
{% for t in s.turns %}{{ t.turn }}: {{ t.cached_share | percent }}{{ "; " if not loop.last else "." }}{% endfor %}
{% endif %}</p>
{% if s.server and s.server.gpus %}<table><tr><th class="l">GPU</th><th>memory used max</th><th>MiB used max</th>
<th>MiB total</th><th>utilisation mean %</th><th>utilisation max %</th></tr>
{% for g in s.server.gpus %}<tr><td class="l">{{ g.gpu }}</td><td>{{ g.memory_usage_max | percent }}</td>
<td>{{ g.memory_used_max_mib | fmt(0) }}</td><td>{{ g.memory_total_mib | fmt(0) }}</td>
<td>{{ g.utilization_mean_percent | fmt(0) }}</td><td>{{ g.utilization_max_percent | fmt(0) }}</td></tr>
{% endfor %}</table>
{% endif %}
{% if s.run.goodput_slo and s.throughput.goodput %}{% set g = s.throughput.goodput %}
<h2>Goodput</h2>
<p>Requests meeting every SLO ({{ s.run.goodput_slo.describe() }}): {{ g.requests_per_s | fmt(2) }} req/s,
{{ g.output_tokens_per_s | fmt(0) }} output tok/s, {{ g.slo_attainment | percent(1) }} of the answered requests.
Failed and unfinished requests count against it; cancelled ones are left out.</p>
<table><tr><th class="l">stage</th><th>achieved req/s</th><th>goodput req/s</th><th>goodput output tok/s</th>
<th>SLO met</th></tr>
{% for st in s.stages if st.goodput %}<tr><td class="l">{{ st.name }}{% if st.warmup %} (not judged){% endif %}</td>
<td>{{ st.achieved_qps | fmt(2) }}</td><td>{{ st.goodput.requests_per_s | fmt(2) }}</td>
<td>{{ st.goodput.output_tokens_per_s | fmt(0) }}</td><td>{{ st.goodput.slo_attainment | percent(1) }}</td></tr>
{% endfor %}</table>
{% endif %}
{% for chart in charts %}<h2>{{ chart.title }}</h2>
{% if chart.image %}<figure><img src="{{ chart.image }}" alt="{{ chart.title }}"></figure>
{% else %}<p class="note">{{ chart.note }}</p>{% endif %}
{% endfor %}
<h2>Stages</h2>
<table><tr><th class="l">stage</th><th>target req/s</th><th>offered</th><th>achieved</th><th>ok</th><th>failed</th>
<th>unfinished</th><th>cancelled</th><th>not sent</th><th>delay p99 ms</th><th>TTFT p50 ms</th><th>TTFT p99 ms</th>
<th>E2E p99 ms</th>
<th>prompt tok p50</th><th>prompt tok p99</th><th>turns 1/2/3/4+ %</th></tr>
{% for st in s.stages %}<tr><td class="l">{{ st.name }}{% if st.warmup %} (not judged){% endif %}{% if st.shortfall
%} <b>(shortfall)</b>{% endif %}</td>
<td>{{ st.target_qps | fmt(2) }}</td><td>{{ st.offered_qps | fmt(2) }}</td><td>{{ st.achieved_qps | fmt(2) }}</td>
<td>{{ st.ok }}</td><td>{{ st.failed }}</td><td>{{ st.unfinished }}</td><td>{{ st.cancelled }}</td>
<td>{{ st.not_sent }}</td>
<td>{{ st.schedule_delay_p99_ms | fmt }}</td><td>{{ st.ttft_p50_ms | fmt }}</td><td>{{ st.ttft_p99_ms | fmt }}</td>
<td>{{ st.e2e_p99_ms | fmt }}</td><td>{{ st.prompt_tokens_p50 | fmt(0) }}</td>
<td>{{ st.prompt_tokens_p99 | fmt(0) }}</td><td>{{ st.turn_mix | turn_depths }}</td></tr>
{% endfor %}</table>
<h2>Failures</h2>
{% if failures %}<table><tr><th class="l">category</th><th>count</th>{% if failures[0].kv is defined
%}<th>KV at failure (max)</th><th>waiting (max)</th><th>/health not 200 or down</th>{% endif %}
<th class="l">example</th></tr>
{% for f in failures %}<tr{% if f.oom %} class="oom"{% endif %}>
<td class="l">{{ f.category }}</td><td>{{ f.count }}</td>
{% if f.kv is defined %}<td>{{ f.kv }}</td><td>{{ f.waiting }}</td><td>{{ f.unhealthy }}</td>{% endif %}
<td class="msg">{{ f.example }}</td></tr>{% endfor %}</table>
<p class="meta">OOM family (oom, engine_dead, server_down) in bold red.</p>
{% else %}<p class="note">No failures.</p>{% endif %}
</body></html>
""")


def render_html(finished: FinishedRun, summary: Summary, itl: RunItl) -> Path:
    """Write report.html of a run from its records, its summary and its ITL histograms (counted per
    chart window: chart_window_s)."""
    numeric = ["scheduled_at", "sent_at", "finished_at", "ttft_ms", "e2e_ms", "prompt_tokens", "output_tokens"]
    records = finished.records.frame
    records[numeric] = records[numeric].astype(float)  # None -> NaN, also in runs with no such values
    manifest = finished.manifest
    span = _span_s(manifest, summary.run.finished_at)
    window_s = _window_s(span)
    if itl.window_s != window_s:  # counted for other windows (a caller that did not use chart_window_s)
        itl = RunItl.count(finished.records, manifest, window_s)
    failures = finished.records.failures()
    run = Page(manifest, summary, records, failures, finished.server.frame, finished.server.gpus, span, window_s, itl)
    charts = []
    with drawing():
        for title, draw in CHARTS:
            drawn = draw(run)
            if drawn is None:
                continue
            if isinstance(drawn, str):
                charts.append(Chart(title, note=drawn))
            else:
                charts.append(Chart(title, image=svg_data_uri(drawn, run.manifest.run_id)))
    lat = run.summary.latency_ms
    html = TEMPLATE.render(
        start=page_start("run", run.summary.run.run_id, STYLE),
        s=run.summary,
        latency=lat.headline(),
        charts=charts,
        failures=_failure_rows(run),
        server_facts=server_facts(run.summary),
        worker_lines=[lost_line(w) for w in run.summary.workers if w.lost_at_s is not None]
        + [f"{worker_name(w)} sent nothing: {w.refused}" for w in run.summary.workers if w.refused],
        cancel_line=cut_line(run.summary),
        notes=notes,
    )
    path = finished.path / HTML_FILE
    path.write_text(html, encoding="utf-8")
    return path
