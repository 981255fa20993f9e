"""The gates' error-rate harness (llmload/errorrates): servers of known capacity behave as queueing
theory says, their runs are judged as `llmload verdict` judges a run directory, and a few cells of the
table in docs/gates.md hold their targets (the seeds are fixed: the same verdicts every time)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from llmload.drain import drain_end
from llmload.errorrates.compare import compare_pair, write_run
from llmload.errorrates.grid import SERVERS, Arrivals, Cell, tally
from llmload.errorrates.runs import Hold, hold_plan, judge, records
from llmload.errorrates.search import run_search
from llmload.errorrates.servers import BatchServer, FifoServer, Lengths
from llmload.errorrates.walk import calm_quantiles
from llmload.gates.verdict import WALK_CALM_QUANTILE, WALK_CALM_WINDOWS
from llmload.rundir import VERDICT_FILE
from tests.locust_runs import llmload_cli

SEEDS = range(40)


def _completions_per_s(server: FifoServer | BatchServer, load: float, seconds: float = 2000.0) -> float:
    rng = np.random.default_rng(0)
    rate = load * server.capacity_qps
    arrivals = np.sort(rng.uniform(0, seconds, int(rate * seconds)))
    served = server.serve(arrivals, rng)
    return float((served.finished <= seconds).sum()) / seconds


@pytest.mark.parametrize("server", [SERVERS["fifo-1x3s-fixed"], SERVERS["fifo-32x3s"], SERVERS["batch-16x2s"]])
def test_a_server_of_known_capacity_serves_what_it_is_sent_below_it_and_its_capacity_above(
    server: FifoServer | BatchServer,
) -> None:
    below = _completions_per_s(server, 0.7)
    above = _completions_per_s(server, 1.5)
    assert below == pytest.approx(0.7 * server.capacity_qps, rel=0.05)
    assert above == pytest.approx(server.capacity_qps, rel=0.05)


def test_the_verdicts_table_of_a_walks_calm_is_what_simulation_gives() -> None:
    """Keeping up rules out a saturated server by how calm its in-flight series is; the table it reads
    is the 0.5% quantile of a simulated walk's calm (a fresh, smaller simulation agrees within 25%: its
    tail holds 50 paths)."""
    fresh = calm_quantiles(WALK_CALM_WINDOWS, 0.005, paths=10_000, seed=7)
    assert fresh == pytest.approx(list(WALK_CALM_QUANTILE), rel=0.25)


def test_lengths_have_the_mean_they_are_given() -> None:
    rng = np.random.default_rng(1)
    for shape in ("fixed", "lognormal", "pareto"):
        drawn = Lengths(shape, 200, 0.9).draw(200_000, rng)  # type: ignore[arg-type]
        assert drawn.mean() == pytest.approx(200, rel=0.02), shape


def test_the_drain_waits_for_long_answers_and_gives_up_on_stuck_ones() -> None:
    """Ten 30 s answers, then answers of 36-38 s sent just before the plan's end are waited for; a
    stuck request is given up once it is 3x older than the longest answer seen (38 s) and no answer
    came for as long (the last at 131 s: given up at 131 + 114 s); the cap holds. A queue the server
    works through is waited for however old its requests grow, and before ten answers came back
    every request is."""
    early = np.arange(10.0)
    sent = np.concatenate([early, [90.0, 95.0, 20.0]])
    finished = np.concatenate([early + 30, [128.0, 131.0, 2000.0]])  # the last one is stuck
    assert drain_end(sent, finished, plan_end=100.0, cap_s=300.0) == pytest.approx(245.0)
    assert drain_end(sent[:12], finished[:12], plan_end=100.0, cap_s=20.0) == 120.0
    alone = drain_end(sent[[*range(10), 12]], finished[[*range(10), 12]], plan_end=100.0, cap_s=300.0)
    assert alone == pytest.approx(129.0)  # the last 30 s answer at 39 s: waited for until 39 + 90 s
    few = drain_end(np.array([0.0, 20.0]), np.array([35.0, 2000.0]), plan_end=100.0, cap_s=300.0)
    assert few == 400.0  # one 35 s answer says little about the next: the cap
    # one slot, 8 s answers, all sent at 0: the last starts at 152 s, 6x its age limit, and still finishes
    queued = np.arange(1, 21) * 8.0
    assert drain_end(np.zeros(20), queued, plan_end=1.0, cap_s=300.0) == pytest.approx(160.0)


def test_a_generated_run_judged_from_its_directory_gets_the_same_verdict(tmp_path: Path) -> None:
    """The harness judges in memory; `llmload verdict` on the same records, written as a run directory,
    must agree check for check (it is the same code, and this shows it)."""
    cell = Cell(SERVERS["fifo-32x3s"], "probe", Arrivals("poisson"), 0.7)
    hold = hold_plan(cell.hold, cell.rate)
    manifest, frame = records(hold, cell.server, "poisson", 1.0, seed=3)
    in_memory, _ = judge(manifest, frame, hold.criteria)
    run_dir = write_run(tmp_path / "run", manifest, frame)
    criteria = tmp_path / "criteria.yaml"
    criteria.write_text(orjson.dumps(hold.criteria.model_dump(mode="json")).decode())
    proc = llmload_cli("verdict", str(run_dir), "--criteria", str(criteria), timeout=120)
    assert proc.returncode == {"pass": 0, "fail": 1, "inconclusive": 3}[in_memory.verdict.outcome], proc.stderr
    assert proc.stdout.startswith(f"{run_dir}: {in_memory.verdict.label} — "), proc.stdout
    written = orjson.loads((run_dir / VERDICT_FILE).read_bytes())
    assert written["outcome"] == in_memory.verdict.outcome and written["reasons"] == in_memory.verdict.reasons


def test_compare_calls_no_regression_between_runs_of_one_server_and_catches_one_fifteen_percent_slower(
    tmp_path: Path,
) -> None:
    """Default soaks of a 32-slot server at 0.7 of capacity, written as run directories and compared by
    `compare`'s own code: same server, no regression; every latency 1.15×, a latency regression (which
    percentile shows it first varies: E2E p50 in 93 of 100 pairs, TPOT p50 in all)."""
    server = SERVERS["fifo-32x3s"]
    for seed in range(2):
        same = compare_pair(tmp_path, server, 0.7, Arrivals("poisson"), seed)
        limits = {"E2E p50": 0.10, "E2E p95": 0.10, "E2E p99": 0.15}  # the default thresholds
        assert not same.regressed and all(limits[m] <= d < 0.5 for m, d in same.detectable.items()), same
        worse = compare_pair(tmp_path, server, 0.7, Arrivals("poisson"), seed, factor=1.15)
        assert "TPOT p50" in worse.regressed and any(m.startswith("E2E") for m in worse.regressed), worse


def test_the_default_soak_passes_a_healthy_server_and_fails_an_overloaded_one() -> None:
    """The issue's first case: 32 slots, 3 s answers, at 0.7 and 0.85 of capacity (Poisson and bursty
    arrivals) failed 12-21% of default soaks; at 1.2 every soak must fail."""
    for arrivals in (Arrivals("poisson"), Arrivals("gamma", 0.5)):
        for load in (0.7, 0.85):
            result = tally(Cell(SERVERS["fifo-32x3s"], "soak", arrivals, load), SEEDS)
            assert result.share("pass") == 1.0, (arrivals, load, result.outcomes, result.reasons)
        overloaded = tally(Cell(SERVERS["fifo-32x3s"], "soak", arrivals, 1.2), SEEDS)
        assert overloaded.share("fail") == 1.0, (arrivals, overloaded.outcomes)


def test_a_one_slot_server_just_over_its_capacity_never_passes() -> None:
    """The issue's third case: one slot at 1.13 of capacity passed a search probe; it may not PASS a
    probe, a confirm or a soak (a hold too short to tell says so)."""
    server = SERVERS["fifo-1x8s"]
    for hold in ("probe", "confirm", "soak"):
        result = tally(Cell(server, hold, Arrivals("constant"), 1.13), range(20))  # type: ignore[arg-type]
        assert result.share("pass") == 0.0, (hold, result.outcomes, result.reasons)


def test_a_search_whose_passing_rate_is_over_the_capacity_answers_below_it() -> None:
    """A probe passes once it rules out a 10% overload, so a rate 3% over the capacity passed twice in
    these two searches (8 slots, 0.5 s answers, Poisson): the answer, what those holds show the
    server serves, is within [0.85, 1.0] of the capacity all the same."""
    server = SERVERS["fifo-8x0.5s-σ0.9"]
    for seed in (17, 30):
        outcome = run_search(server, Arrivals("poisson"), seed)
        assert outcome.passing is not None and outcome.passing > server.capacity_qps, (seed, outcome)
        assert outcome.answer is not None and 0.85 <= outcome.answer / server.capacity_qps <= 1.0, (seed, outcome)


def test_a_hold_too_short_to_tell_is_inconclusive_and_names_the_hold_it_needs() -> None:
    """The issue's fourth case, a 10 s hold: not a PASS on no evidence."""
    cell = Cell(SERVERS["fifo-32x3s"], "probe", Arrivals("poisson"), 0.5)
    hold = hold_plan("probe", cell.rate)
    stages = (*hold.stages[:-1], hold.stages[-1].model_copy(update={"duration_s": 10.0}))
    criteria = hold.criteria.model_copy(update={"drift": hold.criteria.drift.model_copy(update={"window_s": 10.0})})
    short = Hold(hold.kind, stages, criteria, hold.drain_s)
    manifest, frame = records(short, cell.server, "poisson", 1.0, seed=0)
    result, _ = judge(manifest, frame, short.criteria)
    assert result.verdict.outcome == "inconclusive" and "keeping_up" in result.verdict.inconclusive_kinds
    keeping_up = next(c for c in result.checks if c.name == "keeping up")
    assert "hold at least 60 s" in keeping_up.detail, keeping_up.detail
