"""Prometheus text read: the samples a server (vLLM, the simulator, a DCGM exporter) exposes,
fetched over HTTP and reduced to the figures llmload keeps (prometheus_client's parser)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from http.client import HTTPException

import gevent
from geventhttpclient import HTTPClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from llmload.server.kinds import MetricField, PositionField, kind

VLLM = kind("vllm")  # what an observer reads when nobody says which server it watches


def samples(text: str, wanted: frozenset[str]) -> Iterator[Sample]:
    """The samples of a Prometheus text exposition whose names are wanted (prometheus_client's parser)."""
    for family in text_string_to_metric_families(text):
        yield from (sample for sample in family.samples if sample.name in wanted)


def metric_totals(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, summed over its labels (histogram buckets left
    out): what tests and benchmarks read of a target (`vllm:num_preemptions_total`, `..._sum`)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """metric_totals of `url`/metrics (vLLM or the simulator), fetched at once."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as response:
        return metric_totals(response.read().decode())


def parse_metrics(text: str, metrics: Mapping[MetricField, Sequence[str]] = VLLM.metrics) -> dict[str, float]:
    """The fields of `metrics` (field -> sample names, preferred first: a server kind's, kinds.yaml)
    found in a Prometheus text exposition.

    Values are summed over label sets (several models or engines), except KV usage, a fraction,
    where the fullest engine is the one that runs out.
    """
    found: dict[str, list[float]] = {}
    for sample in samples(text, frozenset(name for names in metrics.values() for name in names)):
        found.setdefault(sample.name, []).append(float(sample.value))
    values: dict[str, float] = {}
    for field, names in metrics.items():
        name = next((n for n in names if n in found), None)
        if name is not None:
            values[field] = max(found[name]) if field == "kv_cache_usage" else sum(found[name])
    return values


def parse_positions(text: str, by_position: Mapping[PositionField, Sequence[str]]) -> dict[str, list[float]]:
    """The vectors of `by_position` (field -> sample names, preferred first) in a Prometheus text
    exposition: each sample's value at the index its `position` label gives, summed over engines."""
    wanted = frozenset(name for names in by_position.values() for name in names)
    found: dict[str, dict[int, float]] = {}
    for sample in samples(text, wanted):
        if (position := sample.labels.get("position", "")).isdigit():
            at = found.setdefault(sample.name, {})
            at[int(position)] = at.get(int(position), 0.0) + float(sample.value)
    vectors: dict[str, list[float]] = {}
    for field, names in by_position.items():
        name = next((n for n in names if n in found), None)
        if name is not None:
            vectors[field] = [found[name].get(i, 0.0) for i in range(max(found[name]) + 1)]
    return vectors


def fetch(http: HTTPClient, path: str, timeout_s: float) -> tuple[int | None, bytes]:
    """GET `path`: (status, body), or (None, b"") when nothing answered within `timeout_s`."""
    try:
        with gevent.Timeout(timeout_s, TimeoutError):  # also a server that trickles its answer
            response = http.get(path)
            try:
                return response.status_code, response.read()
            finally:
                response.release()
    except (OSError, HTTPException):
        return None, b""


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """Prefix-cache hits / queries (both in tokens); None when nothing was queried."""
    return None if hits is None or not queries else hits / queries
