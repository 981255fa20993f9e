"""Error rates of the change points and of the gate against history (llmload.history.changes), measured
on series of soak results of the harness's servers of known capacity; written into docs/gates.md between
its `history-changes` markers.

1. Harness runs: `--runs` default soaks (0.7 of capacity, Poisson) of each server, one per seed, made and
   summarized by llmload's own code (llmload.errorrates.runs, llmload.report.summary): each run's TTFT p99
   and E2E p50. Their spread over seeds is the between-run noise of repeats of one healthy server.
2. Series: each value drawn from those runs' values (resampled with replacement, so the noise keeps its
   shape), and in the "2× between" regime with each log-value's distance from the pool's mean doubled
   (machines and days add noise that one run's own sample cannot show). A step of x% multiplies the
   values from its run on by 1 + x.
3. Change points: stationary 30-run series (false alarm: any change point), 27 runs then a 10% step with 3
   runs after it (found: a change point at the step ± 1), and 12 runs with a 15% step at run 8 (right:
   exactly one change point, at run 8 ± 1); first over a grid of MAX_P_VALUE, then at the chosen one.
4. The gate: the 11th run against the 10 before it, steady or 10% worse; llmload compare's rule on the same
   figures as a pairwise gate (the 11th against the 10th: a regression when the rise's 95% interval, from
   each run's own noise, lies wholly above the default limit, 10% for p50 and 15% for p99).

Intervals are Clopper–Pearson 95%. Runs in a few minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks import write_between_markers
from llmload.errorrates.grid import SERVERS
from llmload.errorrates.runs import NO_SERVER_FILE, hold_plan, records
from llmload.history import changes
from llmload.observe.summary import read_server
from llmload.report.summary import summarize
from llmload.stats.percentiles import percentiles

DOC = Path(__file__).resolve().parent.parent / "docs" / "gates.md"
BEGIN, END = "<!-- history-changes:begin -->", "<!-- history-changes:end -->"
HARNESS = ("fifo-32x3s", "batch-16x2s")
FIGURES = ("TTFT p99", "E2E p50")
PAIRWISE_LIMIT = {"TTFT p99": 0.15, "E2E p50": 0.10}  # llmload compare's default latency rises
REGIMES = {"harness": 1.0, "2× between": 2.0}
P_GRID = tuple((segment, p) for segment in (2, 3) for p in (0.002, 0.001, 0.0005, 0.0002))
GATE_GRID = (0.99, 0.995, 0.999)
SIGMAS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.10, 0.40)  # run-to-run σ of the log-values, normal noise
LOAD = 0.7
GATE_RUNS = 10


def _figures(job: tuple[str, int]) -> tuple[float, ...]:
    """One default soak of the server at LOAD: its TTFT p99 and E2E p50 (ms) over the judged stages."""
    name, seed = job
    server = SERVERS[name]
    manifest, frame = records(hold_plan("soak", LOAD * server.capacity_qps), server, "poisson", 1.0, seed)
    summary = summarize(
        frame, manifest, itl=percentiles([]), stage_itl_p50=None, server=read_server(NO_SERVER_FILE), good=None,
        workload_prefix=None,
    )  # fmt: skip
    ttft, e2e = summary.latency_ms.ttft.p99, summary.latency_ms.e2e.p50
    assert ttft is not None and e2e is not None  # every soak of these servers answers
    return ttft, e2e


@dataclass(frozen=True)
class Pool:
    """One figure of one server over the harness runs, as log-values."""

    server: str
    figure: str
    logs: np.ndarray

    @property
    def spread(self) -> float:
        return float(self.logs.std(ddof=1))

    def draw(self, rng: np.random.Generator, length: int, widen: float, step_at: int, step: float) -> np.ndarray:
        """A series of `length` runs, each from the pool (distances from its mean × `widen`), multiplied
        by 1 + `step` from index `step_at` on."""
        center = self.logs.mean()
        x = center + widen * (rng.choice(self.logs, length) - center)
        x[step_at:] += math.log1p(step)
        return np.exp(x)


def harness_pools(runs: int, processes: int) -> list[Pool]:
    jobs = [(name, seed) for name in HARNESS for seed in range(runs)]
    with ProcessPoolExecutor(processes) as pool:
        values = np.array(list(pool.map(_figures, jobs, chunksize=8)))
    out = []
    for i, name in enumerate(HARNESS):
        rows = values[i * runs : (i + 1) * runs]
        out += [Pool(name, figure, np.log(rows[:, j])) for j, figure in enumerate(FIGURES)]
    return out


def rate(hits: int, n: int) -> str:
    """A share with its Clopper–Pearson 95% interval and its count."""
    ci = stats.binomtest(hits, n).proportion_ci(method="exact")
    return f"{hits / n:.1%} [{ci.low:.1%}, {ci.high:.1%}] ({hits}/{n})"


def change_settings(segment: int, p: float) -> dict[str, float]:
    """MIN_SEGMENT `segment` and MAX_P_VALUE `p`, with Otava's first pass at ten times it."""
    return {"MIN_SEGMENT": segment, "MAX_P_VALUE": p, "SPLIT_P_VALUE": 10 * p}


