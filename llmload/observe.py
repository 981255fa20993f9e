"""Watch the target during a run: /metrics and /health once a second, appended to server.jsonl.

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

import contextlib
import ipaddress
import logging
import math
import shutil
import time
import urllib.request
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import gevent
import orjson
import pandas as pd
import psutil
from gevent import subprocess
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pydantic import BaseModel, Field

from llmload.models import GpuSummary, ServerSummary, Strict
from llmload.servers.kinds import METRIC_FIELDS, MetricField, ServerKind, kind

log = logging.getLogger(__name__)

HISTORY_SAMPLES = 3600  # what state_at can look back over: an hour at the default interval

VLLM = kind("vllm")  # what an observer reads when nobody says which server it watches
# NVIDIA DCGM exporter fields (default counters), one series per GPU labelled `gpu`: MiB, MiB, %
DCGM_USED, DCGM_FREE, DCGM_UTIL = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"
DCGM_FIELDS = (DCGM_USED, DCGM_FREE, DCGM_UTIL)
NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_QUERY = ("--query-gpu=index,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits")
GPU_SOURCES = frozenset({*DCGM_FIELDS, NVIDIA_SMI})  # what `missing` names when a GPU source gave nothing


class GpuSample(Strict):
    """One GPU in one sample."""

    gpu: str = Field(description="index (DCGM's `gpu` label; a MIG instance as `0/13`)")
    memory_used_mib: float | None = None
    memory_total_mib: float | None = Field(default=None, description="DCGM: used + free")
    utilization_percent: float | None = None


LAG_WARNING_MS = 250.0  # a timer this late: the process was held off the CPU (gevent's own jitter is a few ms)


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


def _samples(text: str, wanted: frozenset[str]) -> Iterator[Sample]:
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
    for sample in _samples(text, frozenset(name for names in metrics.values() for name in names)):
        found.setdefault(sample.name, []).append(float(sample.value))
    values: dict[str, float] = {}
    for field, names in metrics.items():
        name = next((n for n in names if n in found), None)
        if name is not None:
            values[field] = max(found[name]) if field == "kv_cache_usage" else sum(found[name])
    return values


def parse_dcgm(text: str) -> list[GpuSample]:
    """Each GPU of a DCGM exporter's exposition, in its order; total memory is used + free."""
    fields: dict[str, dict[str, float]] = {}
    for sample in _samples(text, frozenset(DCGM_FIELDS)):
        gpu = sample.labels.get("gpu", "")
        if "GPU_I_ID" in sample.labels:  # a MIG instance: its own memory, not the whole GPU's
            gpu += f"/{sample.labels['GPU_I_ID']}"
        fields.setdefault(gpu, {})[sample.name] = float(sample.value)
    return [
        GpuSample(
            gpu=gpu,
            memory_used_mib=f.get(DCGM_USED),
            memory_total_mib=f[DCGM_USED] + f[DCGM_FREE] if DCGM_USED in f and DCGM_FREE in f else None,
            utilization_percent=f.get(DCGM_UTIL),
        )
        for gpu, f in fields.items()
    ]


def _number(text: str) -> float | None:
    """A CSV cell of nvidia-smi: `[N/A]` or `[Not Supported]` is None."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi(text: str) -> list[GpuSample]:
    """`nvidia-smi NVIDIA_SMI_QUERY` output: one GPU a line, index, MiB used, MiB total, % utilisation."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 4:
            raise ValueError(f"not index, memory.used, memory.total, utilization.gpu: {line!r}")
        gpus.append(
            GpuSample(
                gpu=cells[0],
                memory_used_mib=_number(cells[1]),
                memory_total_mib=_number(cells[2]),
                utilization_percent=_number(cells[3]),
            )
        )
    return gpus


class GpuReadError(Exception):
    """A GPU source gave no GPUs this time; the message says why."""


def _fetch(http: HTTPClient, path: str, timeout_s: float) -> tuple[int | None, bytes]:
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


