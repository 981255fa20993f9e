"""The soak verdict: real short runs against the simulator (pass, and fail on real engine deaths),
and run directories whose records and server samples are generated, for drift and alerts."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest

from llmload.conclude import conclude, judge
from llmload.errors import InputError
from llmload.gates.criteria import SoakCriteria, add_criteria_arguments, criteria_from_args
from llmload.gates.verdict import SoakResult
from llmload.models import RequestRecord, RunManifest, StageSummary
from llmload.recordlog import RecordWriter
from llmload.report.warnings import shortfall_reason
from llmload.rundir import MANIFEST_FILE, RECORDS_FILE, SERVER_FILE
from llmload.schedule import build_stages
from llmload.sim.process import SimProcess
from tests.locust_runs import run_locust, small_workload

CHECKS = [
    "OOM-family failures", "error rate", "finished", "achieved rate", "keeping up", "hold length", "p99 TTFT SLO",
    "p99 TTFO SLO", "p99 E2E SLO", "goodput ratio", "prefix-cache hit rate",
    "p99 TTFT drift", "p99 E2E drift", "KV-cache usage drift", "waiting-queue drift", "preemption-rate drift",
    "KV-cache usage alert", "waiting-queue alert", "p99 E2E alert", "GPU memory alert", "prefix-cache hit-rate alert",
]  # fmt: skip
STARTED_AT = 1_800_000_000.0
HOLD_S = 120.0
RAMP_S = 10.0

Curve = Callable[[np.ndarray], np.ndarray]  # seconds into the hold -> value


def _status(result: SoakResult, name: str) -> str:
    return next(c.status for c in result.checks if c.name == name)


# --------------------------------------------------------------------------- generated runs


def write_run(
    run_dir: Path,
    *,
    ttft_ms: Curve = lambda t: np.full_like(t, 100.0),
    noise: float = 0.1,
    seed: int = 0,
    server: dict[str, Curve] | None = None,
    gpu_memory: Curve | None = None,
    capacity_qps: float | None = None,
    drain_s: float = 30.0,
) -> Path:
    """A run directory as Locust writes it: a 10 s ramp stage, then a 120 s hold at 6 req/s,
    constant arrivals, every request ok; TTFT follows `ttft_ms` times lognormal noise, E2E adds
    200 ms of decode. `server` curves become 1 Hz server.jsonl samples over the whole run, with two
    80 GB GPUs when `gpu_memory` gives GPU 0's memory used / total (GPU 1 stays at half).
    `capacity_qps`: the target serves one request at a time, each in 1 / capacity seconds, first come
    first served (the wait is in TTFT and E2E); one not done when the drain ends is `unfinished`."""
    rng = np.random.default_rng(seed)
    stages = build_stages(4, (100, 150), RAMP_S, HOLD_S)
    manifest = RunManifest(
        run_id=run_dir.name, host="http://generated", model="m", workload="w.yaml", arrival="constant",
        burstiness=1, seed=seed, target_qps=4, stages=stages, drain_s=drain_s,
        started_at=STARTED_AT, workers=1, limits={}, finished_at=STARTED_AT + RAMP_S + HOLD_S + 1,
    )  # fmt: skip
    run_dir.mkdir(parents=True)
    (run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(manifest.model_dump(mode="json")))
    writer = RecordWriter(run_dir / RECORDS_FILE)
    drain_ends = STARTED_AT + RAMP_S + HOLD_S + drain_s
    free_at = 0.0  # when the one-at-a-time target is next free
    for stage in stages:
        offsets = stage.start_s + np.arange(0, stage.duration_s, 1 / stage.qps)
        into_hold = np.maximum(offsets - RAMP_S, 0)
        ttft = ttft_ms(into_hold) * rng.lognormal(0, noise, offsets.size)
        e2e = ttft + 200
        sent = STARTED_AT + offsets + 0.001
        records = []
        for i, (s, alone_f, alone_e) in enumerate(zip(sent.tolist(), ttft.tolist(), e2e.tolist(), strict=True)):
            f, e = alone_f, alone_e
            if capacity_qps is not None:
                begin = max(s, free_at)
                free_at = begin + 1 / capacity_qps
                f, e = alone_f + (begin - s) * 1000, (free_at - s) * 1000
            unfinished = s + e / 1000 > drain_ends
            ran = (drain_ends - s) * 1000
            records.append(
                RequestRecord(
                    run_id=run_dir.name,
                    worker=0,
                    stage=stage.name,
                    session_id=f"{stage.name}-{i}",
                    turn=0,
                    scheduled_at=s - 0.001,
                    sent_at=s,
                    first_token_at=None if f > ran else s + f / 1000,
                    finished_at=s + min(e, ran) / 1000,
                    schedule_delay_ms=1,
                    ttft_ms=None if f > ran else f,
                    e2e_ms=min(e, ran),
                    tpot_ms=None if unfinished else 10,
                    itl_ms=[] if unfinished else [10.0] * 20,
                    prompt_tokens=100,
                    output_tokens=None if unfinished else 21,
                    status="unfinished" if unfinished else "ok",
                    error_category="unfinished" if unfinished else None,
                    error_message="still running when the drain after the plan ended" if unfinished else None,
                )
            )
        writer.write(records)
    writer.close()
    if server is not None:
        t = np.arange(0, RAMP_S + HOLD_S)
        columns = {name: curve(np.maximum(t - RAMP_S, 0)) for name, curve in server.items()}
        used = gpu_memory(np.maximum(t - RAMP_S, 0)) if gpu_memory is not None else None
        lines = [
            {
                "t": STARTED_AT + ti, "health": 200, "running": 3, **{k: float(v[i]) for k, v in columns.items()},
                "gpus": [] if used is None else [
                    {"gpu": str(g), "memory_used_mib": share * 81_559, "memory_total_mib": 81_559}
                    for g, share in enumerate((float(used[i]), 0.5))
                ],
            }
            for i, ti in enumerate(t.tolist())
        ]  # fmt: skip
        (run_dir / SERVER_FILE).write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return run_dir


def flat(level: float) -> Curve:
    return lambda t: np.full_like(t, level, dtype=float)


def ramp(start: float, end: float) -> Curve:
    return lambda t: start + (end - start) * t / HOLD_S


def wobble(curve: Curve, amplitude: float, seed: int = 0) -> Curve:
    rng = np.random.default_rng(seed)
    return lambda t: curve(t) + rng.normal(0, amplitude, np.shape(t))


HEALTHY_SERVER = {"kv_cache_usage": wobble(flat(0.4), 0.03), "waiting": flat(0), "preemptions_total": flat(0)}


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_is_no_drift(tmp_path: Path, seed: int) -> None:
    server = {**HEALTHY_SERVER, "kv_cache_usage": wobble(flat(0.4), 0.05, seed)}
    result = judge(write_run(tmp_path / "noisy", noise=0.3, seed=seed, server=server), SoakCriteria())
    assert result.verdict.passed, result.verdict.reasons
    assert [c.name for c in result.checks] == CHECKS
    assert all(c.status == "pass" for c in result.checks if "drift" in c.name), result.verdict.reasons


def test_latency_growing_over_the_hold_is_drift(tmp_path: Path) -> None:
    result = judge(write_run(tmp_path / "growing", ttft_ms=ramp(100, 200), server=HEALTHY_SERVER), SoakCriteria())
    assert not result.verdict.passed
    assert _status(result, "p99 TTFT drift") == "fail"
    assert _status(result, "KV-cache usage drift") == "pass"
    line = next(r for r in result.verdict.reasons if r.startswith("FAIL p99 TTFT drift"))
    assert "over the 120 s hold" in line and "CI +" in line, line


def test_windows_slowed_by_other_work_on_the_machine_are_left_out_of_drift(tmp_path: Path) -> None:
    """A neighbour takes the load generator's machine for the hold's second half and TTFT rises with
    it (client and a local target slowed alike): left out, not the target's drift. The same rise on
    a quiet machine, or a neighbour that came and went with no rise, changes nothing."""
    stepped: Curve = lambda t: np.where(t < 60, 100.0, 200.0)  # noqa: E731
    ours = {"host_cpu_run": flat(0.3), "host_cpu_steal": flat(0.0)}
    quiet = {**HEALTHY_SERVER, **ours, "host_cpu_busy": flat(0.35)}
    busy: Curve = lambda t: np.where(t < 60, 0.35, 1.0)  # noqa: E731
    neighbour = {**HEALTHY_SERVER, **ours, "host_cpu_busy": busy}
    assert _status(judge(write_run(tmp_path / "quiet", ttft_ms=stepped, server=quiet), SoakCriteria()),
                   "p99 TTFT drift") == "fail"  # fmt: skip
    result = judge(write_run(tmp_path / "busy", ttft_ms=stepped, server=neighbour), SoakCriteria())
    check = next(c for c in result.checks if c.name == "p99 TTFT drift")
    assert check.status == "pass" and "6 window(s) left out: other work took up to 70%" in check.detail
    # steal counts the same way: the hypervisor gave the CPU to other guests
    stolen = {**quiet, "host_cpu_steal": lambda t: np.where(t < 60, 0.0, 0.2)}
    check = next(c for c in judge(write_run(tmp_path / "steal", ttft_ms=stepped, server=stolen), SoakCriteria()).checks
                 if c.name == "p99 TTFT drift")  # fmt: skip
    assert check.status == "pass" and "left out" in check.detail


def test_a_drift_over_its_limit_only_at_the_estimate_is_marginal(tmp_path: Path) -> None:
    """+22% against a 20% limit: over it at the slope's estimate, not at its interval's low end, so a
    search asks again; doubling is over it at both ends and decides; another failure beside a
    marginal drift decides too."""
    criteria = SoakCriteria()
    near = judge(write_run(tmp_path / "near", ttft_ms=ramp(100, 122), server=HEALTHY_SERVER, noise=0.05), criteria)
    check = next(c for c in near.checks if c.name == "p99 TTFT drift")
    assert check.status == "fail" and check.marginal and "marginal:" in check.detail
    assert not near.verdict.passed and near.verdict.marginal
    far = judge(write_run(tmp_path / "far", ttft_ms=ramp(100, 200), server=HEALTHY_SERVER), criteria)
    assert _status(far, "p99 TTFT drift") == "fail" and not far.verdict.marginal
    queue = {**HEALTHY_SERVER, "waiting": ramp(0, 6)}
    both = judge(write_run(tmp_path / "both", ttft_ms=ramp(100, 122), server=queue, noise=0.05), criteria)
    assert _status(both, "waiting-queue drift") == "fail" and not both.verdict.marginal


def test_a_significant_but_small_rise_is_no_drift(tmp_path: Path) -> None:
    """+10% over the hold with little noise: the slope is surely positive, yet under the 20% limit."""
    result = judge(write_run(tmp_path / "small", ttft_ms=ramp(100, 110), noise=0.01), SoakCriteria())
    check = next(c for c in result.checks if c.name == "p99 TTFT drift")
    assert check.status == "pass" and "CI +" in check.detail, check.detail
    assert result.verdict.passed


def test_server_signals_drift_and_a_missing_server_file_is_skipped(tmp_path: Path) -> None:
    server = {"kv_cache_usage": wobble(ramp(0.3, 0.6), 0.02), "waiting": ramp(0, 6), "preemptions_total": flat(0)}
    result = judge(write_run(tmp_path / "filling", server=server), SoakCriteria())
    assert _status(result, "KV-cache usage drift") == "fail"
    assert _status(result, "waiting-queue drift") == "fail"
    assert _status(result, "preemption-rate drift") == "pass"

    bare = judge(write_run(tmp_path / "bare"), SoakCriteria())
    assert bare.verdict.passed
    for name in ("KV-cache usage drift", "waiting-queue drift", "preemption-rate drift", "KV-cache usage alert"):
        assert _status(bare, name) == "skip"


def test_preemption_rate_growing_is_drift_and_counter_resets_are_not(tmp_path: Path) -> None:
    # a counter whose rate rises from 0 to 2/s over the hold (cumulative: t^2 / 120)
    growing = {**HEALTHY_SERVER, "preemptions_total": lambda t: np.floor(t**2 / HOLD_S)}
    assert _status(judge(write_run(tmp_path / "g", server=growing), SoakCriteria()), "preemption-rate drift") == "fail"
    # a steady 1/s whose counter restarts from 0 once (a server restart) mid-hold
    reset = {**HEALTHY_SERVER, "preemptions_total": lambda t: np.where(t < 60, t, t - 60)}
    assert _status(judge(write_run(tmp_path / "r", server=reset), SoakCriteria()), "preemption-rate drift") == "pass"


def test_alert_levels_warn_by_default_and_fail_when_asked(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "queued", server={**HEALTHY_SERVER, "waiting": flat(15)})
    warned = judge(run_dir, SoakCriteria())
    assert warned.verdict.passed
    assert _status(warned, "waiting-queue alert") == "warn"
    assert any("waiting-queue alert" in w and "> level 10" in w for w in warned.warnings)

    strict = SoakCriteria.model_validate({"alerts": {"actions": {"waiting": "fail"}}})
    failed = judge(run_dir, strict)
    assert not failed.verdict.passed
    assert any(r.startswith("FAIL waiting-queue alert") for r in failed.verdict.reasons)


def test_gpu_memory_alert_judges_the_fullest_gpu_and_says_when_there_is_none(tmp_path: Path) -> None:
    none = judge(write_run(tmp_path / "none", server=HEALTHY_SERVER), SoakCriteria())
    check = next(c for c in none.checks if c.name == "GPU memory alert")
    assert check.status == "skip" and "no GPU samples in the hold" in check.detail and "--gpu-metrics" in check.detail

    # GPU 0 climbs from 85% to 95% over the hold: its last 60 s window averages ~92.5%
    full = write_run(tmp_path / "full", server=HEALTHY_SERVER, gpu_memory=ramp(0.85, 0.95))
    warned = judge(full, SoakCriteria())
    assert warned.verdict.passed and _status(warned, "GPU memory alert") == "warn"
    assert any(w.startswith("WARN GPU memory alert: worst 60 s window 0.925 (+90 s") for w in warned.warnings)
    path = tmp_path / "criteria.yaml"
    path.write_text("alerts: {actions: {gpu_memory_used: fail}}\n")
    failed = judge(full, criteria_from_args(_parse("--criteria", str(path))))
    assert not failed.verdict.passed and _status(failed, "GPU memory alert") == "fail"
    path.write_text("alerts: {levels: {gpu_memory_used: 0.95}, actions: {gpu_memory_used: fail}}\n")
    assert _status(judge(full, criteria_from_args(_parse("--criteria", str(path)))), "GPU memory alert") == "pass"

    summary = conclude(full).server
    assert summary is not None and summary.gpu_memory_usage_max == pytest.approx(0.95, abs=0.01)
    assert [(g.gpu, g.memory_usage_max) for g in summary.gpus] == [("0", pytest.approx(0.95, abs=0.01)), ("1", 0.5)]


def test_server_file_with_nulls_missing_fields_and_a_torn_line_is_read(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "gappy")
    t0 = STARTED_AT + RAMP_S
    lines = [
        orjson.dumps({"t": t0 + i, "kv_cache_usage": None if i % 3 else 0.95, "waiting": None}) + b"\n"
        for i in range(int(HOLD_S))
    ]
    (run_dir / SERVER_FILE).write_bytes(b"".join(lines) + b'{"t": 18000001')
    result = judge(run_dir, SoakCriteria())
    assert _status(result, "KV-cache usage alert") == "warn"
    assert _status(result, "waiting-queue alert") == "skip"
    assert _status(result, "preemption-rate drift") == "skip"


def test_slos_state_measured_value_and_limit(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "slo")
    result = judge(run_dir, SoakCriteria(slo_ttft_p99_ms=50, slo_e2e_p99_ms=1000))
    ttft = next(c for c in result.checks if c.name == "p99 TTFT SLO")
    assert ttft.status == "fail" and "SLO 50 ms" in ttft.detail
    assert _status(result, "p99 E2E SLO") == "pass"
    assert _status(judge(run_dir, SoakCriteria()), "p99 TTFT SLO") == "skip"


# --------------------------------------------------------------------------- a target that does not keep up


def _check(result: SoakResult, name: str):  # type: ignore[no-untyped-def]
    return next(c for c in result.checks if c.name == name)


def test_a_hold_whose_requests_mostly_did_not_finish_fails_whatever_else_it_shows(tmp_path: Path) -> None:
    """A target serving 1 req/s against 6 offered: what it finished looks fine (no error, a flat TTFT in
    the few windows that have one, a healthy KV cache and queue in its metrics), but most requests of
    the hold were still running when the 10 s drain ended. Every request sent is judged."""
    run_dir = write_run(tmp_path / "behind", capacity_qps=1, drain_s=10, server=HEALTHY_SERVER)
    result = judge(run_dir, SoakCriteria(slo_ttft_p99_ms=60_000, slo_e2e_p99_ms=60_000))
    assert not result.verdict.passed
    finished = _check(result, "finished")
    assert finished.status == "fail" and finished.kind == "failures"
    assert "still running after the 10 s drain" in finished.detail and "did not keep up at 6 req/s" in finished.detail
    sent = 720  # 120 s at 6 req/s
    done = int(finished.detail.split(" of ")[0])
    assert done < 0.2 * sent and f"of {sent} sent in the hold" in finished.detail
    assert (
        _status(result, "error rate") == "fail"
        and f"{sent - done} unfinished of {sent} sent" in _check(result, "error rate").detail
    )
    # its answers are as long as its hold (they queued): the in-flight trend cannot tell, and says so
    keeping_up = _check(result, "keeping up")
    assert keeping_up.status == "inconclusive" and "telling a queue from long answers needs 8×" in keeping_up.detail
    # the latency drifts lack windows because requests did not finish: a failure, not a skip
    for name in ("p99 TTFT drift", "p99 E2E drift"):
        check = _check(result, name)
        assert check.status == "fail" and "did not finish is not a pass" in check.detail, check.detail
    for name in ("p99 TTFT SLO", "p99 E2E SLO"):
        assert _status(result, name) == "fail", _check(result, name).detail
    assert set(result.verdict.failed_kinds) >= {"failures", "slo", "drift"} and result.verdict.outcome == "fail"
    # the summary and the report show the split
    summary = conclude(run_dir)
    hold = summary.stages[-1]
    assert hold.unfinished == sent - done and hold.ok == done
    assert summary.requests.unfinished == summary.requests.scheduled - summary.requests.ok
    assert any("still running when the 10 s drain after the plan ended" in w for w in summary.run.warnings)
    report = (run_dir / "report.md").read_text()
    assert "| unfinished |" in report and f"| {summary.requests.unfinished} |" in report


def test_a_queue_growing_through_the_hold_fails_keeping_up_with_or_without_server_metrics(tmp_path: Path) -> None:
    """7 req/s of capacity against 6 offered keeps up; 5.5 does not: the queue grows by 0.5 a second,
    every request still finishes within the drain, and the target exports nothing (no server.jsonl)."""
    level = judge(write_run(tmp_path / "level", capacity_qps=7, drain_s=120), SoakCriteria())
    assert level.verdict.passed, level.verdict.reasons
    assert _status(level, "keeping up") == "pass" and _status(level, "finished") == "pass"
    growing = judge(write_run(tmp_path / "growing", capacity_qps=5.5, drain_s=120), SoakCriteria())
    check = _check(growing, "keeping up")
    assert check.status == "fail" and not check.marginal, check.detail
    first, last = (float(x) for x in check.detail.split("in flight grew from ")[1].split(" during")[0].split(" to "))
    assert last - first > 40, check.detail  # ~0.5/s over 110 s between the first and last windows' middles
    assert _status(growing, "finished") == "pass" and _status(growing, "waiting-queue drift") == "skip"


def test_an_slo_that_unfinished_requests_decide_cannot_pass(tmp_path: Path) -> None:
    """The hold's last 10 requests still running after the drain: the finished ones meet the SLO, but
    the p99 (between the 712th and 713th of 720 values) is not known, so the check fails and says why; a p99 beyond the
    SLO at its lower bound fails as a measurement. One unfinished request of 720 cannot move the p99:
    that SLO is judged."""
    slow_end = lambda t: np.where(t > 118.2, 5000.0, 100.0)  # noqa: E731
    run_dir = write_run(tmp_path / "left", drain_s=0.1, ttft_ms=slow_end)
    result = judge(run_dir, SoakCriteria(slo_e2e_p99_ms=2000, max_error_rate=0.05))
    assert _check(result, "finished").detail.startswith("710 of 720 sent in the hold; 10 still running")
    check = _check(result, "p99 E2E SLO")
    assert check.status == "fail" and "cannot be judged: 10 request(s) of the hold did not finish" in check.detail
    one = write_run(tmp_path / "one-left", drain_s=0.1, ttft_ms=lambda t: np.where(t > 119.8, 5000.0, 100.0))
    assert _status(judge(one, SoakCriteria(slo_e2e_p99_ms=2000)), "p99 E2E SLO") == "pass"
    assert _status(judge(run_dir, SoakCriteria(slo_e2e_p99_ms=200)), "p99 E2E SLO") == "fail"
    assert "≥ " not in _check(judge(write_run(tmp_path / "all-done"), SoakCriteria(slo_e2e_p99_ms=200)),
                              "p99 E2E SLO").detail  # fmt: skip


def test_a_hold_too_short_for_its_latencies_cannot_tell_when_asked(tmp_path: Path) -> None:
    """E2E of 45 s in a 120 s hold is over a third of it: a hold that short has seen under three
    generations of requests, so it cannot tell (never a pass, and not the server's fault). Off by
    default (a soak's hold is long); a search turns it on."""
    run_dir = write_run(tmp_path / "slow", ttft_ms=flat(45_000), noise=0.001, drain_s=60)
    assert _status(judge(run_dir, SoakCriteria()), "hold length") == "skip"
    check = _check(judge(run_dir, SoakCriteria(max_e2e_share_of_hold=1 / 3)), "hold length")
    assert check.status == "inconclusive" and check.kind == "hold_length" and "38% of the 120 s hold" in check.detail
    assert "hold longer" in check.detail
    assert _status(judge(write_run(tmp_path / "fast"), SoakCriteria(max_e2e_share_of_hold=1 / 3)), "hold length") == (
        "pass"
    )


# --------------------------------------------------------------------------- criteria from flags and YAML


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_criteria_arguments(parser.add_argument_group("soak"))
    return parser.parse_args(argv)


def test_flags_override_the_criteria_file(tmp_path: Path) -> None:
    path = tmp_path / "criteria.yaml"
    path.write_text("max_error_rate: 0.02\nslo_ttft_p99_ms: 300\ndrift: {window_s: 30}\n")
    criteria = criteria_from_args(_parse("--criteria", str(path), "--max-error-rate", "0.05", "--alerts", "fail"))
    assert criteria.max_error_rate == 0.05 and criteria.slo_ttft_p99_ms == 300 and criteria.drift.window_s == 30
    assert set(criteria.alerts.actions.model_dump().values()) == {"fail"}
    assert criteria_from_args(_parse()) == SoakCriteria()


def test_a_misspelt_criteria_key_or_a_bad_flag_is_named(tmp_path: Path) -> None:
    path = tmp_path / "criteria.yaml"
    path.write_text("drift:\n  relative_rize: 0.3\n")
    with pytest.raises(InputError, match=r"drift\.relative_rize: unknown key"):
        criteria_from_args(_parse("--criteria", str(path)))
    with pytest.raises(InputError, match="--max-error-rate"):
        criteria_from_args(_parse("--max-error-rate", "5"))


def test_not_a_run_directory_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a run directory"):
        judge(tmp_path, SoakCriteria())


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A healthy run and, at the same time, one whose target answers 5% of requests with vLLM's
    EngineDeadError."""
    directory = tmp_path_factory.mktemp("soak")
    workload = small_workload(directory)
    flags = ("--target-qps", "10", "--stage-duration", "2", "--hold-duration", "5", "--arrival", "constant")
    with (
        SimProcess("--ttft-ms", "20", "--itl-ms", "5") as healthy,
        SimProcess("--ttft-ms", "20", "--itl-ms", "5", "--fault", "engine_dead:0.05") as dying,
        ThreadPoolExecutor(2) as pool,
    ):
        futures = {
            n: pool.submit(run_locust, sim.url, workload, directory / "reports", n, *flags)
            for n, sim in (("healthy", healthy), ("dying", dying))
        }
        done = {n: f.result() for n, f in futures.items()}
    for run in done.values():
        assert run.returncode in (0, 1), run.output[-3000:]
    return {n: run.run_dir for n, run in done.items()}


def test_a_healthy_real_run_too_short_to_tell_is_inconclusive_with_a_reason_per_check(
    real_runs: dict[str, Path],
) -> None:
    """Five seconds of hold cannot tell whether the server keeps up: INCONCLUSIVE, naming the hold it
    needs, never a PASS on too little evidence; every other check passes."""
    result = judge(real_runs["healthy"], SoakCriteria(slo_ttft_p99_ms=500, slo_e2e_p99_ms=5000))
    verdict = result.verdict
    assert verdict.outcome == "inconclusive" and not verdict.passed, verdict.reasons
    assert verdict.inconclusive_kinds == ["keeping_up"] and not verdict.failed_kinds
    assert "telling whether the server keeps up needs 6: hold at least 60 s" in _check(result, "keeping up").detail
    assert result.hold == "150%"
    assert [r.split(":")[0] for r in verdict.reasons] == [
        f"{c.status.upper()} {name}" for c, name in zip(result.checks, CHECKS, strict=True)
    ]
    for name in ("OOM-family failures", "error rate", "achieved rate", "p99 TTFT SLO", "p99 E2E SLO"):
        assert _status(result, name) == "pass"
    assert any(
        r.startswith("PASS error rate: 0.00% (0 failed + 0 unfinished of ") and "limit 1.00%" in r
        for r in verdict.reasons
    )


def test_engine_deaths_in_a_real_run_fail_the_soak_naming_them(real_runs: dict[str, Path]) -> None:
    verdict = judge(real_runs["dying"], SoakCriteria()).verdict
    assert not verdict.passed
    oom = next(r for r in verdict.reasons if "OOM-family failures" in r)
    assert oom.startswith("FAIL") and "engine_dead: " in oom, oom


def test_the_report_warns_when_the_hypervisor_stole_cpu(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    manifest = orjson.loads((run_dir / MANIFEST_FILE).read_bytes())
    for steal, warned in ((0.4, False), (7.5, True)):
        (run_dir / MANIFEST_FILE).write_bytes(orjson.dumps({**manifest, "cpu_steal_percent": steal}))
        run = conclude(run_dir).run
        assert run.cpu_steal_percent == steal
        assert any("hypervisor took 7.5%" in w for w in run.warnings) is warned


def test_the_report_warns_when_the_load_generator_stalled(tmp_path: Path) -> None:
    """A timer firing 2.6 s late once in the hold (a process held off the CPU) is named with its length."""
    for lag, warned in ((flat(3.0), False), (lambda t: np.where(t == 40, 2600.0, 3.0), True)):
        run_dir = write_run(tmp_path / f"run-{warned}", server={"client_lag_ms": lag})
        run = conclude(run_dir).run
        assert run.load_generator_lag_max_ms == (2600.0 if warned else 3.0)
        assert any("load generator stalled for up to 2.60 s" in w for w in run.warnings) is warned


def test_a_closed_loop_stage_late_on_its_schedule_is_reported_without_a_target() -> None:
    """A --sessions-in-flight stage asks for no rate (target 0): its shortfall (a late schedule) says what it
    achieved and how late it was, with no ratio to a target it never had."""
    stage = StageSummary.model_construct(
        name="100%", target_qps=0.0, achieved_qps=2.7, offered_qps=0.0, schedule_delay_p99_ms=175.0
    )
    assert shortfall_reason(stage) == (
        "stage 100%: achieved 2.70 req/s (a closed loop: no target), schedule delay p99 175 ms (limit 100 ms)"
    )
