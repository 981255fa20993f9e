"""Goodput: per-request SLOs (DistServe's rule) on records with known values, the verdict's
--min-goodput-ratio, compare's goodput rows, and one real run against the simulator."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from llmload import rundir
from llmload.conclude import conclude, judge
from llmload.errors import InputError
from llmload.gates import compare
from llmload.gates.criteria import SoakCriteria
from llmload.models import GoodputSLO, RequestRecord, RunManifest
from llmload.recordlog import RecordWriter
from llmload.records import RunRecords
from llmload.report.goodput import conforming, good_requests
from llmload.rundir import MANIFEST_FILE, PARQUET_FILE, RECORDS_FILE
from llmload.schedule import build_stages
from llmload.sim.process import SimProcess
from tests.locust_runs import run_locust, small_workload

STARTED_AT = 1_800_000_000.0
SLO = GoodputSLO(ttft_ms=2000, tpot_ms=50, itl_ms=100, e2e_ms=30_000)  # ITL: each request's max gap

# (stage, status, ttft, tpot, e2e, itl gaps, output tokens), sent one per second from the stage's start
KNOWN: list[tuple[str, str, float | None, float | None, float | None, list[float], int | None]] = [
    ("warm-up", "ok", 100, 10, 500, [10, 10], 3),  # good, but the warm-up is never judged
    ("100%", "ok", 100, 10, 500, [10, 10, 10, 50], 5),  # good
    ("100%", "ok", 3000, 10, 3400, [10, 10], 3),  # TTFT over
    ("100%", "ok", 100, 20, 600, [5, 5, 200], 4),  # max gap over (its p50 is 5)
    ("100%", "failed", None, None, None, [], None),  # failed: counts against
    ("100%", "cancelled", 100, None, None, [10], None),  # cut by the run: left out
    ("100%", "not_sent", None, None, None, [], None),  # never sent: left out
    ("100%", "ok", 120, None, 120, [], 1),  # one token: no TPOT, no gaps, not held against it
    ("100%", "ok", 100, 10, 40_000, [10, 10], 3),  # E2E over
]


def write_known_run(run_dir: Path, slo: GoodputSLO | None = SLO) -> Path:
    stages = build_stages(1, (100,), 10, None, warmup_s=2)
    manifest = RunManifest(
        run_id=run_dir.name, host="http://generated", model="m", workload="w.yaml", arrival="constant",
        burstiness=1, seed=0, target_qps=1, stages=stages, drain_s=30, started_at=STARTED_AT, workers=1,
        limits={}, finished_at=STARTED_AT + 12, goodput_slo=slo,
    )  # fmt: skip
    run_dir.mkdir(parents=True)
    (run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(manifest.model_dump(mode="json")))
    writer = RecordWriter(run_dir / RECORDS_FILE)
    starts = {s.name: STARTED_AT + s.start_s for s in stages}
    for i, (stage, status, ttft, tpot, e2e, gaps, output) in enumerate(KNOWN):
        sent = starts[stage] + 0.5 + (i - 1) * (stage != "warm-up")
        writer.write(
            [
                RequestRecord(
                    run_id=run_dir.name, worker=0, stage=stage, session_id=f"s{i}", turn=0, scheduled_at=sent,
                    sent_at=None if status == "not_sent" else sent, ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e,
                    itl_ms=gaps, output_tokens=output, prompt_tokens=10, status=status,  # type: ignore[arg-type]
                    error_category="timeout" if status == "failed" else None,
                )
            ]
        )  # fmt: skip
    writer.close()
    return run_dir


def test_a_request_is_good_only_when_it_met_every_slo(tmp_path: Path) -> None:
    run_dir = write_known_run(tmp_path / "known")
    records = rundir.load(run_dir).records
    good = good_requests(records, SLO)
    assert good is not None
    assert good.tolist() == [True, True, False, False, False, False, False, True, False]

    summary = conclude(run_dir)
    warmup, hold = summary.stages
    assert warmup.goodput is not None and warmup.goodput.requests_per_s == 1 / 2
    assert hold.goodput is not None
    # 2 good of 6 answered (ok or failed); the cancelled and the never-sent are in neither
    assert hold.goodput.requests_per_s == pytest.approx(2 / 10)
    assert hold.goodput.output_tokens_per_s == pytest.approx((5 + 1) / 10)
    assert hold.goodput.slo_attainment == pytest.approx(2 / 6)
    overall = summary.throughput.goodput
    assert overall is not None and overall.slo_attainment == pytest.approx(2 / 6)  # the warm-up left out
    report = (run_dir / "report.md").read_text()
    assert "## Goodput" in report and "ITL max of each request ≤ 100 ms" in report and "33.3%" in report
    assert "Goodput" in (run_dir / "report.html").read_text()


def test_a_request_that_never_answered_misses_a_ttfo_slo_and_only_that() -> None:
    """No TTFO (it thought until its budget ran out) is no answer; no TPOT (one token) is no gap."""
    frame = pd.DataFrame(
        {"status": ["ok", "ok", "ok"], "ttft_ms": [50.0, 50.0, 50.0], "ttfo_ms": [400.0, float("nan"), 50.0],
         "tpot_ms": [5.0, 5.0, float("nan")], "e2e_ms": [900.0, 900.0, 60.0]}
    )  # fmt: skip
    assert conforming(frame, GoodputSLO(ttfo_ms=1000)).tolist() == [True, False, True]
    assert conforming(frame, GoodputSLO(ttft_ms=1000, tpot_ms=10)).tolist() == [True, True, True]


def test_an_itl_percentile_slo_judges_each_requests_own_gaps(tmp_path: Path) -> None:
    records = rundir.load(write_known_run(tmp_path / "known")).records
    good = good_requests(records, GoodputSLO(itl_ms=100, itl_stat="p50"))
    assert good is not None and bool(good.iloc[3])  # its median gap is 5 ms, its max 200

    rng = np.random.default_rng(3)
    gap_lists = [rng.lognormal(2, 1, rng.integers(0, 40)).astype(np.float32).tolist() for _ in range(60)]
    run_dir = tmp_path / "random"
    run_dir.mkdir()
    writer = RecordWriter(run_dir / RECORDS_FILE)
    writer.write(
        RequestRecord(run_id="r", worker=0, stage="s", session_id=str(i), turn=0, scheduled_at=0, itl_ms=gaps,
                      status="ok")
        for i, gaps in enumerate(gap_lists)
    )  # fmt: skip
    writer.close()
    random = RunRecords.load(run_dir / RECORDS_FILE, run_dir / PARQUET_FILE)
    selected = np.ones(len(gap_lists), dtype=bool)
    selected[7] = False
    for percentile in (50.0, 99.0, None):
        measured = random.itl_per_request(selected, percentile)
        for i, gaps in enumerate(gap_lists):
            if not gaps or i == 7:
                assert np.isnan(measured[i])
            else:
                expected = max(gaps) if percentile is None else np.percentile(np.float32(gaps), percentile)
                assert measured[i] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttf=200", "no per-request metric 'ttf'; known: ttft, ttfo, tpot, itl, e2e"),
        ("ttft:p99=200", "ttft is one value per request, so it has no statistic 'p99'"),
        ("itl:p42=20", "itl has no statistic 'p42'; known: p50, p90, p95, p99, max"),
        ("ttft<2000", "expected METRIC=MS"),
        ("e2e=soon", "'soon' is not a number"),
        ("tpot=-1", "tpot_ms: Input should be greater than 0"),
    ],
)
def test_an_slo_on_a_metric_or_statistic_that_does_not_exist_is_refused(spec: str, message: str) -> None:
    with pytest.raises(InputError, match="--goodput-slo") as error:
        GoodputSLO.parse([spec])
    assert message in str(error.value)


def test_slo_specs_combine() -> None:
    assert GoodputSLO.parse(["ttft=2000,tpot=50", "itl:p99=80"]) == GoodputSLO(
        ttft_ms=2000, tpot_ms=50, itl_ms=80, itl_stat="p99"
    )


def test_min_goodput_ratio_judges_the_hold(tmp_path: Path) -> None:
    run_dir = write_known_run(tmp_path / "known")

    def check(ratio: float | None, directory: Path = run_dir) -> tuple[str, str]:
        result = judge(directory, SoakCriteria(min_goodput_ratio=ratio))
        found = next(c for c in result.checks if c.name == "goodput ratio")
        return found.status, found.detail

    assert check(None)[0] == "skip"
    assert check(0.3) == ("pass", check(0.3)[1]) and "33.3% of the answered requests met every SLO" in check(0.3)[1]
    assert check(0.5)[0] == "fail"
    status, detail = check(0.5, write_known_run(tmp_path / "no-slo", slo=None))
    assert status == "fail" and "no goodput SLO" in detail


def test_compare_counts_both_runs_against_one_goodput_rule(tmp_path: Path) -> None:
    base = write_known_run(tmp_path / "base")
    current = shutil.copytree(base, tmp_path / "current")
    slo, notes = compare.common_goodput_slo(rundir.read_manifest(base), rundir.read_manifest(current))
    assert slo == SLO and notes == []
    comparison = compare.compare_runs(compare.load_run(base, slo), compare.load_run(current, slo), compare.Thresholds())
    rows = {r.metric: r for r in comparison.rows}
    assert rows["goodput"].current == pytest.approx(2 / 10) and rows["goodput"].regressed is False
    assert rows["goodput output"].baseline == pytest.approx(6 / 10)
    without = compare.compare_runs(compare.load_run(base), compare.load_run(current), compare.Thresholds())
    assert "goodput" not in {r.metric for r in without.rows}


def _good_by_hand(records: Any, e2e_ms: float, itl_max_ms: float) -> int:
    """The same rule, computed from requests.jsonl's full gap lists in plain Python."""
    return sum(
        1
        for r in records.itertuples()
        if r.status == "ok" and r.e2e_ms <= e2e_ms and max(r.itl_ms, default=0) <= itl_max_ms
    )