class DcgmReader:
    """GPUs from an NVIDIA DCGM exporter's /metrics."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.names = list(DCGM_FIELDS)
        parsed = URL(url)
        self._path = parsed.request_uri
        self._http = HTTPClient.from_url(parsed, concurrency=1)

    def read(self, timeout_s: float) -> list[GpuSample]:
        status, body = _fetch(self._http, self._path, timeout_s)
        if status != 200:
            raise GpuReadError(f"the DCGM exporter at {self.url} answered {status or 'nothing'}")
        try:
            gpus = parse_dcgm(body.decode(errors="replace"))
        except ValueError as exc:
            raise GpuReadError(f"{self.url} is not Prometheus text ({exc})") from None
        if not gpus:
            raise GpuReadError(f"{self.url} serves none of {', '.join(DCGM_FIELDS)}")
        return gpus

    def close(self) -> None:
        self._http.close()


class NvidiaSmiReader:
    """GPUs of this machine from `nvidia-smi --query-gpu` (its CSV)."""

    def __init__(self, executable: str) -> None:
        self.url = executable
        self.names = [NVIDIA_SMI]

    def read(self, timeout_s: float) -> list[GpuSample]:
        try:
            done = subprocess.run(
                [self.url, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuReadError(f"{NVIDIA_SMI} did not run ({exc})") from None
        if done.returncode != 0:
            first = (done.stderr or done.stdout).strip().splitlines()[:1]
            raise GpuReadError(f"{NVIDIA_SMI} exited {done.returncode}: {first[0] if first else 'no message'}")
        try:
            gpus = parse_nvidia_smi(done.stdout)
        except ValueError as exc:
            raise GpuReadError(f"{NVIDIA_SMI}: {exc}") from None
        if not gpus:
            raise GpuReadError(f"{NVIDIA_SMI} lists no GPU")
        return gpus

    def close(self) -> None:
        """Nothing held between reads."""


GpuReader = DcgmReader | NvidiaSmiReader


def is_loopback(url: str) -> bool:
    """Whether `url` names this machine (localhost or a loopback address)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gpu_reader(gpu_metrics: str | None, target: str) -> GpuReader | None:
    """The run's GPU source: the DCGM exporter at `gpu_metrics`; else nvidia-smi, when it is on the
    PATH and the target runs on this machine (a GPU here would be another's otherwise); else none."""
    if gpu_metrics:
        return DcgmReader(gpu_metrics)
    executable = shutil.which(NVIDIA_SMI)
    if executable is not None and is_loopback(target):
        return NvidiaSmiReader(executable)
    return None


_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


class HostMeter:
    """This machine's CPU between two readings: how much was in use, how much the hypervisor took
    (steal), and how much the run's own processes used: this load generator's process tree and,
    when the target listens on this machine, the target's. The rest is other work: a neighbour
    that slows the client and a local target alike, which the verdict's drift check leaves out."""

    def __init__(self, target_url: str) -> None:
        url = URL(target_url)
        self._port = url.port if url.host and url.host.startswith(_LOOPBACK) else None
        self._target: psutil.Process | None = None
        self._last = (psutil.cpu_times(), self._run_cpu())

    def _find_target(self) -> None:
        """The process listening on the target's loopback port (root may be needed to see it)."""
        if self._port is None or self._target is not None:
            return
        with contextlib.suppress(psutil.Error, OSError):
            for conn in psutil.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self._port and conn.pid:
                    self._target = psutil.Process(conn.pid)
                    return

    def _run_cpu(self) -> float:
        """CPU seconds the run's processes have used (user + system), children included."""
        roots = [psutil.Process()] + ([self._target] if self._target is not None else [])
        seen: set[int] = set()
        total = 0.0
        for root in roots:
            with contextlib.suppress(psutil.Error):
                for proc in [root, *root.children(recursive=True)]:
                    if proc.pid not in seen:
                        seen.add(proc.pid)
                        with contextlib.suppress(psutil.Error):
                            times = proc.cpu_times()
                            total += times.user + times.system
        return total

    def read(self) -> dict[str, float]:
        """host_cpu_busy, host_cpu_steal and host_cpu_run since the last reading (fractions of all cores)."""
        had_target = self._target is not None
        self._find_target()
        now, run = psutil.cpu_times(), self._run_cpu()
        then, run_then = self._last
        self._last = (now, run)
        total = sum(now) - sum(then)
        if total <= 0 or (not had_target and self._target is not None):
            return {}  # no time passed, or the target just joined the tally: next time
        idle = (now.idle - then.idle) + (getattr(now, "iowait", 0.0) - getattr(then, "iowait", 0.0))
        steal = getattr(now, "steal", 0.0) - getattr(then, "steal", 0.0)
        return {
            "host_cpu_busy": min(1.0, max(0.0, (total - idle - steal) / total)),
            "host_cpu_steal": max(0.0, steal / total),
            "host_cpu_run": min(1.0, max(0.0, (run - run_then) / total)),
        }


