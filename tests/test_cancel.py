"""Streams cut on purpose (`--cancel-share`, `--cancel-after`), as users who close a tab: the same requests
cut at the same place by every worker and rerun, recorded `abandoned` (no failure, never judged), and the
check that matters: the server lets go of what they held. The embedded engine aborts a stream whose client
left, as vLLM does, and passes; with `--no-abort-on-disconnect` it generates on for no one, and fails."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmload.cancel import CancelPlan, held_excess
from llmload.errors import InputError
from llmload.observe.metrics import parse_metrics
from llmload.sim.process import SimProcess
from tests.locust_runs import LocustRun, fixed_output_workload, run_locust

ENGINE = ("--profile", "vllm-cpu-tiny", "--max-num-seqs", "64")


def test_a_plan_cuts_the_same_requests_at_the_same_place() -> None:
    plan = CancelPlan.parse(0.2, "tokens:lognormal:median=32,sigma=0.5")
    assert plan is not None
    cuts = [plan.cut_for(f"s{i}", i % 3) for i in range(20_000)]
    cut = [c for c in cuts if c is not None]
    assert abs(len(cut) / len(cuts) - 0.2) < 0.01
    assert all(c.tokens is not None and c.tokens >= 1 and c.seconds is None for c in cut)
    assert 28 <= float(np.median([c.tokens for c in cut if c.tokens])) <= 36
    assert [plan.cut_for(f"s{i}", i % 3) for i in range(300)] == cuts[:300]  # every worker, every rerun
    seconds = CancelPlan.parse(0.5, "seconds:2")
    assert seconds is not None and {c.seconds for c in map(seconds.cut_for, "abcdefgh", range(8)) if c} == {2.0}
    assert CancelPlan.parse(0.0, None) is None
    for share, after, says in (
        (0.1, None, "--cancel-share needs --cancel-after"),
        (0.0, "tokens:4", "--cancel-after needs --cancel-share"),
        (0.1, "bytes:4", "give tokens:DISTRIBUTION or seconds:DISTRIBUTION"),
        (0.1, "tokens:lognormal:median=-1,sigma=1", "--cancel-after"),
    ):
        with pytest.raises(InputError, match=says):
            CancelPlan.parse(share, after)


def test_what_the_server_holds_beyond_the_run_is_measured_against_its_own_in_flight() -> None:
    sent = np.array([0.0, 0.0, 1.0, 1.0])
    finished = np.array([2.0, 0.5, 3.0, 1.2])
    t = np.array([0.2, 0.7, 1.1, 1.5, 2.5, 4.0])
    in_flight = np.array([2, 1, 3, 2, 1, 0])
    assert held_excess(t, in_flight.astype(float), np.zeros(6), sent, finished) == 0.0  # a server that lets go
    leaked = in_flight + np.array([0, 1, 1, 2, 2, 2])  # the cut streams it generates on for
    # the 4 s sample, the run having nothing in flight, is not counted (a stale gauge after the run is no leak)
    assert held_excess(t, leaked.astype(float), np.zeros(6), sent, finished) == 1.0
    assert held_excess(t, np.full(6, np.nan), np.zeros(6), sent, finished) is None


def _cut_run(tmp_path: Path, *sim_flags: str, output_tokens: int) -> tuple[LocustRun, dict[str, float]]:
    with SimProcess(*ENGINE, *sim_flags) as sim:
        run = run_locust(
            sim.url, fixed_output_workload(tmp_path, output_tokens, sessions=200), tmp_path / "reports", "cut",
            "--target-qps", "6", "--stages", "100", "--stage-duration", "12", "--warmup", "0", "--arrival", "constant",
            "--cancel-share", "0.4", "--cancel-after", "tokens:4", "--verdict", timeout=120,
        )  # fmt: skip
        with urllib.request.urlopen(sim.url + "/metrics") as page:
            metrics = page.read().decode()
    aborted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' in line
    )
    return run, {"aborted": aborted, **parse_metrics(metrics)}


def _release_check(run: LocustRun) -> str:
    """The verdict's line of the release check: "PASS release after cancelled streams: ..."."""
    return next(line for line in run.summary["verdict"]["reasons"] if " release after cancelled streams: " in line)


def _followers(records: pd.DataFrame) -> pd.Series:
    """Which successful requests were sent within an E2E p50 after a cut stream ended, counted pair by pair."""
    ok = records[records.status == "ok"]
    cuts = records.finished_at[records.status == "abandoned"].to_numpy()
    window = ok.e2e_ms.median() / 1000
    return ok.sent_at.apply(lambda sent: bool(((cuts >= sent - window) & (cuts < sent)).any()))


def _aftermath_holds(run: LocustRun) -> dict:
    """summary.json's cut_aftermath against a recount from the records."""
    after = run.summary["cut_aftermath"]
    follows = _followers(run.records)
    ok = run.records[run.records.status == "ok"]
    assert after["after"] == int(follows.sum()) > 0 and after["rest"] == int((~follows).sum()), after
    assert after["tpot_p50_after_ms"] == pytest.approx(ok.tpot_ms[follows].median())
    if after["rest"]:
        assert after["ttft_p50_rest_ms"] == pytest.approx(ok.ttft_ms[~follows].median())
    else:  # every request followed a cut: nothing to hold them against, and no figure for the rest
        assert after["ttft_p50_rest_ms"] is None
    return after


def test_cut_streams_are_abandoned_and_a_server_that_aborts_them_lets_go(tmp_path: Path) -> None:
    run, server = _cut_run(tmp_path, output_tokens=120)
    records = run.records
    abandoned = records[records.status == "abandoned"]
    sent = records[records.sent_at.notna()]
    assert 0.3 < len(abandoned) / len(sent) < 0.5, (len(abandoned), len(sent))
    assert (abandoned.output_tokens == 4).all() and abandoned.error_message.str.startswith("cut by the plan").all()
    assert (records[records.status != "abandoned"].status == "ok").all()  # none is charged to the server
    assert server["aborted"] == len(abandoned)  # the server saw each cut as its client going away
    summary = run.summary
    assert summary["requests"]["abandoned"] == len(abandoned) and summary["requests"]["failed"] == 0
    assert summary["cancel"] == {"share": 0.4, "after": "tokens:4"} == run.manifest["cancel"]
    release = summary["server_release"]
    assert release["released"] is True and release["running"] == 0
    check = _release_check(run)
    assert check.startswith("PASS "), check
    after = _aftermath_holds(run)
    assert after["rest"] > 0
    report = (run.run_dir / "report.md").read_text()
    assert "Cut by the plan: " in report and f"The {after['after']} requests sent within " in report


def test_a_server_that_generates_on_for_cut_streams_fails(tmp_path: Path) -> None:
    run, server = _cut_run(tmp_path, "--no-abort-on-disconnect", output_tokens=400)
    assert server["aborted"] == 0
    check = _release_check(run)
    assert check.startswith("FAIL ") and "beyond the run's own in flight" in check, check
    assert run.summary["verdict"]["outcome"] == "fail"
    _aftermath_holds(run)  # 2.4 cuts a second, each followed for a 2 s E2E: every request follows one