def test_a_real_run_reports_goodput_and_fails_a_ratio_it_misses(tmp_path: Path) -> None:
    """Outputs of varied length at 10 ms a token: an E2E SLO of 150 ms leaves the long ones out."""
    with SimProcess("--ttft-ms", "20", "--itl-ms", "10") as sim:
        run = run_locust(
            sim.url, small_workload(tmp_path), tmp_path / "reports", "goodput", "--target-qps", "8",
            "--stages", "100", "--stage-duration", "6", "--warmup", "0", "--arrival", "constant",
            "--goodput-slo", "e2e=150,itl=60", "--verdict", "--min-goodput-ratio", "0.99",
        )  # fmt: skip
    assert run.returncode == 1, run.output[-3000:]
    summary, records = run.summary, run.records
    stage = summary["stages"][-1]
    answered = int(records.status.isin(["ok", "failed"]).sum())
    good = _good_by_hand(records, 150, 60)
    assert 0 < good < answered
    assert stage["goodput"]["requests_per_s"] == pytest.approx(good / 6, abs=0.34)  # by send window vs all
    assert summary["throughput"]["goodput"]["slo_attainment"] == pytest.approx(good / answered)
    assert summary["run"]["goodput_slo"] == {"ttft_ms": None, "ttfo_ms": None, "tpot_ms": None, "itl_ms": 60.0,
                                             "itl_stat": "max", "e2e_ms": 150.0}  # fmt: skip
    assert any(r.startswith("FAIL goodput ratio") for r in summary["verdict"]["reasons"])


def test_a_goodput_ratio_without_slos_or_a_bad_slo_is_refused_before_the_run(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    for flags, message in (
        (("--verdict", "--min-goodput-ratio", "0.9"), "--min-goodput-ratio needs"),
        (("--goodput-slo", "queue=5"), "no per-request metric 'queue'"),
    ):
        run = run_locust(
            "http://127.0.0.1:9", workload, tmp_path / "reports", "refused", "--target-qps", "1", *flags, timeout=60
        )
        assert run.returncode == 2 and message in run.output, run.output[-2000:]