class Observer:
    """Scrape `base_url`'s /health and /metrics, and `gpu`'s GPUs, every `interval_s` into `out_path`
    (JSON lines, flushed).

    `api_key` goes out as a bearer token (gateways may guard /metrics) and is never written. `server`:
    the kind of server watched (kinds.yaml): where its health and metrics are and what they are named.
    """

    def __init__(
        self,
        base_url: str,
        out_path: Path,
        interval_s: float = 1.0,
        api_key: str | None = None,
        gpu: GpuReader | None = None,
        *,
        server: ServerKind = VLLM,
    ) -> None:
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
        self.gpu = gpu
        self.server = server
        self.host = HostMeter(self.url)
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
        if self.gpu is not None:
            self.gpu.close()

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

    def _record(self, sample: ServerSample) -> None:
        self._history.append(sample)
        assert self._file is not None
        self._file.write(orjson.dumps(sample.model_dump(mode="json"), option=orjson.OPT_APPEND_NEWLINE))
        self._file.flush()

    def scrape(self, client_lag_ms: float | None = None) -> ServerSample:
        """One sample now; an unreachable server gives health None and no metrics."""
        t = time.time()
        source = self.gpu
        reading = gevent.spawn(self._read_gpus, source) if source is not None else None  # beside the server's
        try:
            health, values, missing = self._read_server()
            gpus: list[GpuSample] = reading.get() if reading is not None else []
        finally:
            if reading is not None:
                reading.kill(block=False)  # stopped mid-scrape: no read outlives the observer
        if source is not None and not gpus:
            missing.extend(source.names)
        return ServerSample(
            t=t, health=health, client_lag_ms=client_lag_ms, gpus=gpus, missing=missing, **(values or {}),
            **self.host.read(),
        )  # fmt: skip

    def _read_server(self) -> tuple[int | None, dict[str, float] | None, list[str]]:
        """Health's status, the server's metrics (None when unreachable or it exports none) and those missing."""
        health, _ = self._get(self.server.health_path)
        self._set_reachable(health is not None)
        if not self.server.metrics_path or not self.server.metrics:
            self._note("none", f"{self.server.label} exports no metrics llmload reads: server.jsonl holds its health")
            return health, None, []
        values = self._read_metrics(self.server.metrics_path) if health is not None else None
        missing = self._missing(values or {})
        unnoted = [name for name in missing if name not in self._noted]
        if values is not None and unnoted:
            self._noted.update(unnoted)
            log.warning("llmload: %s/metrics lacks %s: those series stay empty", self.url, ", ".join(unnoted))
        return health, values, missing

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

    def _read_metrics(self, path: str) -> dict[str, float] | None:
        """The server's metrics on `path`; None when it gives no Prometheus text at all."""
        status, body = self._get(path)
        where = f"{self.url}{path}"
        if status != 200:
            note = f" ({self.server.metrics_note})" if self.server.metrics_note else ""
            self._note("status", f"{where} answered {status or 'nothing'}: no server metrics{note}")
            return None
        try:
            return parse_metrics(body.decode(errors="replace"), self.server.metrics)
        except ValueError as exc:
            self._note("parse", f"{where} is not Prometheus text ({exc}): no server metrics")
            return None

    def _get(self, path: str) -> tuple[int | None, bytes]:
        return _fetch(self._http, self._prefix + path, self.timeout_s)

    def _missing(self, values: dict[str, float]) -> list[str]:
        return [names[0] for field, names in self.server.metrics.items() if field not in values and names]

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning("llmload: %s", message)

    def _set_reachable(self, reachable: bool) -> None:
        if reachable != self._reachable:
            self._reachable = reachable
            state = "answers again" if reachable else "does not answer /health: samples have health null"
            log.warning("llmload: server %s %s", self.url, state)


