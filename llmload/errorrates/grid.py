"""The cells the gates' error rates are measured in, and the tally of their verdicts over seeds.

A cell is a server of known capacity, a hold, an arrival process and a load (the hold's rate over the
capacity). Healthy cells (load ≤ 0.85) must FAIL or be INCONCLUSIVE at most 1% of the time, overloaded
ones (≥ 1.1) PASS at most 1%: docs/gates.md holds the table `python -m benchmarks.gate_error_rates`
writes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from llmload.errorrates.runs import HoldKind, hold_plan, judge, records
from llmload.errorrates.servers import BatchServer, FifoServer, Lengths, Server
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
        """The share of verdicts the cell's side forbids."""
        if self.cell.side == "healthy":
            return 1 - self.share("pass")
        if self.cell.side == "overloaded":
            return self.share("pass")
        return 0.0


def tally(cell: Cell, seeds: range) -> Tally:
    """Every seed's verdict of the cell, counted with the checks behind each FAIL and INCONCLUSIVE."""
    hold = hold_plan(cell.hold, cell.rate)
    out = Tally(cell)
    for seed in seeds:
        manifest, frame = records(hold, cell.server, cell.arrivals.process, cell.arrivals.burstiness, seed)
        result = judge(manifest, frame, hold.criteria)
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
