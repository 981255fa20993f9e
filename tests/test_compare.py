"""`llmload compare` on real short runs against the simulator: noise passes, a slower TTFT fails."""

from __future__ import annotations

import itertools
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from llmload.cli import main
from llmload.gates import compare
from llmload.rundir import RECORDS_FILE
from llmload.sim.process import SimProcess
from tests.locust_runs import run_locust, small_workload

FLAGS = ("--target-qps", "12", "--stage-duration", "2", "--arrival", "constant")
REPEATS = 8  # runs of one target: 28 pairs


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    """REPEATS runs of one simulator (only noise differs), four at a time, and one of a simulator with
    40 ms more TTFT beside the first four: each mostly waits for its 8 s plan."""
    directory = tmp_path_factory.mktemp("compare")
    workload = small_workload(directory)
    with (
        SimProcess("--ttft-ms", "20", "--itl-ms", "20") as fast,
        SimProcess("--ttft-ms", "60", "--itl-ms", "20") as slow,
        ThreadPoolExecutor(4) as pool,
        ThreadPoolExecutor(1) as beside,
    ):
        slower = beside.submit(run_locust, slow.url, workload, directory / "reports", "slow", *FLAGS)
        futures = [
            pool.submit(run_locust, fast.url, workload, directory / "reports", f"run{i}", *FLAGS)
            for i in range(REPEATS)
        ]
        done = [*(future.result() for future in futures), slower.result()]
    for run in done:
        assert run.returncode == 0, run.output[-3000:]
    return [run.run_dir for run in done[:-1]], done[-1].run_dir


@pytest.fixture(scope="module")
def runs(repeated: tuple[list[Path], Path]) -> dict[str, Path]:
    """Two runs of one simulator (only noise differs) and one of a simulator with 40 ms more TTFT."""
    same, slow = repeated
    return {"base": same[0], "again": same[1], "slow": slow}


def _compare(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main(["compare", *(str(a) for a in argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _compare_with_thresholds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, thresholds_yaml: str, base: Path, other: Path
) -> tuple[int, str, str]:
    """`llmload compare base other --thresholds FILE`, FILE holding `thresholds_yaml`."""
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text(thresholds_yaml)
    return _compare(capsys, base, other, "--thresholds", thresholds)


def _results(out: str) -> dict[str, str]:
    """metric → result column of the stdout table."""
    rows = {}
    for line in out.splitlines():
        for metric in ("TTFT", "ITL", "TPOT", "E2E"):
            for q in ("p50", "p95", "p99"):
                if line.startswith(f"{metric} {q} (ms)"):
                    rows[f"{metric} {q}"] = line.split()[-1]
    return rows


def test_two_runs_of_the_same_target_differ_but_do_not_regress(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _compare(capsys, runs["base"], runs["again"])
    assert code == 0, out
    base, again = (compare.load_run(runs[n]).summary.latency_ms for n in ("base", "again"))
    assert base.ttft.p50 != again.ttft.p50 and base.itl.p99 != again.itl.p99  # the noise is real
    assert set(_results(out).values()) == {"ok"}, out
    assert "No regression" in out and "could not tell" in out
    # each figure says the smallest change these runs could have called a regression: at least its limit
    comparison = compare.compare_runs(
        compare.load_run(runs["base"]), compare.load_run(runs["again"]), compare.Thresholds()
    )
    for row in comparison.rows:
        if row.ci is not None and row.unit == "ms":
            assert row.detectable is not None and row.detectable >= row.limit, row


def test_a_slower_first_token_is_a_ttft_regression_and_itl_is_not(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    markdown = tmp_path / "gate.md"
    code, out, _ = _compare(capsys, runs["base"], runs["slow"], "--markdown", markdown)
    assert code == 1, out
    results = _results(out)
    assert results["TTFT p50"] == results["TTFT p95"] == "REGRESSION", out
    assert all(results[f"ITL {q}"] == "ok" for q in ("p50", "p95", "p99")), out
    assert all(results[f"TPOT {q}"] == "ok" for q in ("p50", "p95", "p99")), out
    table = markdown.read_text()
    assert "regression gate: **FAIL**" in table
    assert "| metric | baseline | current | Δ | Δ % | CI of Δ | allowed | detectable | result |" in table
    ttft = next(line for line in table.splitlines() if line.startswith("| TTFT p50 (ms) |"))
    assert ttft.endswith("| **REGRESSION** |")
    delta = float(ttft.split("|")[4])
    assert 35 < delta < 45  # the simulator's 40 ms


def test_engine_deaths_regress_error_rate_oom_family_and_throughput(runs: dict[str, Path], tmp_path: Path) -> None:
    """The second run's records with every fifth request turned into vLLM's EngineDeadError."""
    broken = tmp_path / "broken"
    shutil.copytree(runs["again"], broken)
    lines = []
    for i, line in enumerate((broken / RECORDS_FILE).read_bytes().splitlines()):
        record = orjson.loads(line)
        if i % 5 == 0:
            record.update(
                status="failed", error_category="engine_dead", http_status=500, first_token_at=None, ttft_ms=None,
                e2e_ms=None, tpot_ms=None, itl_ms=[], output_tokens=None,
            )  # fmt: skip
        lines.append(orjson.dumps(record) + b"\n")
    (broken / RECORDS_FILE).write_bytes(b"".join(lines))
    comparison = compare.compare_runs(compare.load_run(runs["base"]), compare.load_run(broken), compare.Thresholds())
    regressed = {r.metric for r in comparison.regressions}
    assert {"error rate", "OOM-family failures", "throughput"} <= regressed, compare.render_text(comparison)
    assert not any(m.startswith(("ITL", "TPOT")) for m in regressed)


def test_a_misspelt_threshold_key_is_named(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    yaml = "latency_rise:\n  p99: 0.2\nthroughput_dorp: 0.1\n"
    code, out, err = _compare_with_thresholds(capsys, tmp_path, yaml, runs["base"], runs["again"])
    assert code == 2 and not out
    assert "throughput_dorp: unknown key" in err


def test_looser_thresholds_from_yaml_let_the_slower_run_pass(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    yaml = "latency_floor_ms: {ttft: 100, e2e: 100}\n"
    code, out, _ = _compare_with_thresholds(capsys, tmp_path, yaml, runs["base"], runs["slow"])
    assert code == 0, out


@pytest.mark.parametrize("bad", ["missing", "not-a-run"])
def test_not_a_run_directory_is_bad_input(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, bad: str
) -> None:
    path = tmp_path / bad
    if bad == "not-a-run":
        path.mkdir()
    code, _, err = _compare(capsys, runs["base"], path)
    assert code == 2 and "is not a run directory" in err


def test_repeated_runs_of_one_simulator_raise_at_most_five_percent_false_alarms(
    repeated: tuple[list[Path], Path],
) -> None:
    """Every pair of eight runs of one simulator, compared with the default limits: the gate calls
    at most 5% of them a regression (1 of 28), though no two runs measure the same numbers."""
    samples = [compare.load_run(run_dir) for run_dir in repeated[0]]
    assert len(samples) == REPEATS == 8
    assert len({s.summary.latency_ms.ttft.p50 for s in samples}) > 1  # the noise is real
    alarms = [
        [row.metric for row in compare.compare_runs(a, b, compare.Thresholds()).regressions]
        for a, b in itertools.combinations(samples, 2)
    ]
    flagged = [metrics for metrics in alarms if metrics]
    assert len(flagged) <= 0.05 * len(alarms), flagged
