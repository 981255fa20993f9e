"""Watch the target during a run: /metrics and /health once a second, appended to server.jsonl.

A run over several replicas (`--host URL,URL`) scrapes every one each tick, at once: a sample's server
figures are then the fleet's (llmload.observe.scraper: summed, KV usage the fullest replica's, known
only when every replica gave it) and `replicas` holds each one's, in --host order.

A run's failures only make sense next to the server's state (KV cache full? queue growing?
engine dead?), so the observer keeps a time series a report can chart and a short in-memory
history the run can look up when a request fails. It runs as a greenlet in the Locust process
(gevent, geventhttpclient like llmload.client); a server that lacks metrics or stops answering
is recorded as such, never an error.

GPU memory and utilisation come with each sample when there is a source: an NVIDIA DCGM
exporter's /metrics (`--gpu-metrics URL`), else `nvidia-smi` when the target runs on this
machine. Without either, samples carry no GPUs and nothing else changes.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import gevent
import orjson
from pydantic import BaseModel, Field

from llmload.access import Access
from llmload.cancel import released
from llmload.models import ServerRelease
from llmload.observe.gpu import GpuReader, GpuReadError, GpuSample
from llmload.observe.host import HostMeter
from llmload.observe.metrics import VLLM
from llmload.observe.scraper import ReplicaSample, ReplicaScraper, Scrape, fleet
from llmload.server.kinds import ServerKind

log = logging.getLogger(__name__)

HISTORY_SAMPLES = 3600  # what state_at can look back over: an hour at the default interval
LAG_WARNING_MS = 250.0  # a timer this late: the process was held off the CPU (gevent's own jitter is a few ms)


class ServerSample(BaseModel):
    """One line of server.jsonl: the server's state at unix time `t`."""

    t: float
    health: int | None = Field(
        description="HTTP status of /health (the first replica's when several); None when the server did not answer"
    )
    kv_cache_usage: float | None = Field(
        default=None, description="0..1; the fullest engine's (and replica's) when several"
    )
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    spec_drafts_total: float | None = Field(default=None, description="speculative decoding: drafts proposed")
    spec_draft_tokens_total: float | None = Field(default=None, description="tokens drafted")
    spec_accepted_tokens_total: float | None = Field(default=None, description="drafted tokens the model accepted")
    spec_accepted_by_position: list[float] | None = Field(
        default=None, description="of them, those at each draft position (0 first): counters"
    )
    host_cpu_busy: float | None = Field(default=None, description="this machine's CPU in use since the last sample")
    host_cpu_steal: float | None = Field(default=None, description="of it, taken by the hypervisor, 0..1")
    host_cpu_run: float | None = Field(
        default=None, description="of it, the run's own: the load generator's processes and a target on this machine"
    )
    client_lag_ms: float | None = Field(
        default=None,
        description="how much later than asked this sample's timer fired: the recording process was off the CPU "
        "or its event loop busy, and timestamps it took meanwhile are late by up to as much (None: the first sample)",
    )
    gpus: list[GpuSample] = Field(default_factory=list, description="empty without a GPU source")
    missing: list[str] = Field(
        default_factory=list, description="metric names this sample could not read (nvidia-smi: its name)"
    )
    replicas: list[ReplicaSample] = Field(
        default_factory=list, description="a run over several replicas: each one's, in --host order; else empty"
    )


