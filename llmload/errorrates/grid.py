"""The cells the gates' error rates are measured in, and the tally of their verdicts over seeds.

A cell is a server of known capacity, a hold, an arrival process and a load (the hold's rate over the
capacity). Healthy cells (load ≤ 0.85) must FAIL or be INCONCLUSIVE at most 1% of the time, overloaded
ones (≥ 1.1) PASS at most 1%: docs/gates.md holds the table `python -m benchmarks.gate_error_rates`
writes.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from llmload.errorrates.runs import HoldKind, hold_plan, judge, records
from llmload.errorrates.servers import BatchServer, FifoServer, Lengths, Server
from llmload.gates.criteria import KeepingUpCriteria
from llmload.schedule import ArrivalProcess

HEALTHY_LOAD = 0.85
OVERLOADED = 1.1
TARGET_RATE = 0.01  # the error rate allowed each way


@dataclass(frozen=True)
class Arrivals:
    process: ArrivalProcess
    burstiness: float = 1.0

    @property
    def label(self) -> str:
        return f"gamma {self.burstiness:g}" if self.process == "gamma" else self.process

    @property
    def cv2(self) -> float:
        """The squared coefficient of variation of the gaps between arrivals."""
        return {"constant": 0.0, "poisson": 1.0}.get(self.process, 1 / self.burstiness)


@dataclass(frozen=True)
class Cell:
    server: Server
    hold: HoldKind
    arrivals: Arrivals
    load: float

    @property
    def rate(self) -> float:
        return self.load * self.server.capacity_qps

    @property
    def side(self) -> str:
        """What the gate must say: healthy, overloaded, or either (between the two)."""
        return "healthy" if self.load <= HEALTHY_LOAD else "overloaded" if self.load >= OVERLOADED else "between"

    @property
    def held_requests(self) -> float:
        return self.rate * hold_plan(self.hold, self.rate).judged.duration_s

    @functools.cached_property
    def requests_needed(self) -> float:
        """The fewest requests with which keeping up can PASS this server at all, were its queue perfectly
        level: the random-walk error (llmload.gates.verdict.Walk.slope_error) must leave room under the
        growth of a 10% overload, (z_pass / growth)² × (c_a² / 5 + 6/5 × c_s²), with c_s² of the server's
        service times and c_a² of the arrival process. A hold with fewer can only be INCONCLUSIVE."""
        criteria = KeepingUpCriteria()
        z = NormalDist().inv_cdf(criteria.pass_confidence)
        growth = 1 - 1 / (1 + criteria.overload)
        service = self.server.service_times(np.random.default_rng(0), 100_000)
        service_cv2 = float(service.var() / service.mean() ** 2)
        return (z / growth) ** 2 * (self.arrivals.cv2 / 5 + 6 / 5 * service_cv2)

    @property
    def too_few(self) -> bool:
        """Whether the hold is too short for any verdict but INCONCLUSIVE on a healthy server: fewer
        requests than `requests_needed`, or a hold under `answer_spans` of its answers' p90."""
        hold = hold_plan(self.hold, self.rate)
        p90 = float(np.percentile(self.server.service_times(np.random.default_rng(0), 100_000), 90))
        spans = hold.criteria.keeping_up.answer_spans
        return self.held_requests < self.requests_needed or hold.judged.duration_s < spans * p90


@dataclass
class Tally:
    cell: Cell
    runs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)  # the checks that failed or could not tell

    def share(self, outcome: str) -> float:
        return self.outcomes[outcome] / self.runs if self.runs else 0.0

    @property
    def wrong(self) -> float:
        """The share of verdicts the cell's side forbids: on a healthy server anything but PASS, or only
        FAIL where the hold holds too few requests to tell (INCONCLUSIVE is right there)."""
        if self.cell.side == "healthy":
            return self.share("fail") if self.cell.too_few else 1 - self.share("pass")
        if self.cell.side == "overloaded":
            return self.share("pass")
        return 0.0


def tally(cell: Cell, seeds: range) -> Tally:
    """Every seed's verdict of the cell, counted with the checks behind each FAIL and INCONCLUSIVE."""
    hold = hold_plan(cell.hold, cell.rate)
    out = Tally(cell)
    for seed in seeds:
        manifest, frame = records(hold, cell.server, cell.arrivals.process, cell.arrivals.burstiness, seed)
        result, _ = judge(manifest, frame, hold.criteria)
        verdict = result.verdict
        out.runs += 1
        out.outcomes[verdict.outcome] += 1
        out.reasons.update({c.name for c in result.checks if c.status in ("fail", "inconclusive")})
    return out


def _fifo(slots: int, answer_s: float, lengths: str = "lognormal", sigma: float = 0.5) -> FifoServer:
    """A FIFO server whose mean answer takes `answer_s`: a TTFT of 5% of it, the rest in 20 ms tokens."""
    ttft = 0.05 * answer_s
    tokens = 1 + (answer_s - ttft) / 0.02
    return FifoServer(slots, ttft, 0.02, Lengths(lengths, tokens, sigma))  # type: ignore[arg-type]


def _batch(seqs: int, answer_s: float, lengths: str = "lognormal", sigma: float = 0.5) -> BatchServer:
    """A batch server whose full step is twice its empty one, and a mean answer of `answer_s` at a full batch."""
    step_full = 0.03
    tokens = answer_s / step_full
    return BatchServer(seqs, step_full / 2, step_full / 2 / seqs, Lengths(lengths, tokens, sigma))  # type: ignore[arg-type]


SERVERS: dict[str, Server] = {
    "fifo-32x3s": _fifo(32, 3.0),
    "fifo-1x8s": _fifo(1, 8.0),
    "fifo-1x3s-fixed": _fifo(1, 3.0, "fixed"),
    "fifo-8x0.5s-σ0.9": _fifo(8, 0.5, sigma=0.9),
    "fifo-256x1s-heavy": _fifo(256, 1.0, "pareto"),
    "fifo-32x35s": _fifo(32, 35.0),
    "fifo-64x60s-σ0.9": _fifo(64, 60.0, sigma=0.9),
    "batch-16x2s": _batch(16, 2.0),
}
LOADS = (0.5, 0.7, 0.85, 0.95, 1.05, 1.1, 1.2, 1.5)
ARRIVALS = (Arrivals("constant"), Arrivals("poisson"), Arrivals("gamma", 0.5), Arrivals("gamma", 0.25))
HOLDS: tuple[HoldKind, ...] = ("probe", "confirm", "soak", "soak-30m")