@contextmanager
def tuned(settings: dict[str, float]) -> Iterator[None]:
    """llmload.history.changes with these of its constants set otherwise, as a simulation tries them."""
    saved = {name: getattr(changes, name) for name in settings}
    for name, value in settings.items():
        setattr(changes, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(changes, name, value)


Trial = Callable[[Pool, float, np.random.Generator], bool]
Job = tuple[Pool, float, str, int, int, dict[str, float]]  # pool, widening, trial, series, seed, settings


def false_alarm(pool: Pool, widen: float, rng: np.random.Generator) -> bool:
    return bool(changes.find_change_points(pool.draw(rng, 30, widen, 30, 0.0).tolist()))


def found_10(pool: Pool, widen: float, rng: np.random.Generator) -> bool:
    found = changes.find_change_points(pool.draw(rng, 30, widen, 27, 0.10).tolist())
    return any(abs(c.index - 27) <= 1 for c in found)


def exactly_one_15(pool: Pool, widen: float, rng: np.random.Generator) -> bool:
    found = changes.find_change_points(pool.draw(rng, 12, widen, 7, 0.15).tolist())
    return len(found) == 1 and abs(found[0].index - 7) <= 1


def gate_trial(pool: Pool, widen: float, rng: np.random.Generator, step: float) -> tuple[bool, bool]:
    """The 11th run (`step` worse) against the 10 before it: the history gate and the pairwise rule.
    Each run's own noise is the harness's spread (one run of these servers is exactly that noisy)."""
    series = pool.draw(rng, GATE_RUNS + 1, widen, GATE_RUNS, step)
    within = pool.spread
    history = changes.history_gate(series[:-1].tolist(), float(series[-1]), within).regressed
    rise = math.log(series[-1] / series[-2]) - 1.96 * math.sqrt(2) * within
    return history, math.expm1(rise) > PAIRWISE_LIMIT[pool.figure]


def _tally(job: Job) -> tuple[int, ...]:
    """How many of `series` seeded trials came out true (the gate's: the history gate's, the pairwise rule's)."""
    pool, widen, trial, series, seed, settings = job
    rng = np.random.default_rng(seed)
    with tuned(settings):
        if trial.startswith("gate"):
            step = 0.10 if trial == "gate-step" else 0.0
            outcomes = np.array([gate_trial(pool, widen, rng, step) for _ in range(series)])
            return tuple(int(n) for n in outcomes.sum(axis=0))
        test: Trial = {"false": false_alarm, "found": found_10, "one": exactly_one_15}[trial]
        return (sum(test(pool, widen, rng) for _ in range(series)),)


def tuning_table(pools: list[Pool], series: int, processes: int) -> str:
    """False alarms and power of find_change_points over P_GRID (MIN_SEGMENT, MAX_P_VALUE): on the harness's
    pools (all of them for false alarms, E2E p50's for power) and on normal noise of σ 3%."""
    tried = [*pools, normal_pools()[SIGMAS.index(0.03)]]
    jobs: list[Job] = [
        (pool, 1.0, trial, series, 1000 * k + 10 * i + t, change_settings(*level))
        for k, level in enumerate(P_GRID)
        for i, pool in enumerate(tried)
        for t, trial in enumerate(("false", "found"))
    ]
    with ProcessPoolExecutor(processes) as executor:
        hits = np.array([h[0] for h in executor.map(_tally, jobs)]).reshape(len(P_GRID), len(tried), 2)
    e2e = [i for i, pool in enumerate(pools) if pool.figure == "E2E p50"]
    rows = [
        f"| {level[0]} | {level[1]:g} | {rate(int(h[: len(pools), 0].sum()), series * len(pools))}"
        f" | {rate(int(h[-1, 0]), series)} | {rate(int(h[e2e, 1].sum()), series * len(e2e))}"
        f" | {rate(int(h[-1, 1]), series)} |"
        for level, h in zip(P_GRID, hits, strict=True)
    ]
    head = [
        f"Tuning MIN_SEGMENT and MAX_P_VALUE (first pass ten times it), {series} series a pool:",
        "",
        "| MIN_SEGMENT | MAX_P_VALUE | stationary 30 runs, harness pools: change point | normal noise: change point"
        " | 10% step found (3 runs after), harness E2E p50 | normal noise σ 3% |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    return "\n".join([*head, *rows])


def change_table(rows: list[tuple[Pool, str, float]], series: int, processes: int, title: str) -> str:
    """The three trials of find_change_points on each (pool, noise label, widening) row."""
    jobs: list[Job] = [
        (pool, widen, trial, series, 7919 * i + t, {})
        for i, (pool, _, widen) in enumerate(rows)
        for t, trial in enumerate(("false", "found", "one"))
    ]
    with ProcessPoolExecutor(processes) as executor:
        hits = iter([h[0] for h in executor.map(_tally, jobs)])
    lines = []
    for pool, label, widen in rows:
        cells = " | ".join(rate(next(hits), series) for _ in range(3))
        lines.append(f"| {pool.server} | {pool.figure} | {label} | {widen * pool.spread:.1%} | {cells} |")
    head = [
        f"{title}; `find_change_points` at MAX_P_VALUE {changes.MAX_P_VALUE:g} (first pass"
        f" {changes.SPLIT_P_VALUE:g}), MIN_SEGMENT {changes.MIN_SEGMENT}; {series} series a cell. Targets: ≤ 1% |"
        " ≥ 90% | as many as possible.",
        "",
        "| server | figure | noise | run-to-run σ (log) | change point in a stationary 30-run series"
        " | 10% step found at its run ± 1, 3 runs after | 12 runs, 15% step at run 8: exactly one, at 8 ± 1 |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    return "\n".join([*head, *lines])


def normal_pools() -> list[Pool]:
    """Normal run-to-run noise of each σ in SIGMAS, as a pool of 10,000 log-values."""
    rng = np.random.default_rng(58)
    return [Pool("normal noise", "any", rng.normal(0.0, sigma, 10_000)) for sigma in SIGMAS]


def gate_tuning_table(pools: list[Pool], series: int, processes: int) -> str:
    """The history gate's false alarms over GATE_GRID, every pool in every noise regime (all together and
    the worst cell), and how often it catches E2E p50 10% worse at the harness's noise."""
    cells = [(pool, widen) for pool in pools for widen in REGIMES.values()]
    jobs: list[Job] = [
        (pool, widen, trial, series, 3571 * k + 17 * i + t, {"GATE_LEVEL": level})
        for k, level in enumerate(GATE_GRID)
        for i, (pool, widen) in enumerate(cells)
        for t, trial in enumerate(("gate-steady", "gate-step"))
    ]
    with ProcessPoolExecutor(processes) as executor:
        hits = np.array([h[0] for h in executor.map(_tally, jobs)]).reshape(len(GATE_GRID), len(cells), 2)
    caught = [i for i, (pool, widen) in enumerate(cells) if pool.figure == "E2E p50" and widen == 1.0]
    rows = [
        f"| {level:g} | {rate(int(h[:, 0].sum()), series * len(cells))} | {rate(int(h[:, 0].max()), series)}"
        f" | {rate(int(h[caught, 1].sum()), series * len(caught))} |"
        for level, h in zip(GATE_GRID, hits, strict=True)
    ]
    head = [
        f"Tuning GATE_LEVEL (the 11th run against the {GATE_RUNS} before it), {series} series a cell:",
        "",
        "| GATE_LEVEL | false alarm, all cells | the worst cell | E2E p50 10% worse caught (harness noise) |",
        "|---:|---:|---:|---:|",
    ]
    return "\n".join([*head, *rows])


def gate_table(pools: list[Pool], series: int, processes: int) -> str:
    jobs: list[Job] = [
        (pool, widen, trial, series, 104729 * i + 17 * j + t, {})
        for i, pool in enumerate(pools)
        for j, widen in enumerate(REGIMES.values())
        for t, trial in enumerate(("gate-steady", "gate-step"))
    ]
    with ProcessPoolExecutor(processes) as executor:
        hits = list(executor.map(_tally, jobs))
    rows = []
    it = iter(hits)
    for pool in pools:
        for regime in REGIMES:
            steady, step = next(it), next(it)
            rows.append(
                f"| {pool.server} | {pool.figure} | {regime} | {rate(steady[0], series)} | {rate(step[0], series)}"
                f" | {rate(steady[1], series)} | {rate(step[1], series)} |"
            )
    head = [
        f"The gate against history (the 11th run against the {GATE_RUNS} before it, GATE_LEVEL"
        f" {changes.GATE_LEVEL:g}, `within` = one run's own noise) and the pairwise rule (the 11th against the"
        f" 10th) on the same series; {series} series a cell. Targets: false alarms ≤ 1%.",
        "",
        "| server | figure | noise | history: false alarm | history: 10% worse caught | pairwise: false alarm"
        " | pairwise: 10% worse caught |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    return "\n".join([*head, *rows])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="harness soaks per server")
    parser.add_argument("--series", type=int, default=1000, help="simulated series per cell")
    parser.add_argument("--tune-series", type=int, default=500, help="series per pool and MAX_P_VALUE (0: no grid)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-doc", action="store_true", help="print the tables only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    pools = harness_pools(args.runs, args.processes)
    parts = [
        f"Measured by `python -m benchmarks.history_changes` ({args.runs} harness soaks per server at {LOAD:g} of"
        f" capacity, Poisson; {(time.monotonic() - started) / 60:.1f} min for them in {args.processes} process(es))."
    ]
    if args.tune_series:
        parts.append(tuning_table(pools, args.tune_series, args.processes))
    harness = [(pool, label, widen) for pool in pools for label, widen in REGIMES.items()]
    parts.append(change_table(harness, args.series, args.processes, "Series of the harness's figures"))
    sweep = [(pool, "normal", 1.0) for pool in normal_pools()]
    parts.append(change_table(sweep, args.series, args.processes, "Series with normal noise of a known σ"))
    if args.tune_series:
        parts.append(gate_tuning_table(pools, args.tune_series, args.processes))
    parts.append(gate_table(pools, args.series, args.processes))
    parts[0] += f" All tables: {(time.monotonic() - started) / 60:.0f} min on a {os.cpu_count()}-core machine."
    text = "\n\n".join(parts)
    print(text)
    if not args.no_doc:
        write_between_markers(DOC, BEGIN, END, text)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