class Observer:
    """Scrape `hosts`' /health and /metrics (one URL, or the run's replicas, the first the primary), and
    `gpu`'s GPUs, every `interval_s` into `out_path` (JSON lines, flushed).

    `access` carries the key, headers and TLS trust of the run (gateways may guard /metrics). `server`:
    the kind of server watched (kinds.yaml): where its health and metrics are and what they are named.
    """

    def __init__(
        self,
        hosts: str | Sequence[str],
        out_path: Path,
        interval_s: float = 1.0,
        access: Access | None = None,
        gpu: GpuReader | None = None,
        *,
        server: ServerKind = VLLM,
    ) -> None:
        self.out_path = out_path
        self.interval_s = interval_s
        self.timeout_s = max(2.0, 2 * interval_s)
        self.scrapers = [
            ReplicaScraper(host, access or Access(), self.timeout_s, server)
            for host in ([hosts] if isinstance(hosts, str) else hosts)
        ]
        self.url = self.scrapers[0].url
        self.gpu = gpu
        self.host = HostMeter(self.url)
        self._history: deque[ServerSample] = deque(maxlen=HISTORY_SAMPLES)
        self.first: ServerSample | None = None  # the run's first sample: the server before the load
        self._noted: set[str] = set()
        self._file: IO[bytes] | None = None
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> Observer:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.out_path.open("ab")
        self._greenlet = gevent.spawn(self._loop)
        return self

    def stop(self) -> None:
        """Stop scraping (a scrape in flight is abandoned) and close the file."""
        self._stop_loop()
        if self._file is not None:
            self._file.close()
            self._file = None
        for scraper in self.scrapers:
            scraper.close()
        if self.gpu is not None:
            self.gpu.close()

    def _stop_loop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=self.timeout_s + 1)
            self._greenlet = None

    def latest(self) -> ServerSample | None:
        return self._history[-1] if self._history else None

    def state_at(self, t: float) -> ServerSample | None:
        """The last sample taken at or before unix time `t` (within the last HISTORY_SAMPLES)."""
        for sample in reversed(self._history):  # failures are looked up soon after: newest first
            if sample.t <= t:
                return sample
        return None

    def _loop(self) -> None:
        lag_ms: float | None = None
        while True:
            started = time.monotonic()
            self._record(self.scrape(client_lag_ms=lag_ms))
            # from this sample's start: a late wake-up (busy process) delays the series, never bunches it
            asked = max(0.0, started + self.interval_s - time.monotonic())
            slept_from = time.monotonic()
            gevent.sleep(asked)
            lag_ms = round(max(0.0, time.monotonic() - slept_from - asked) * 1000, 1)

    def release(self, limit_s: float, interval_s: float = 0.25) -> ServerRelease:
        """After the run's last request: samples until the server runs and queues nothing (and its KV usage
        is back to the run's first sample's), or `limit_s` passed (llmload.cancel). Over several replicas
        the fleet's figures: every replica must go idle."""
        self._stop_loop()  # the loop's samples would interleave with these
        before = self.first.kv_cache_usage if self.first is not None else None
        started = time.monotonic()
        while True:
            sample = self.scrape()
            self._record(sample)
            waited = time.monotonic() - started
            done = released(sample.running, sample.waiting, before, sample.kv_cache_usage)
            if done or sample.running is None or waited >= limit_s:
                break
            gevent.sleep(interval_s)
        return ServerRelease(
            released=None if sample.running is None else done, waited_s=round(waited, 2), running=sample.running,
            waiting=sample.waiting, kv_cache_usage_before=before, kv_cache_usage_after=sample.kv_cache_usage,
        )  # fmt: skip

    def _record(self, sample: ServerSample) -> None:
        if self.first is None:
            self.first = sample
        self._history.append(sample)
        assert self._file is not None
        self._file.write(orjson.dumps(sample.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE))
        self._file.flush()

    def scrape(self, client_lag_ms: float | None = None) -> ServerSample:
        """One sample now, every replica read at once; an unreachable server gives health None and no metrics."""
        t = time.time()
        source = self.gpu
        reading = gevent.spawn(self._read_gpus, source) if source is not None else None  # beside the server's
        try:
            scrapes = self._scrape_replicas()
            gpus: list[GpuSample] = reading.get() if reading is not None else []
        finally:
            if reading is not None:
                reading.kill(block=False)  # stopped mid-scrape: no read outlives the observer
        server = fleet(scrapes)
        missing = [*server.missing, *(source.names if source is not None and not gpus else ())]
        replicas = [s.replica(r.host) for r, s in zip(self.scrapers, scrapes, strict=True)] if len(scrapes) > 1 else []
        taken = {"t": t, "health": server.health, "client_lag_ms": client_lag_ms, "gpus": gpus, "missing": missing}
        return ServerSample.model_validate({**taken, **(server.values or {}), **self.host.read(), "replicas": replicas})

    def _scrape_replicas(self) -> list[Scrape]:
        """Every replica's scrape, taken at once (a slow one delays the sample by its own time, not the sum)."""
        if len(self.scrapers) == 1:
            return [self.scrapers[0].scrape()]
        reads = [gevent.spawn(scraper.scrape) for scraper in self.scrapers]
        try:
            gevent.joinall(reads, raise_error=True)
            return [read.value for read in reads]
        finally:
            gevent.killall(reads, block=False)  # stopped mid-scrape: no read outlives the observer

    def _read_gpus(self, source: GpuReader) -> list[GpuSample]:
        """This moment's GPUs; none when the source fails (said once, and again once it recovers)."""
        try:
            gpus = source.read(self.timeout_s)
        except GpuReadError as exc:
            self._note("gpu", f"no GPU metrics: {exc}")
            return []
        if "gpu" in self._noted:
            self._noted.discard("gpu")
            log.warning("llmload: GPU metrics read again from %s", source.url)
        return gpus

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning("llmload: %s", message)
