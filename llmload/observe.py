"""Watch the target during a run: /metrics and /health once a second, appended to server.jsonl.

A run's failures only make sense next to the server's state (KV cache full? queue growing?
engine dead?), so the observer keeps a time series a report can chart and a short in-memory
history the run can look up when a request fails. It runs as a greenlet in the Locust process
(gevent, geventhttpclient like llmload.client); a server that lacks metrics or stops answering
is recorded as such, never an error.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from http.client import HTTPException
from pathlib import Path
from typing import IO

import gevent
import orjson
import pandas as pd
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from llmload.models import ServerSummary

log = logging.getLogger(__name__)

SERVER_FILE = "server.jsonl"
HISTORY_SAMPLES = 3600  # what state_at can look back over: an hour at the default interval

# sample field -> Prometheus sample names, preferred first (vLLM renamed some across versions)
METRICS: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
}
_WANTED = frozenset(name for names in METRICS.values() for name in names)


class ServerSample(BaseModel):
    """One line of server.jsonl: the server's state at unix time `t`."""

    t: float
    health: int | None = Field(description="HTTP status of /health; None when the server did not answer")
    kv_cache_usage: float | None = Field(default=None, description="0..1; the fullest engine's when several")
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    missing: list[str] = Field(default_factory=list, description="metric names this sample could not read")


def parse_metrics(text: str) -> dict[str, float]:
    """The fields of METRICS found in a Prometheus text exposition.

    Values are summed over label sets (several models or engines), except KV usage, a fraction,
    where the fullest engine is the one that runs out.
    """
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _WANTED:
                found.setdefault(sample.name, []).append(float(sample.value))
    values: dict[str, float] = {}
    for field, names in METRICS.items():
        name = next((n for n in names if n in found), None)
        if name is not None:
            values[field] = max(found[name]) if field == "kv_cache_usage" else sum(found[name])
    return values


class Observer:
    """Scrape `base_url`'s /health and /metrics every `interval_s` into `out_path` (JSON lines, flushed).

    `api_key` goes out as a bearer token (gateways may guard /metrics) and is never written.
    """

    def __init__(self, base_url: str, out_path: Path, interval_s: float = 1.0, api_key: str | None = None) -> None:
        self.url = base_url.rstrip("/").removesuffix("/v1")  # the OpenAI base URL may be given
        url = URL(self.url)
        self._prefix = url.path.rstrip("/")
        self.out_path = out_path
        self.interval_s = interval_s
        self.timeout_s = max(2.0, 2 * interval_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = HTTPClient.from_url(
            url, concurrency=1, connection_timeout=self.timeout_s, network_timeout=self.timeout_s, headers=headers
        )
        self._history: deque[ServerSample] = deque(maxlen=HISTORY_SAMPLES)
        self._noted: set[str] = set()
        self._reachable = True
        self._file: IO[bytes] | None = None
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> Observer:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.out_path.open("ab")
        self._greenlet = gevent.spawn(self._loop)
        return self

    def stop(self) -> None:
        """Stop scraping (a scrape in flight is abandoned) and close the file."""
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=self.timeout_s + 1)
            self._greenlet = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self._http.close()

    def latest(self) -> ServerSample | None:
        return self._history[-1] if self._history else None

    def state_at(self, t: float) -> ServerSample | None:
        """The last sample taken at or before unix time `t` (within the last HISTORY_SAMPLES)."""
        for sample in reversed(self._history):  # failures are looked up soon after: newest first
            if sample.t <= t:
                return sample
        return None

    def _loop(self) -> None:
        while True:
            started = time.monotonic()
            self._record(self.scrape())
            # from this sample's start: a late wake-up (busy process) delays the series, never bunches it
            gevent.sleep(max(0.0, started + self.interval_s - time.monotonic()))

    def _record(self, sample: ServerSample) -> None:
        self._history.append(sample)
        assert self._file is not None
        self._file.write(orjson.dumps(sample.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE))
        self._file.flush()

    def scrape(self) -> ServerSample:
        """One sample now; an unreachable server gives health None and no metrics."""
        t = time.time()
        health, _ = self._get("/health")
        if health is None:
            self._set_reachable(False)
            return ServerSample(t=t, health=None, missing=self._missing({}))
        self._set_reachable(True)
        values = self._read_metrics()
        missing = self._missing(values or {})
        unnoted = [name for name in missing if name not in self._noted]
        if values is not None and unnoted:
            self._noted.update(unnoted)
            log.warning("llmload: %s/metrics lacks %s: those series stay empty", self.url, ", ".join(unnoted))
        return ServerSample(t=t, health=health, missing=missing, **(values or {}))

    def _read_metrics(self) -> dict[str, float] | None:
        """The METRICS fields /metrics gives; None when it gives no Prometheus text at all."""
        status, body = self._get("/metrics")
        if status != 200:
            self._note("status", f"{self.url}/metrics answered {status or 'nothing'}: no server metrics")
            return None
        try:
            return parse_metrics(body.decode(errors="replace"))
        except ValueError as exc:
            self._note("parse", f"{self.url}/metrics is not Prometheus text ({exc}): no server metrics")
            return None

    def _get(self, path: str) -> tuple[int | None, bytes]:
        try:
            with gevent.Timeout(self.timeout_s, TimeoutError):  # also a server that trickles its answer
                response = self._http.get(self._prefix + path)
                try:
                    return response.status_code, response.read()
                finally:
                    response.release()
        except (OSError, HTTPException):
            return None, b""

    @staticmethod
    def _missing(values: dict[str, float]) -> list[str]:
        return [names[0] for field, names in METRICS.items() if field not in values]

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning("llmload: %s", message)

    def _set_reachable(self, reachable: bool) -> None:
        if reachable != self._reachable:
            self._reachable = reachable
            state = "answers again" if reachable else "does not answer /health: samples have health null"
            log.warning("llmload: server %s %s", self.url, state)


def server_frame(path: Path) -> pd.DataFrame:
    """server.jsonl as a DataFrame sorted by `t` (health NaN = unreachable); empty when absent.

    A line that does not parse (the run killed mid-write) is a lost sample, not an error.
    """
    rows = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    columns = list(ServerSample.model_fields)
    frame = pd.DataFrame(rows, columns=columns)
    numeric = [c for c in columns if c != "missing"]
    frame[numeric] = frame[numeric].astype(float)
    return frame.sort_values("t", ignore_index=True)


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


def server_summary(path: Path) -> ServerSummary | None:
    """summary.json's `server` block; None when no sample read any metric (or no server.jsonl)."""
    frame = server_frame(path)
    if frame[list(METRICS)].isna().all().all():
        return None
    return ServerSummary(
        kv_cache_usage_max=series_max(frame.kv_cache_usage),
        preemptions=counter_increase(frame.preemptions_total),
        waiting_max=series_max(frame.waiting),
    )
