"""Open-loop arrivals: stages of a ramp and the arrival process that fills them.

Arrivals are computed ahead from the plan, never from how fast the target answers, so a slow
target cannot slow the offered load (no coordinated omission). Every worker of a distributed run
draws the same global sequence from the same seed and keeps every N-th arrival, so the merged
stream is exactly the requested process at exactly the target rate, whatever N is.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

from llmload.models import Stage

ArrivalProcess = Literal["poisson", "constant", "gamma"]
DEFAULT_STAGE_PERCENTS: tuple[float, ...] = (25, 50, 100, 150)


def build_stages(
    target_qps: float,
    percents: Sequence[float] = DEFAULT_STAGE_PERCENTS,
    stage_duration_s: float = 60.0,
    hold_duration_s: float | None = None,
) -> list[Stage]:
    """Stages at `percents` of the target; the last one (the hold) may last longer."""
    if target_qps <= 0:
        raise ValueError(f"target QPS must be > 0, got {target_qps}")
    if not percents or any(p <= 0 for p in percents):
        raise ValueError(f"stage percents must be positive, got {list(percents)}")
    if stage_duration_s <= 0 or (hold_duration_s is not None and hold_duration_s <= 0):
        raise ValueError("stage durations must be > 0")
    stages: list[Stage] = []
    start = 0.0
    for i, percent in enumerate(percents):
        last = i == len(percents) - 1
        duration = hold_duration_s if last and hold_duration_s is not None else stage_duration_s
        stages.append(
            Stage(
                name=f"{percent:g}%",
                percent=percent,
                qps=target_qps * percent / 100,
                start_s=start,
                duration_s=duration,
            )
        )
        start += duration
    return stages


def parse_stage_percents(text: str) -> tuple[float, ...]:
    """`"25,50,100,150"` or `"25%,50%"` → (25.0, 50.0, ...)."""
    try:
        return tuple(float(part.strip().rstrip("%")) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--stages wants comma-separated percents like 25,50,100,150; got {text!r}") from None


def stage_at(stages: Sequence[Stage], t_s: float) -> Stage:
    """The stage a time offset falls in (the last stage beyond the plan's end)."""
    for stage in stages:
        if t_s < stage.end_s:
            return stage
    return stages[-1]


class ArrivalSchedule:
    """The global arrival times of a staged, open-loop run, in seconds from the run's start.

    Gaps are drawn in "work" units of mean 1 and spent against the piecewise-constant rate
    (time rescaling), so a gap straddling a stage boundary is stretched correctly. For gamma,
    `burstiness` is the shape as in vLLM's bench (1 = Poisson, < 1 burstier, > 1 smoother).
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        process: ArrivalProcess = "poisson",
        *,
        burstiness: float = 1.0,
        seed: int = 0,
        rate_scale: float = 1.0,
    ) -> None:
        if process not in ("poisson", "constant", "gamma"):
            raise ValueError(f"unknown arrival process {process!r}: poisson, constant or gamma")
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        if rate_scale <= 0:
            raise ValueError(f"rate scale must be > 0, got {rate_scale}")
        self.stages = list(stages)
        self.process = process
        self.burstiness = burstiness
        self.seed = seed
        self.rate_scale = rate_scale

    @property
    def end_s(self) -> float:
        return self.stages[-1].end_s

    def _unit_gaps(self) -> Iterator[float]:
        if self.process == "constant":
            yield from itertools.repeat(1.0)
            return
        rng = np.random.default_rng(self.seed)
        while True:
            if self.process == "poisson":
                block = rng.exponential(1.0, 4096)
            else:
                block = rng.gamma(self.burstiness, 1.0 / self.burstiness, 4096)
            yield from block.tolist()

    def times(self) -> Iterator[float]:
        """All arrival offsets (s) inside the plan, in order."""
        gaps = self._unit_gaps()
        # constant arrivals start half a gap in, so a stage of n gaps holds n arrivals
        work = 0.5 if self.process == "constant" else next(gaps)
        for stage in self.stages:
            rate = stage.qps * self.rate_scale
            t = stage.start_s
            while True:
                dt = work / rate
                if t + dt >= stage.end_s:
                    work -= (stage.end_s - t) * rate
                    break
                t += dt
                yield t
                work = next(gaps)

    def share(self, index: int, count: int) -> Iterator[float]:
        """The arrivals worker `index` of `count` sends: every count-th of the global stream."""
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} outside 0..{count - 1}")
        return itertools.islice(self.times(), index, None, count)


def expected_arrivals(stages: Sequence[Stage], rate_scale: float = 1.0) -> float:
    return math.fsum(s.qps * rate_scale * s.duration_s for s in stages)
