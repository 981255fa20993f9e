"""`llmload search` against a server of known capacity: the search's own loop and decisions
(llmload.gates.search: `search`, `Searcher.hold_and_drain`, `Searcher.judged_probe`), each probe a run
made and judged as in `runs`. So its answer can be held against the capacity it should find."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from llmload.errorrates.grid import Arrivals
from llmload.errorrates.runs import Hold, judge, records
from llmload.errorrates.servers import Server
from llmload.gates.criteria import SoakCriteria
from llmload.gates.search import (
    CONFIRM_S,
    PROBE_S,
    PROBE_WARMUP_S,
    REPEATS,
    RESOLUTION,
    Bounds,
    ProbeFlags,
    Searcher,
    confirm_criteria,
    probe_criteria,
    search,
)
from llmload.models import Probe, SearchResult
from llmload.schedule import build_stages

LOW, HIGH = 0.85, 1.0  # where the answer must fall, as a share of the capacity


@dataclass
class SimulatedSearcher(Searcher):
    """A Searcher whose probes are made, not run: the same holds, drains and verdicts."""

    server: Server | None = None
    arrivals: Arrivals = field(default_factory=lambda: Arrivals("poisson"))
    seed: int = 0
    criteria: SoakCriteria = field(default_factory=SoakCriteria)

    def probe(self, qps: float, *, confirm: bool = False) -> Probe:
        assert self.server is not None
        number = len(self.result.probes) + 1
        hold_s, drain_s = self.hold_and_drain(qps, confirm=confirm)
        stages = build_stages(qps, (100,), hold_s, warmup_s=self.flags.warmup_s)
        chosen = confirm_criteria(self.criteria, self.flags.confirm_s) if confirm else probe_criteria(
            self.criteria, self.flags.hold_s
        )  # fmt: skip
        hold = Hold("confirm" if confirm else "probe", tuple(stages), chosen, drain_s)
        seed = self.seed * 1000 + number
        manifest, frame = records(hold, self.server, self.arrivals.process, self.arrivals.burstiness, seed)
        result, summary = judge(manifest, frame, chosen)
        probe = self.judged_probe(f"probe-{number}", qps, hold_s, result.verdict, summary.stages[-1], confirm=confirm)
        self._add(probe)
        return probe

    def save(self) -> None:
        self.conclude()


@dataclass(frozen=True)
class SearchOutcome:
    answer: float | None  # what the search vouches for (`answer_qps`)
    passing: float | None  # the highest rate that passed (`passing_qps`)
    probes: int
    held_s: float


def run_search(server: Server, arrivals: Arrivals, seed: int, *, confirm: bool = False) -> SearchOutcome:
    """One default search up to twice the capacity, from an eighth of that."""
    max_qps = float(f"{2 * server.capacity_qps:.3g}")
    bounds = Bounds(float(f"{max_qps / 8:.3g}"), max_qps / 256, max_qps, 2.0, RESOLUTION, REPEATS)
    flags = ProbeFlags(
        "", "", hold_s=PROBE_S, warmup_s=PROBE_WARMUP_S, drain_s=60.0, confirm_s=CONFIRM_S, confirm=confirm
    )
    result = SearchResult(
        search_id="errorrates", host="", workload="", max_qps=max_qps, probe_s=PROBE_S, repeats=REPEATS, started_at=0
    )
    searcher = SimulatedSearcher(flags, (), Path("."), result, server=server, arrivals=arrivals, seed=seed)
    outcome = search(searcher, bounds)
    answered = outcome in ("found", "capped") and result.confirmed is not False
    held = sum(PROBE_WARMUP_S + (p.hold_s or PROBE_S) for p in result.probes)
    return SearchOutcome(result.answer_qps if answered else None, result.passing_qps, len(result.probes), held)


@dataclass
class SearchTally:
    server: Server
    arrivals: Arrivals
    answers: list[float | None] = field(default_factory=list)  # as shares of the capacity
    probes: list[int] = field(default_factory=list)
    held_s: list[float] = field(default_factory=list)

    def share(self, low: float, high: float) -> float:
        return sum(a is not None and low <= a <= high for a in self.answers) / len(self.answers)

    @property
    def above(self) -> float:
        return sum(a is not None and a > HIGH for a in self.answers) / len(self.answers)

    @property
    def none(self) -> float:
        return sum(a is None for a in self.answers) / len(self.answers)

    @property
    def median_probes(self) -> float:
        return statistics.median(self.probes)

    @property
    def median_minutes(self) -> float:
        return statistics.median(self.held_s) / 60


def tally_search(server: Server, arrivals: Arrivals, seeds: range) -> SearchTally:
    out = SearchTally(server, arrivals)
    for seed in seeds:
        outcome = run_search(server, arrivals, seed)
        out.answers.append(None if outcome.answer is None else outcome.answer / server.capacity_qps)
        out.probes.append(outcome.probes)
        out.held_s.append(outcome.held_s)
    return out
