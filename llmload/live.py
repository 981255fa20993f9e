"""Live figures while a run goes: fed with every record on the process that writes them (a local
run, or the master of a distributed one, so the whole fleet), shown by llmload.locust.views (the
LLM tab of Locust's web UI, the console of a headless run) and served to Prometheus
(`--prometheus-port`). This module only collects; what people read is worded there.

Histograms keep bucket counts in numpy arrays and are exposed through a custom collector: a
request carries hundreds of inter-token gaps, and one vectorised count per request costs far
less than one `Histogram.observe` per gap. Percentiles in the LLM tab come from the raw values of
the most recent requests, kept in fixed-size rings, so memory stays flat over an hour-long run.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from llmload.models import ServerIdentity, Stage, Verdict
from llmload.observe.metrics import hit_rate
from llmload.observe.observer import ServerSample

# seconds; first-token and whole-request times span ms to minutes, gaps between tokens ms to seconds
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5.0)
RECENT_REQUESTS = 10_000  # the LLM tab's percentiles are over this many latest requests
RECENT_GAPS = 200_000
RECENT_GROUP_REQUESTS = 2_000  # a replica's or a model's percentiles: over this many of its latest requests
GROUP_COLUMNS = ("host", "model")  # the record fields the LLM tab breaks down by, where a run has several
DELAY_WINDOW_S = 10.0
RATE_WINDOW_S = 10.0  # the live rates: the last full window of this many seconds
# every metric llmload serves; the Grafana dashboard may use these and vLLM's/DCGM's, nothing else
HISTOGRAM_NAMES = (
    "llmload_ttft_seconds", "llmload_ttfo_seconds", "llmload_itl_seconds", "llmload_tpot_seconds",
    "llmload_e2e_seconds",
)  # fmt: skip
PER_REQUEST_LATENCIES = ("ttft", "ttfo", "tpot", "e2e")  # one value per request (ITL: its gaps)
METRIC_NAMES = (
    *HISTOGRAM_NAMES,
    "llmload_requests_total", "llmload_output_tokens_total",
    "llmload_target_qps", "llmload_offered_qps", "llmload_achieved_qps", "llmload_stage_index",
    "llmload_stage_percent", "llmload_schedule_delay_p99_seconds", "llmload_users", "llmload_users_busy",
    "llmload_prefix_cache_hit_rate", "llmload_load_generator_lag_seconds",
)  # fmt: skip


class _Ring:
    """The latest `size` values, in a preallocated float array."""

    def __init__(self, size: int) -> None:
        self._values = np.empty(size, dtype=np.float64)
        self._next = 0
        self._full = False

    def extend(self, values: np.ndarray) -> None:
        values = values[-len(self._values) :]
        end = self._next + len(values)
        if end <= len(self._values):
            self._values[self._next : end] = values
        else:
            split = len(self._values) - self._next
            self._values[self._next :] = values[:split]
            self._values[: end - len(self._values)] = values[split:]
        self._full = self._full or end >= len(self._values)
        self._next = end % len(self._values)

    @property
    def values(self) -> np.ndarray:
        return self._values if self._full else self._values[: self._next]


class _BucketHistogram:
    """A Prometheus histogram counted with numpy, one call per batch of observations."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # the last one is +Inf
        self.total = 0.0

    def observe(self, values: np.ndarray) -> None:
        if values.size:
            self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
            self.total += float(values.sum())

    def family(self) -> HistogramMetricFamily:
        cumulative = np.cumsum(self.counts)
        labels = [*(f"{b:g}" for b in self.bounds), "+Inf"]
        return HistogramMetricFamily(
            self.name,
            self.documentation,
            buckets=list(zip(labels, cumulative.tolist(), strict=True)),
            sum_value=self.total,
        )


class _Histograms(Collector):
    def __init__(self, histograms: Iterable[_BucketHistogram]) -> None:
        self._histograms = list(histograms)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        return (h.family() for h in self._histograms)


@dataclass
class GroupLive:
    """One replica's or one model's requests so far: its counts and its latest TTFT and TPOT."""

    ok: int = 0
    failed: int = 0
    ttft: _Ring = field(default_factory=lambda: _Ring(RECENT_GROUP_REQUESTS))
    tpot: _Ring = field(default_factory=lambda: _Ring(RECENT_GROUP_REQUESTS))


