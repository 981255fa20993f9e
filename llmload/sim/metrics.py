"""`/metrics` with vLLM 0.32's metric names, labels and histogram buckets; and a scraper for them.

The engine updates plain counters and bucket arrays (a few hundred nanoseconds per token, where a
prometheus_client Histogram takes microseconds and a lock); a custom collector turns them into
metric families only when /metrics is scraped, and prometheus_client writes the exposition.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

# vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# vLLM's FinishReason strings: every one is exported, at 0 until seen.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class Histogram:
    """Bucket counts and a sum; `observe(v, n)` records n equal values at once (fixed-pacing ITLs)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.count += n
        self.sum += value * n

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last, as HistogramMetricFamily takes them."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class EngineMetrics:
    """What vLLM's PrometheusStatLogger exports, kept as plain numbers by the simulator."""

    def __init__(self, model_name: str) -> None:
        self.labels = {"model_name": model_name, "engine": "0"}
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.success: Counter[str] = Counter({reason: 0 for reason in FINISH_REASONS})
        self.ttft = Histogram(TIME_TO_FIRST_TOKEN_BUCKETS)
        self.itl = Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.cache_config: dict[str, str] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        if self.cache_config:
            info = GaugeMetricFamily(
                "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=[*self.cache_config]
            )
            info.add_metric(list(self.cache_config.values()), 1.0)
            yield info
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", self.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage),
        )
        counters = (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.prefix_cache_hits,
            ),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", self.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
        )
        for family_type, table in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
            for name, doc, value in table:
                metric = family_type(name, doc, labels=names)
                metric.add_metric(values, value)
                yield metric
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*names, "finished_reason"]
        )
        for reason, count in self.success.items():
            success.add_metric([*values, reason], count)
        yield success
        for name, doc, histogram in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                self.queue_time,
            ),
        ):
            family = HistogramMetricFamily(name, doc, labels=names)
            family.add_metric(values, histogram.buckets(), histogram.sum)
            yield family

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
