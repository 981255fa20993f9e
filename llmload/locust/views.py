"""Where people watch a run live: an LLM tab in Locust's web UI, the console lines of a headless
run, and a Prometheus endpoint. All show the current run's `LiveStats` (llmload.live), which only
collects; the tab and the endpoint outlive a run: the web UI may start another."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import orjson
from flask import Response, request
from locust.web import WebUI
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric

from llmload.format import percent
from llmload.live import LiveStats, Rates
from llmload.models import Stage
from llmload.observe.observer import LAG_WARNING_MS

LLM_TAB = {"title": "LLM", "key": "llm"}
LLM_TABLE = {
    "key": "llm",
    "structure": [
        {"key": "what", "title": "What"},
        {"key": "value", "title": "Value"},
        {"key": "p50", "title": "p50"},
        {"key": "p95", "title": "p95"},
        {"key": "p99", "title": "p99"},
    ],
}
CurrentLive = Callable[[], LiveStats | None]  # the running (or last) run's live statistics, if any


class _LiveRegistry(CollectorRegistry):
    def __init__(self, current: CurrentLive) -> None:
        super().__init__(auto_describe=False)
        self._current = current

    def collect(self) -> Iterator[Metric]:
        live = self._current()
        if live is not None:
            yield from live.registry.collect()


def serve_prometheus(port: int, current: CurrentLive) -> None:
    """The live metrics on :port/metrics (OSError when the port is taken)."""
    start_http_server(port, addr="0.0.0.0", registry=_LiveRegistry(current))


def add_llm_tab(web_ui: WebUI, current: CurrentLive) -> None:
    """The LLM tab: its table rows ride along with the UI's stats polling."""
    web_ui.template_args["extended_tabs"] = [LLM_TAB]
    web_ui.template_args["extended_tables"] = [LLM_TABLE]
    assert web_ui.app is not None

    @web_ui.app.after_request
    def _with_llm_rows(response: Response) -> Response:
        live = current()
        if request.path == "/stats/requests" and response.is_json and live is not None:
            data = response.get_json()
            data["extended_stats"] = [{"key": LLM_TAB["key"], "data": tab_rows(live)}]
            response.set_data(orjson.dumps(data))
        return response


def rates_text(rates: Rates, *, target: bool = True) -> str:
    """Rates in the words of the report, so a live figure and the report's read alike."""
    if not rates.target and not rates.offered:  # a closed loop (--sessions-in-flight) plans no rate
        return f"closed loop · achieved {rates.achieved:.2f} req/s"
    head = f"target {rates.target:.2f} · " if target else ""
    return f"{head}offered {rates.offered:.2f} · achieved {rates.achieved:.2f} req/s"