def _server_lines(path: Path) -> list[dict[str, Any]]:
    """server.jsonl's samples; a line that does not parse (the run killed mid-write) is a lost sample."""
    rows = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _gpu_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    gpus = [{"t": row.get("t"), **gpu} for row in rows for gpu in row.get("gpus") or ()]
    frame = pd.DataFrame(gpus, columns=["t", *GpuSample.model_fields])
    numeric = [c for c in frame.columns if c != "gpu"]
    frame[numeric] = frame[numeric].astype(float)
    frame["gpu"] = frame.gpu.astype(str)
    frame["memory_used_fraction"] = frame.memory_used_mib / frame.memory_total_mib.where(frame.memory_total_mib > 0)
    return frame.sort_values("t", kind="stable", ignore_index=True)


def _server_frame(rows: list[dict[str, Any]], gpus: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in ServerSample.model_fields if c != "gpus"]
    frame = pd.DataFrame(rows, columns=columns)
    numeric = [c for c in columns if c != "missing"]
    frame[numeric] = frame[numeric].astype(float)
    frame["gpu_memory_usage"] = frame.t.map(gpus.groupby("t").memory_used_fraction.max()).astype(float)
    return frame.sort_values("t", ignore_index=True)


@dataclass(frozen=True)
class ServerSamples:
    """server.jsonl read once: `frame` one row per sample sorted by `t` (health NaN = unreachable;
    `gpu_memory_usage` the fullest GPU's memory used / total, NaN without GPU data) and `gpus` one
    row per GPU per sample (t, gpu, memory_used_mib, memory_total_mib, utilization_percent,
    memory_used_fraction); both empty when the run has no server.jsonl."""

    frame: pd.DataFrame
    gpus: pd.DataFrame


def read_server(path: Path) -> ServerSamples:
    rows = _server_lines(path)
    gpus = _gpu_frame(rows)
    return ServerSamples(_server_frame(rows, gpus), gpus)


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


def _gpu_summaries(gpus: pd.DataFrame) -> list[GpuSummary]:
    return [
        GpuSummary(
            gpu=str(gpu),
            memory_used_max_mib=series_max(rows.memory_used_mib),
            memory_total_mib=series_max(rows.memory_total_mib),
            memory_usage_max=series_max(rows.memory_used_fraction),
            utilization_mean_percent=None if rows.utilization_percent.isna().all() else rows.utilization_percent.mean(),
            utilization_max_percent=series_max(rows.utilization_percent),
        )
        for gpu, rows in gpus.groupby("gpu", sort=False)
    ]


def window_increase(frame: pd.DataFrame, column: str, start: float) -> float | None:
    """How much a counter grew from `start` (unix seconds) to the last sample: from the last sample
    at or before `start` (the first after it when there is none), never from the server's start."""
    seen = frame.loc[frame[column].notna(), ["t", column]]
    before = seen.t[seen.t <= start]
    return counter_increase(seen.loc[seen.t >= (before.iloc[-1] if len(before) else start), column])


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """Prefix-cache hits / queries (both in tokens); None when nothing was queried."""
    return None if hits is None or not queries else hits / queries


def server_summary(samples: ServerSamples, judged_from: float = -math.inf) -> ServerSummary | None:
    """summary.json's `server` block; None when no sample read any metric or GPU (or no server.jsonl).
    The prefix-cache figures count from `judged_from` (the first judged stage's start)."""
    frame, gpus = samples.frame, samples.gpus
    if frame[list(METRIC_FIELDS)].isna().all().all() and gpus.empty:
        return None
    hits = window_increase(frame, "prefix_cache_hits_total", judged_from)
    queries = window_increase(frame, "prefix_cache_queries_total", judged_from)
    return ServerSummary(
        kv_cache_usage_max=series_max(frame.kv_cache_usage),
        preemptions=counter_increase(frame.preemptions_total),
        prefix_cache_hit_rate=hit_rate(hits, queries),
        prefix_cache_queries=queries,
        waiting_max=series_max(frame.waiting),
        gpu_memory_usage_max=series_max(gpus.memory_used_fraction),
        gpus=_gpu_summaries(gpus),
    )