class LiveStats:
    """Every record of the run as it is written, folded into counters, rings and per-stage counts."""

    def __init__(
        self, stages: Sequence[Stage], plan_offsets: np.ndarray, started_at: float, server: ServerIdentity | None = None
    ) -> None:
        self.stages = list(stages)
        self.identity = server  # which server the run met (llmload/server)
        self.verdict: Verdict | None = None  # the soak verdict, once the run has ended with --verdict
        self.started_at = started_at
        self._plan = np.sort(plan_offsets)  # every planned request, seconds from the start
        self.registry = CollectorRegistry(auto_describe=True)
        self._latency = {
            "ttft": _BucketHistogram("llmload_ttft_seconds", "time to first token, from send", REQUEST_BUCKETS),
            "ttfo": _BucketHistogram(
                "llmload_ttfo_seconds", "time to first answer token after any reasoning, from send", REQUEST_BUCKETS
            ),
            "itl": _BucketHistogram("llmload_itl_seconds", "gap between output chunks", GAP_BUCKETS),
            "tpot": _BucketHistogram("llmload_tpot_seconds", "time per output token after the first", GAP_BUCKETS),
            "e2e": _BucketHistogram("llmload_e2e_seconds", "whole request, from send", REQUEST_BUCKETS),
        }
        self.registry.register(_Histograms(self._latency.values()))
        self._requests = Counter(
            "llmload_requests",
            "requests by status and failure category",
            ["status", "category"],
            registry=self.registry,
        )
        self._output_tokens = Counter("llmload_output_tokens", "output tokens of ok requests", registry=self.registry)

        def gauge(name: str, documentation: str) -> Gauge:
            return Gauge(name, documentation, registry=self.registry)

        window = f"the last {RATE_WINDOW_S:g} s"
        self._target = gauge("llmload_target_qps", f"target requests/s over {window} (the stages' targets)")
        self._offered = gauge("llmload_offered_qps", f"planned requests/s over {window}")
        self._achieved = gauge("llmload_achieved_qps", f"requests sent per second over {window}")
        self._stage_index = gauge("llmload_stage_index", "current stage, 0-based (the warm-up, if any, is 0)")
        self._stage_percent = gauge("llmload_stage_percent", "current stage's percent of the target")
        self._delay_p99 = gauge("llmload_schedule_delay_p99_seconds", f"p99 schedule delay, last {DELAY_WINDOW_S:g} s")
        self._users = gauge("llmload_users", "Locust users (request slots) across the fleet")
        self._busy = gauge("llmload_users_busy", "users with a request in flight across the fleet")
        self._prefix_hit_rate = gauge(
            "llmload_prefix_cache_hit_rate", "the server's prefix-cache hits / queries since the run started"
        )
        self._lag = gauge(
            "llmload_load_generator_lag_seconds", "how late the recorder's timer fired before the latest server sample"
        )
        self._recent = {name: _Ring(RECENT_GAPS if name == "itl" else RECENT_REQUESTS) for name in self._latency}
        self._delays: collections.deque[tuple[float, float]] = collections.deque()
        self._stage_scheduled: collections.Counter[str] = collections.Counter()
        self._stage_sent: collections.Counter[str] = collections.Counter()  # sent inside the stage's window
        self._recent_sends: list[float] = []  # send offsets of the last window or so
        self.sends_until = 0.0  # run offset up to which every process's sends have been added
        self.statuses: collections.Counter[str] = collections.Counter()
        self.notes: list[str] = []  # what happened to the fleet (a lost worker), in the LLM tab
        self.failures: collections.Counter[str] = collections.Counter()
        self.reasoned = False  # a successful request thought before answering: TTFO is worth showing
        self.server: ServerSample | None = None
        self.lag_max_ms = 0.0  # the longest the observer's timer fired late so far (ServerSample.client_lag_ms)
        self._prefix_base: tuple[float, float] | None = None  # the counters when the run first saw them
        self.groups: dict[str, dict[str, GroupLive]] = {column: {} for column in GROUP_COLUMNS}

    def see_server(self, sample: ServerSample | None) -> None:
        """The server's latest sample. The first one with prefix-cache counters is the base the live
        hit rate counts from (vLLM's counters run from the server's start); a restart re-bases it."""
        self.server = sample
        if sample is not None and sample.client_lag_ms is not None:
            self.lag_max_ms = max(self.lag_max_ms, sample.client_lag_ms)
            self._lag.set(sample.client_lag_ms / 1000)
        if sample is None or sample.prefix_cache_queries_total is None:
            return
        now = (sample.prefix_cache_hits_total or 0.0, sample.prefix_cache_queries_total)
        if self._prefix_base is None or now[1] < self._prefix_base[1]:
            self._prefix_base = now if self._prefix_base is None else (0.0, 0.0)
        rate = self.prefix_cache_hit_rate()
        self._prefix_hit_rate.set(math.nan if rate is None else rate)

    def prefix_cache_hit_rate(self) -> float | None:
        """Hits / queries of the server's prefix cache since the run started; None before any query."""
        sample, base = self.server, self._prefix_base
        if sample is None or base is None or sample.prefix_cache_queries_total is None:
            return None
        return hit_rate((sample.prefix_cache_hits_total or 0.0) - base[0], sample.prefix_cache_queries_total - base[1])

    def add(self, row: dict[str, Any]) -> None:
        """One record, as written to requests.jsonl."""
        status = row["status"]
        self.statuses[status] += 1
        judged_failure = status in ("failed", "unfinished")
        category = row["error_category"] or "" if judged_failure else ""
        self._requests.labels(status, category).inc()
        self._stage_scheduled[row["stage"]] += 1
        if judged_failure:
            self.failures[category] += 1
        self._add_to_groups(row, judged_failure)
        sent = row["sent_at"]
        if sent is not None:
            self._delays.append((sent, (row["schedule_delay_ms"] or 0.0) / 1000))
        if status != "ok":
            return
        self._output_tokens.inc(row["output_tokens"] or 0)
        self.reasoned = self.reasoned or bool(row["reasoning_tokens"])
        for name in PER_REQUEST_LATENCIES:
            if row[f"{name}_ms"] is not None:
                value = np.array([row[f"{name}_ms"] / 1000])
                self._latency[name].observe(value)
                self._recent[name].extend(value)
        gaps = np.asarray(row["itl_ms"], dtype=np.float64) / 1000
        self._latency["itl"].observe(gaps)
        self._recent["itl"].extend(gaps)

    def _add_to_groups(self, row: dict[str, Any], judged_failure: bool) -> None:
        for column, groups in self.groups.items():
            if row.get(column) is None:
                continue
            group = groups.setdefault(row[column], GroupLive())
            group.failed += judged_failure
            if row["status"] == "ok":
                group.ok += 1
                for name, ring in (("ttft", group.ttft), ("tpot", group.tpot)):
                    if row[f"{name}_ms"] is not None:
                        ring.extend(np.array([row[f"{name}_ms"]]))

    def _stage_at(self, offset_s: float) -> Stage | None:
        return next((s for s in self.stages if s.start_s <= offset_s < s.end_s), None)

    def note(self, line: str) -> None:
        self.notes.append(line)

    def add_sends(self, offsets: Iterable[float], until: float) -> None:
        """Requests sent (seconds from the run's start), counted when they leave, not when they end;
        `until`: every process's sends up to this offset are now in."""
        for offset in offsets:
            stage = self._stage_at(offset)
            if stage is not None:
                self._stage_sent[stage.name] += 1
            self._recent_sends.append(offset)
        self.sends_until = max(self.sends_until, until)
        horizon = self.sends_until - 2 * RATE_WINDOW_S
        if self._recent_sends and self._recent_sends[0] < horizon:
            self._recent_sends = [t for t in self._recent_sends if t >= horizon]

    def refresh(self, *, users: int, busy: int, now: float | None = None) -> None:
        """Set the gauges for the moment `now` (unix seconds)."""
        now = time.time() if now is None else now
        while self._delays and self._delays[0][0] < now - DELAY_WINDOW_S:
            self._delays.popleft()
        delays = [d for _, d in self._delays]
        self._delay_p99.set(float(np.percentile(delays, 99)) if delays else 0.0)
        self._users.set(users)
        self._busy.set(busy)
        stage = self.current_stage()
        self._stage_index.set(self.stages.index(stage))
        self._stage_percent.set(stage.percent)
        window = self.window_rates()
        self._target.set(window.target)
        self._offered.set(window.offered)
        self._achieved.set(window.achieved)

    def current_stage(self) -> Stage:
        """The stage the latest complete second of sends falls in."""
        return self._stage_at(self.sends_until) or (self.stages[0] if self.sends_until <= 0 else self.stages[-1])

    def _planned(self, start: float, end: float) -> int:
        return int(np.searchsorted(self._plan, end) - np.searchsorted(self._plan, start))

    def stage_rates(self, stage: Stage) -> Rates:
        """A stage's rates so far, over its own window as the report counts them (sent in the window
        / its seconds); final, and equal to the report's, once the stage has ended."""
        end = min(self.sends_until, stage.end_s)
        elapsed = end - stage.start_s
        if elapsed <= 0:
            return Rates(elapsed, stage.qps, 0.0, 0.0)
        offered = self._planned(stage.start_s, end) / elapsed
        return Rates(elapsed, stage.qps, offered, self._stage_sent[stage.name] / elapsed)

    def rate_window(self) -> tuple[float, float]:
        """The last full window (run offsets) ending where every send is known; once the plan has
        ended, its last window."""
        end = min(self.sends_until, self.stages[-1].end_s)
        return max(0.0, end - RATE_WINDOW_S), end

    def window_rates(self) -> Rates:
        """Target, offered and achieved over `rate_window` (a window across a stage boundary has the
        time-weighted target of both stages)."""
        start, end = self.rate_window()
        seconds = end - start
        if seconds <= 0:
            stage = self.current_stage()
            return Rates(0.0, stage.qps, 0.0, 0.0)
        overlap = [(min(end, s.end_s) - max(start, s.start_s), s.qps) for s in self.stages]
        target = sum(length * qps for length, qps in overlap if length > 0) / seconds
        sent = sum(1 for t in self._recent_sends if start <= t < end)
        return Rates(seconds, target, self._planned(start, end) / seconds, sent / seconds)

    def percentiles(self, name: str) -> tuple[float, float, float, int] | None:
        """p50, p95, p99 (ms) and count of a latency over the latest requests."""
        values = self._recent[name].values
        if not values.size:
            return None
        p50, p95, p99 = np.percentile(values, (50, 95, 99)) * 1000
        return float(p50), float(p95), float(p99), int(values.size)


@dataclass(frozen=True)
class Rates:
    """Request rates over `seconds`: the target, what the plan offered, what was sent."""

    seconds: float
    target: float
    offered: float
    achieved: float