def shown_latencies(live: LiveStats, names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` less TTFO until a request reasoned: without reasoning TTFO is TTFT again."""
    return tuple(name for name in names if name != "ttfo" or live.reasoned)


def tab_rows(live: LiveStats) -> list[dict[str, str]]:
    """The LLM tab of Locust's web UI, in the flow's order: TTFT, TTFO (once a request reasoned), ITL,
    TPOT, E2E, the stages in run order (warm-up first), requests, failures, the server."""
    rows = []
    if live.verdict is not None:
        decisive = [r for r in live.verdict.reasons if r.startswith(live.verdict.label)] or live.verdict.reasons
        rows.append({"name": f"verdict: {live.verdict.label}", "value": decisive[0] if decisive else ""})
    for name in shown_latencies(live, ("ttft", "ttfo", "itl", "tpot", "e2e")):
        p = live.percentiles(name)
        unit = "gaps" if name == "itl" else "requests"
        cells = (f"{v:,.1f}" for v in p[:3]) if p else ("–",) * 3
        rows.append(dict(zip(("p50", "p95", "p99"), cells, strict=True)) | {
            "name": f"{name.upper()} ms",
            "value": f"latest {p[3]:,} {unit}" if p else "no successful request yet",
        })  # fmt: skip
    current = live.current_stage()
    for stage in live.stages:
        if stage.start_s > live.sends_until:
            break
        label = f"stage {stage.name}" + (" (warm-up, not judged)" if stage.warmup else "")
        so_far = live.stage_rates(stage)
        if stage is not current or live.sends_until >= stage.end_s:
            rows.append({"name": label, "value": f"{rates_text(so_far)} (final)"})
            continue
        last = live.window_rates()
        rows.append({"name": label, "value": f"last {last.seconds:.0f} s: {rates_text(last)}; "
                     f"stage so far ({so_far.seconds:.0f} s): {rates_text(so_far, target=False)}"})  # fmt: skip
    counts = ", ".join(f"{k} {v:,}" for k, v in sorted(live.statuses.items()))
    rows.append({"name": "requests", "value": counts or "none yet"})
    rows += [{"name": f"failed: {k}", "value": f"{v:,}"} for k, v in live.failures.most_common()]
    rows += [{"name": "workers", "value": note} for note in live.notes]
    rows += _group_rows(live)
    if live.identity is not None:
        rows.append({"name": "server", "value": f"{live.identity.name} (told by {live.identity.evidence})"})
    if live.server is not None:
        kv, waiting = live.server.kv_cache_usage, live.server.waiting
        rows.append({"name": "server KV-cache usage", "value": "–" if kv is None else f"{kv:.0%}"})
        rows.append({"name": "server waiting requests", "value": "–" if waiting is None else f"{waiting:g}"})
        rows.append({"name": "server prefix-cache hit rate", "value": f"{percent(live.prefix_cache_hit_rate())}"
                     " since the run started"})  # fmt: skip
        rows.append({"name": "load generator stalls", "value": stall_text(live)})
    # Locust's table sorts rows by their `name`: the row's place, so they read in the flow's order
    return [
        {"p50": "", "p95": "", "p99": "", **row, "name": f"{place:03d}", "what": row["name"]}
        for place, row in enumerate(rows)
    ]


def _group_rows(live: LiveStats) -> list[dict[str, str]]:
    """Each replica and each model, where the run has several: TTFT percentiles, counts and TPOT p50."""
    rows = []
    for column, label in (("host", "replica"), ("model", "model")):
        groups = live.groups[column]
        if len(groups) < 2:
            continue
        for name, group in groups.items():
            ttft, tpot = group.ttft.values, group.tpot.values
            cells = (f"{v:,.1f}" for v in np.percentile(ttft, (50, 95, 99))) if ttft.size else ("–",) * 3
            tpot_text = f"; TPOT p50 {np.median(tpot):,.1f} ms" if tpot.size else ""
            rows.append(dict(zip(("p50", "p95", "p99"), cells, strict=True)) | {
                "name": f"{label} {name}: TTFT ms", "value": f"ok {group.ok:,}, failed {group.failed:,}{tpot_text}",
            })  # fmt: skip
    return rows


def window_label(stages: Sequence[Stage], start: float, end: float) -> str:
    """The stage a rate window covers, or the first and last when it straddles a boundary: a line
    printed just after a boundary still holds the seconds before it. An empty window (nothing sent
    yet) is the first stage's."""
    covered = [s for s in stages if s.start_s < end and s.end_s > start] or list(stages[:1])
    if len(covered) == 1:
        return f"stage {covered[0].name}"
    return f"stages {covered[0].name}→{covered[-1].name}"


def console_line(live: LiveStats) -> str:
    """One line for the console of a headless run: the last window, labelled by the stages it covers."""
    window = live.window_rates()
    parts = [f"{window_label(live.stages, *live.rate_window())}, last {window.seconds:.0f} s: {rates_text(window)}"]
    for name in shown_latencies(live, ("ttft", "ttfo", "itl", "e2e")):
        p = live.percentiles(name)
        if p is not None:
            parts.append(f"{name.upper()} p50 {p[0]:,.0f} ms p99 {p[2]:,.0f} ms")
    parts.append(f"{live.statuses['failed']} failed")
    if live.statuses["unfinished"]:
        parts.append(f"{live.statuses['unfinished']} unfinished")
    if live.lag_max_ms > LAG_WARNING_MS:
        parts.append(f"load generator {stall_text(live)}")
    return "; ".join(parts)


def stall_text(live: LiveStats) -> str:
    """How late the observer's timer fired: the longest so far, with the report's warning past its limit."""
    latest = live.server.client_lag_ms if live.server is not None else None
    text = f"timer late by {0.0 if latest is None else latest:,.0f} ms now, {live.lag_max_ms:,.0f} ms at most"
    if live.lag_max_ms > LAG_WARNING_MS:
        text += f" (> {LAG_WARNING_MS:.0f} ms: latencies measured then include the stall)"
    return text


def ended_stage_line(live: LiveStats, stage: Stage) -> str:
    """The console's line for a stage that has just ended: its final rates, as the report's."""
    return f"stage {stage.name} ended: {rates_text(live.stage_rates(stage))}"
