"""One replica's /health and /metrics, and the fleet's figures from every replica's (llmload.observe.observer).

Each replica has its own HTTP client and its own notes (said once per URL), so a replica that stops
answering or lacks a metric is named. The fleet's figures are reduced over replicas as parse_metrics
reduces them over engines: counts and counters summed, KV usage the fullest's (the one that runs out
first). A fleet figure is known only when every replica gave it: a sum over the replicas that happened
to answer would make a counter fall and rise again (read as a restart) and a gauge look lighter than it is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from geventhttpclient.url import URL
from pydantic import BaseModel, Field

from llmload.access import Access
from llmload.observe.metrics import fetch, parse_metrics, parse_positions
from llmload.server.kinds import CONDITIONAL_FIELDS, ServerKind

log = logging.getLogger(__name__)

Readings = dict[str, float | list[float]]  # a scrape's metrics by server.jsonl field
FULLEST = frozenset({"kv_cache_usage"})  # fractions: the fleet's is its fullest replica's, never a sum


class ReplicaSample(BaseModel):
    """One replica's part of a server.jsonl line, when the run spreads over several."""

    host: str = Field(description="the replica as given to --host")
    health: int | None = Field(description="HTTP status of its /health; None when it did not answer")
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None


@dataclass
class Scrape:
    """What one replica answered: /health's status, its metrics (None: unreachable or none exported), those missing."""

    health: int | None
    values: Readings | None
    missing: list[str] = field(default_factory=list)

    def replica(self, host: str) -> ReplicaSample:
        return ReplicaSample.model_validate({**(self.values or {}), "host": host, "health": self.health})


class ReplicaScraper:
    """`host`'s /health and /metrics, with its own client built from the run's `access`."""

    def __init__(self, host: str, access: Access, timeout_s: float, server: ServerKind) -> None:
        self.host = host
        self.url = host.rstrip("/").removesuffix("/v1")  # the OpenAI base URL may be given
        url = URL(self.url)
        self._prefix = url.path.rstrip("/")
        self.timeout_s = timeout_s
        self.server = server
        self._http = access.http_client(url, concurrency=1, connection_timeout=timeout_s, network_timeout=timeout_s)
        self._noted: set[str] = set()
        self._reachable = True

    def close(self) -> None:
        self._http.close()

    def scrape(self) -> Scrape:
        """Health's status, the server's metrics and the names of those missing."""
        health, _ = self._get(self.server.health_path)
        self._set_reachable(health is not None)
        if not self.server.metrics_path or not self.server.metrics:
            self._note("none", f"{self.server.label} exports no metrics llmload reads: server.jsonl holds its health")
            return Scrape(health, None)
        values = self._read_metrics(self.server.metrics_path) if health is not None else None
        missing = self._missing(values or {})
        unnoted = [name for name in missing if name not in self._noted]
        if values is not None and unnoted:
            self._noted.update(unnoted)
            log.warning("llmload: %s/metrics lacks %s: those series stay empty", self.url, ", ".join(unnoted))
        return Scrape(health, values, missing)

    def _read_metrics(self, path: str) -> Readings | None:
        """The server's metrics on `path`; None when it gives no Prometheus text at all."""
        status, body = self._get(path)
        where = f"{self.url}{path}"
        if status != 200:
            note = f" ({self.server.metrics_note})" if self.server.metrics_note else ""
            self._note("status", f"{where} answered {status or 'nothing'}: no server metrics{note}")
            return None
        text = body.decode(errors="replace")
        try:
            return {**parse_metrics(text, self.server.metrics), **parse_positions(text, self.server.by_position)}
        except ValueError as exc:
            self._note("parse", f"{where} is not Prometheus text ({exc}): no server metrics")
            return None

    def _get(self, path: str) -> tuple[int | None, bytes]:
        return fetch(self._http, self._prefix + path, self.timeout_s)

    def _missing(self, values: Readings) -> list[str]:
        """The names of the metrics not read; one exported only in some configurations is not missing."""
        wanted = (name for name in self.server.metrics if name not in CONDITIONAL_FIELDS)
        return [self.server.metrics[name][0] for name in wanted if name not in values and self.server.metrics[name]]

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning("llmload: %s", message)

    def _set_reachable(self, reachable: bool) -> None:
        if reachable != self._reachable:
            self._reachable = reachable
            state = "answers again" if reachable else "does not answer /health: samples have health null"
            log.warning("llmload: server %s %s", self.url, state)


def fleet(scrapes: Sequence[Scrape]) -> Scrape:
    """The replicas' scrapes as one: the first's health (failure classification reads the primary's), each
    figure reduced over replicas (module docstring), the missing names of all; one scrape is itself."""
    if len(scrapes) == 1:
        return scrapes[0]
    readings = [s.values for s in scrapes]
    values = None if any(r is None for r in readings) else _reduce([r for r in readings if r is not None])
    missing = list(dict.fromkeys(name for s in scrapes for name in s.missing))
    return Scrape(scrapes[0].health, values, missing)


def _reduce(readings: list[Readings]) -> Readings:
    """The figures every replica gave, each reduced: a vector (per draft position) summed element-wise."""
    common = set(readings[0]).intersection(*readings[1:])
    reduced: Readings = {}
    for name in (n for n in readings[0] if n in common):
        values = [r[name] for r in readings]
        if all(isinstance(v, list) for v in values):
            vectors = [v for v in values if isinstance(v, list)]
            reduced[name] = [sum(v[i] for v in vectors if i < len(v)) for i in range(max(map(len, vectors)))]
        elif not any(isinstance(v, list) for v in values):
            numbers = [float(v) for v in values if not isinstance(v, list)]
            reduced[name] = max(numbers) if name in FULLEST else sum(numbers)
    return reduced
