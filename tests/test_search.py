"""`llmload search`: the bracket-and-bisect rule, real searches against the simulator (its engine's
saturation rate as ground truth), Ctrl-C, exit codes and the refusal of SLOs that do not exist."""

from __future__ import annotations

import math
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import orjson
import pytest

from llmload.errors import InputError
from llmload.gates.criteria import SoakCriteria
from llmload.gates.passthrough import long_options, refuse_overrides
from llmload.gates.search import (
    DRIFT_CONFIDENCE,
    Bounds,
    ProbeFlags,
    Searcher,
    boundary,
    next_rate,
    probe_options,
    vouched,
    write_criteria,
)
from llmload.models import Probe, SearchResult
from llmload.records import read_records
from llmload.sim.process import SimProcess
from llmload.sim.profiles import PROFILES
from llmload.yamlfile import load_yaml_model
from tests.locust_runs import (
    KeepsUp,
    fixed_output_workload,
    llmload_cli,
    llmload_command,
    running,
    small_workload,
    wait_until,
)

OUTPUT_TOKENS = 32


def _search_args(reports: Path, *flags: str) -> tuple[str, ...]:
    return ("search", "--reports-dir", str(reports), "--search-id", "s", *flags)


def _search(reports: Path, *flags: str, timeout: float) -> tuple[int, str, dict]:
    proc = llmload_cli(*_search_args(reports, *flags), timeout=timeout)
    result = reports / "s" / "search.json"
    return proc.returncode, proc.stdout + proc.stderr, orjson.loads(result.read_bytes()) if result.exists() else {}


# --------------------------------------------------------------------------- the rule


def _run(bounds: Bounds, passes: object) -> list[Probe]:
    """The search's loop with `passes(rate, attempt)` deciding each probe: True, False (an error-rate
    failure) or the verdict lines of the checks that failed."""
    probes: list[Probe] = []
    while (rate := next_rate(bounds, probes)[0]) is not None:
        attempt = sum(p.qps == rate for p in probes)
        verdict = passes(rate, attempt)  # type: ignore[operator]
        failed = [] if verdict is True else ERRORS if verdict is False else verdict
        marginal = failed is MARGINAL_DRIFT
        probes.append(
            Probe(run_id=str(len(probes)), qps=rate, passed=verdict is True, failed_checks=failed, marginal=marginal)
        )
        assert len(probes) < 40
    return probes


def _probe(qps: float, passed: bool, *, confirm: bool = False) -> Probe:
    return Probe(run_id=f"{qps:g}-{confirm}", qps=qps, passed=passed, confirm=confirm)


ERRORS = ["FAIL error rate: 3.1% of 240 requests failed (limit 1%)"]
MARGINAL_DRIFT = ["FAIL p99 TTFT drift: +5.99 ms over the 8 s hold from 18.6 ms (+32%), ...; marginal: +0.15 ms ..."]
CERTAIN_DRIFT = ["FAIL waiting-queue drift: +113 over the 24 s hold from 0.5, ...; limit: CI above 0 and rise > 3.8"]


BOUNDS = Bounds(start_qps=5, min_qps=0.5, max_qps=100, growth=2, resolution=0.05, repeats=2)


def test_brackets_then_bisects_to_the_resolution_and_the_answer_passed_every_probe() -> None:
    probes = _run(BOUNDS, lambda rate, _: rate <= 13.3)
    lo, hi = boundary(probes)
    assert lo is not None and hi is not None
    assert lo <= 13.3 < hi and (hi - lo) <= 0.05 * lo
    assert [p.qps for p in probes[:3]] == [5, 10, 20]  # bracketing: ×2 until a failure
    at_answer = [p for p in probes if p.qps == lo]
    assert len(at_answer) == 2 and all(p.passed for p in at_answer)


def test_a_lucky_pass_is_not_the_answer_and_a_failing_rate_never_is() -> None:
    """15 fails on its repeat (a lucky first pass): the answer falls below it."""
    probes = _run(BOUNDS, lambda rate, attempt: rate <= 10 or (rate == 15 and attempt == 0))
    lo, _ = boundary(probes)
    assert lo is not None and lo <= 10
    failing_rates = {p.qps for p in probes if not p.passed}
    assert lo not in failing_rates and 15 in failing_rates
    assert [p.passed for p in probes if p.qps == 15] == [True, False]


def test_a_marginal_drift_is_decided_by_the_next_probe_at_that_rate() -> None:
    """A false drift at 15 (its first probe, marginal) is outvoted by the next hold; above 16 a
    marginal drift that comes back fails its second hold too, and a certain one decides at once."""
    probes = _run(BOUNDS, lambda rate, attempt: MARGINAL_DRIFT if rate > 16 or (rate == 15 and attempt == 0) else True)
    lo, hi = boundary(probes)
    assert lo is not None and hi is not None and 15 <= lo <= 16 < hi
    assert [p.passed for p in probes if p.qps == 15][:2] == [False, True]
    for rate in {p.qps for p in probes if p.qps > 16}:
        assert [p.passed for p in probes if p.qps == rate] == [False, False]
    # overload past the limit at the interval's low end, or any other failure, decides at once
    for failure in (CERTAIN_DRIFT, [*MARGINAL_DRIFT, *ERRORS]):
        decided = _run(BOUNDS, lambda rate, _, failure=failure: True if rate <= 10 else failure)
        failing = [p.qps for p in decided if not p.passed]
        assert failing and sorted(failing) == sorted(set(failing))


def test_a_marginal_drift_after_a_probe_too_short_to_judge_is_still_retried() -> None:
    """A CI run: 2 req/s on a real vLLM at 7% of its capacity, first too short to tell, then a marginal
    p99 E2E drift; the too-short probe judged no drift, so the marginal failure gets its retry. A
    second marginal failure at that rate counts."""
    short = Probe(run_id="1", qps=2, passed=False, too_short=True)
    marginal = Probe(run_id="2", qps=2, passed=False, failed_checks=MARGINAL_DRIFT, marginal=True)
    assert next_rate(BOUNDS, [short, marginal]) == (2, "found")
    assert boundary([short, marginal]) == (None, None)
    retried = Probe(run_id="3", qps=2, passed=True)
    assert boundary([short, marginal, retried]) == (2, None)
    again = marginal.model_copy(update={"run_id": "3"})
    assert boundary([short, marginal, again]) == (None, 2)


def test_the_answer_is_what_the_passing_holds_show_the_server_serves_not_the_rate_itself() -> None:
    """A hold passes while it rules out a 10% overload, so a rate up to 10% over the capacity can pass:
    the answer is keeping up's lower bound at the passing rate, the lowest of its probes', the confirm's
    where one passed (its longer hold tells more), rounded down to three digits, never above the rate."""

    def at(qps: float, served: float | None, *, passed: bool = True, confirm: bool = False) -> Probe:
        return Probe(run_id=f"{served}", qps=qps, passed=passed, served_low_qps=served, confirm=confirm)

    probes = [at(10, 9.61234), at(10, 9.3), at(10.5, 9.9, passed=False), at(5, 4.9)]
    assert vouched(probes, 10) == 9.3
    assert vouched([*probes, at(10, 9.8765, confirm=True)], 10) == 9.87
    assert vouched([at(2, 2.4)], 2) == 2  # a draining server's bound is capped at the rate it held
    assert vouched([at(2, None)], 2) == 2  # probes of an earlier llmload: the rate itself
    assert vouched(probes, None) is None
    result = SearchResult(
        search_id="s", host="h", workload="w", max_qps=20, probe_s=30, repeats=2, started_at=0, probes=probes,
        outcome="found", passing_qps=10, answer_qps=9.3, failing_qps=10.5, failing_reason="keeping up: grew",
    )  # fmt: skip
    assert result.answer == "≥ 9.3 req/s"
    assert result.conclusion.startswith("Keeps up with ≥ 9.3 req/s (what its holds at 10 req/s, the highest rate")
    assert "boundary lies between 10 and 10.5 req/s. It fails at 10.5 req/s: keeping up: grew." in result.conclusion
    capped = result.model_copy(update={"outcome": "capped", "answer_qps": 10.0, "failing_qps": None})
    assert capped.answer == "≥ 10 req/s (the cap, --max-qps)"


def test_a_probe_too_short_for_its_answers_is_held_longer_until_it_judges_or_its_queue_shows(tmp_path: Path) -> None:
    """A probe that failed only because its E2E p99 was over a third of its hold is asked again with a
    longer hold (and a drain long enough for its answers), up to 8x --probe-duration; it is never the
    answer meanwhile. When the E2E p99 grows with the hold, the server is queueing: decided at once."""
    flags = ProbeFlags("loadtests/chat.py", "w.yaml", hold_s=10, warmup_s=1, drain_s=10, confirm_s=300)
    result = SearchResult(search_id="s", host="http://127.0.0.1:1", workload="w.yaml", max_qps=32, probe_s=10,
                          repeats=1, started_at=0)  # fmt: skip
    searcher = Searcher(flags, (), tmp_path, result)
    short = Probe(run_id="1", qps=8, hold_s=10, passed=False, failed_kinds=["hold_length"], too_short=True,
                  e2e_p99_ms=6_000)  # fmt: skip
    result.probes.append(short)
    assert next_rate(BOUNDS, result.probes) == (8, "found")  # asked again, not an answer nor a failure
    assert boundary(result.probes) == (None, None)
    assert searcher.hold_and_drain(8, confirm=False) == (27, 12)  # 1.5 x 6 s / (1/3); drain 2 x 6 s
    assert searcher.hold_and_drain(4, confirm=False) == (10, 10)
    assert "grew with the hold (6.0 s in 10 s, then 16.0 s in 27 s)" in (searcher._grows_with_hold(8, 27, 16_000) or "")
    assert searcher._grows_with_hold(8, 27, 7_000) is None  # a long answer: the share fell
    # a later rate's first probe holds as many requests as the last that passed: 80 s at 2 req/s
    result.probes.append(Probe(run_id="2", qps=2, hold_s=80, passed=True))
    assert searcher.hold_and_drain(4, confirm=False) == (40, 10)
    assert searcher.hold_and_drain(32, confirm=False) == (10, 10)  # never under --probe-duration


@pytest.mark.parametrize(("confirm_s", "confirm_window_s"), [(40.0, 40 / 6), (300.0, 10.0)])
def test_every_hold_of_a_search_has_the_windows_its_drift_checks_need(
    tmp_path: Path, confirm_s: float, confirm_window_s: float
) -> None:
    """A 40 s confirm in the user's 10 s windows had 4: every drift check, keeping up included,
    SKIPped and a queue growing tenfold passed. Each hold gets at least the 6 windows a slope needs;
    the probes judge at 99%, the confirm at the user's confidence."""
    user = SoakCriteria()
    write_criteria(tmp_path, user, probe_s=10.0, confirm_s=confirm_s)
    probes, confirm = (
        load_yaml_model(tmp_path / name, SoakCriteria) for name in ("criteria.yaml", "criteria-confirm.yaml")
    )
    assert probes.drift.window_s == pytest.approx(10 / 6)
    assert probes.drift.confidence == max(user.drift.confidence, DRIFT_CONFIDENCE)
    assert confirm.drift.window_s == pytest.approx(confirm_window_s)
    assert confirm.drift.confidence == user.drift.confidence and confirm.max_e2e_share_of_hold is None
    assert int(confirm_s / confirm.drift.window_s + 1e-9) >= confirm.drift.min_windows


def test_a_confirm_that_fails_reopens_the_search_below_it() -> None:
    """A 10 s probe at 56 passed, its 40 s confirm saw the queue grow: 56 is a failing rate now and
    the search bisects between 48 and it; a confirm that passes adds nothing to decide."""
    probes = [_probe(48, True), _probe(56, True), _probe(56, False, confirm=True)]
    assert boundary(probes) == (48, 56)
    assert next_rate(BOUNDS, probes) == (52, "found")
    assert boundary([_probe(48, True), _probe(56, True), _probe(56, True, confirm=True)]) == (56, None)


def test_nothing_passes_or_everything_does() -> None:
    nothing = _run(BOUNDS, lambda rate, _: False)
    assert boundary(nothing) == (None, min(p.qps for p in nothing))
    assert next_rate(BOUNDS, nothing) == (None, "none") and min(p.qps for p in nothing) >= BOUNDS.min_qps
    everything = _run(BOUNDS, lambda rate, _: True)
    assert boundary(everything) == (100, None) and next_rate(BOUNDS, everything) == (None, "capped")


# --------------------------------------------------------------------------- ground truth


def test_the_rate_found_is_the_simulators_saturation_rate_and_a_longer_run_there_keeps_up(tmp_path: Path) -> None:
    """vllm-cpu-tiny running one sequence at a time (16 MiB of KV, blocks of 128): past its saturation
    rate the queue grows without end. 10 s probes once passed at 3x that rate, the requests that showed
    it still queued when the drain ended; now the answer is within 20% of the engine's analytic rate
    (about 10 req/s), and a 40 s constant-rate run at it keeps up. From 8 req/s at --resolution 0.2 and
    --max-qps 12 (20% over that rate: an engine that passed it would end capped, not found) the search
    closes one bisection under 12 (8, 12, 10 and 10 again, or 9 where 10 fails): at 4 and the default
    0.05 it also probed 4, 11 and 10.5 req/s to the same answer (190 s), and --max-qps 32 probed 16
    req/s on the way to 12 (140 s where this takes 115 s)."""
    reports = tmp_path / "reports"
    workload = fixed_output_workload(tmp_path, OUTPUT_TOKENS)
    sim_flags = ("--profile", "vllm-cpu-tiny", "--max-num-seqs", "1", "--kv-cache-memory-bytes", str(16 * 2**20),
                 "--block-size", "128")  # fmt: skip
    with SimProcess(*sim_flags) as sim:
        code, output, result = _search(
            reports, "--host", sim.url, "--workload", str(workload), "--max-qps", "12", "--resolution", "0.2",
            "--start-qps", "8", "--probe-duration", "10s", "--probe-warmup", "1s", "--arrival", "constant",
            "--metrics-interval", "0.5", "--confirm", "--confirm-duration", "40s", timeout=900,
        )  # fmt: skip
    assert code == 0, output[-4000:]
    found, failing = result["passing_qps"], result["failing_qps"]
    confirm = result["probes"][-1]
    assert confirm["confirm"] and confirm["qps"] == found and result["confirmed"] is True
    ground = KeepsUp.of(reports / "s" / confirm["run_id"])
    first = reports / "s" / result["probes"][0]["run_id"]
    prompt = float(read_records(first / "requests.jsonl").prompt_tokens.mean())
    truth = PROFILES["vllm-cpu-tiny"].timing.saturation_qps(1, prompt, OUTPUT_TOKENS)
    assert 0.8 * truth <= found <= 1.1 * truth, (found, truth, output[-3000:])
    assert ground.holds(), (found, ground)
    assert failing > found and result["outcome"] == "found"
    assert any(word in result["failing_reason"] for word in ("keeping up", "finished", "drift")), output[-3000:]
    answer = result["answer_qps"]  # what the confirm's hold shows the engine serves: at most its capacity
    assert 0.8 * truth <= answer <= min(found, truth), (answer, found, truth)
    assert f"Keeps up with ≥ {answer:g} req/s" in output
    assert "No latency SLO was given, so this is the highest rate the server keeps up with" in output
    # the answer passed twice, failing at most marginally where its next probe outvoted, or too short
    # to tell (held longer next); every probe is an ordinary run with its report
    at_answer = [p for p in result["probes"] if p["qps"] == found and not p["confirm"]]
    assert sum(p["passed"] for p in at_answer) == 2, at_answer
    assert all(p["passed"] or p["marginal"] or p["too_short"] for p in at_answer)
    # each probe at a rate met other arrivals (the simulator is deterministic: the same seed, the same run)
    seeds = [orjson.loads((reports / "s" / p["run_id"] / "run.json").read_bytes())["seed"] for p in at_answer]
    assert seeds == list(range(len(at_answer))), seeds
    # and requests of its own: each probe replays the workload past every session the ones before it
    # could open (warm-up and hold, one per arrival), so no two probes judge the same sessions
    starts = [orjson.loads((reports / "s" / p["run_id"] / "run.json").read_bytes())["first_session"]
              for p in result["probes"]]  # fmt: skip
    held = [math.ceil(p["qps"] * (1 + p["hold_s"])) for p in result["probes"]]  # the confirming soak's too
    assert starts == [sum(held[:k]) for k in range(len(starts))]
    opened = [set(read_records(reports / "s" / p["run_id"] / "requests.jsonl").session_id) for p in result["probes"]]
    assert sum(map(len, opened)) == len(set().union(*opened)), "two probes replayed the same session"
    page = (reports / "s" / "search.html").read_text()
    for probe in result["probes"]:
        assert (reports / "s" / probe["run_id"] / "report.html").is_file()
        assert f'href="{probe["run_id"]}/report.html"' in page
        # its hold's figures for the Pareto frontier, as its run's summary gives them
        summary = orjson.loads((reports / "s" / probe["run_id"] / "summary.json").read_bytes())
        hold = summary["stages"][-1]
        assert probe["output_tokens_per_s"] == hold["output_tokens_per_s"] and probe["tpot_p50_ms"] > 0
        assert probe["tpot_p50_ms"] == hold["tpot_p50_ms"]
        assert probe["gpu_count"] == (summary.get("cost") or {}).get("gpu_count")
    assert "data:image/svg+xml;base64," in page and "give --slo-ttft-p99-ms" in page
    assert 'alt="Pareto frontier"' in page and "On the frontier (it passed" in page
    # each probe began with an empty prefix cache, not with what the one before it left
    assert all(p["cache_reset"] == {"reset": True, "how": "POST /reset_prefix_cache"} for p in result["probes"])
    assert "The prefix cache was emptied before each probe (POST /reset_prefix_cache)." in page + output


# --------------------------------------------------------------------------- Ctrl-C and exit codes


class Searched(NamedTuple):
    """A search the CLI ran: its reports directory, exit code, output and search.json."""

    reports: Path
    code: int
    output: str
    result: dict


def _interrupted_search(directory: Path) -> Searched:
    """A search from 2 req/s sent SIGINT once its second probe has sent 4 requests."""
    reports = directory / "reports"
    with SimProcess("--ttft-ms", "10", "--itl-ms", "2") as sim:
        command = llmload_command(*_search_args(
            reports, "--host", sim.url, "--workload", str(small_workload(directory)), "--max-qps", "16",
            "--start-qps", "2", "--probe-duration", "6s", "--probe-warmup", "0",
        ))  # fmt: skip
        second = reports / "s" / "probe-02-4qps" / "requests.jsonl"
        with running(command) as proc:
            wait_until(
                lambda: second.exists() and second.read_bytes().count(b"\n") >= 4, 120, "the second probe never started"
            )
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=90)
    return Searched(reports, proc.returncode, output, orjson.loads((reports / "s" / "search.json").read_bytes()))


def _search_on_sim(directory: Path, sim_flags: tuple[str, ...], *flags: str) -> Searched:
    """A search of probes of 4 s, no warm-up, against a simulator of its own started with `sim_flags`."""
    with SimProcess("--ttft-ms", "10", "--itl-ms", "2", *sim_flags) as sim:
        return Searched(directory / "reports", *_search(
            directory / "reports", "--host", sim.url, "--workload", str(small_workload(directory)),
            "--probe-duration", "4s", "--probe-warmup", "0", *flags, timeout=180,
        ))  # fmt: skip


@pytest.fixture(scope="module")
def short_searches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Searched]:
    """Three short searches at once, each in a directory and against a simulator of its own (each
    mostly waits for its probes): `interrupted` (_interrupted_search); `none` against a target failing
    half its requests, from 4 req/s down to --min-qps 2; `below` one probe at 3 req/s with
    --require-qps 5 and --keep-prefix-cache."""
    plans = {
        "none": (("--fault", "http_500:0.5"), ("--max-qps", "8", "--start-qps", "4", "--min-qps", "2")),
        "below": ((), ("--max-qps", "3", "--start-qps", "3", "--repeats", "1", "--require-qps", "5",
                       "--keep-prefix-cache")),
    }  # fmt: skip
    with ThreadPoolExecutor(len(plans)) as pool:
        futures = {
            name: pool.submit(_search_on_sim, tmp_path_factory.mktemp(name), sim_flags, *flags)
            for name, (sim_flags, flags) in plans.items()
        }
        # in this thread: running() sets the SIGINT handler, which only the main thread may
        interrupted = _interrupted_search(tmp_path_factory.mktemp("interrupted"))
        return {"interrupted": interrupted, **{name: future.result() for name, future in futures.items()}}


def test_ctrl_c_stops_the_probe_and_writes_what_was_learned(short_searches: dict[str, Searched]) -> None:
    reports, code, output, result = short_searches["interrupted"]
    assert result["outcome"] == "interrupted", output[-3000:]
    first, second_probe = result["probes"]
    assert first["passed"] is True and second_probe["passed"] is None  # the cut probe is never judged
    assert result["passing_qps"] == 2 and "interrupted" in output
    assert (reports / "s" / "probe-02-4qps" / "report.html").is_file()  # the probe wrote its report on the way out
    assert "Interrupted" in (reports / "s" / "search.html").read_text()
    assert code == 130  # SIGINT: 128 + 2, what was learned written


def test_no_passing_rate_exits_1_and_reports_none(short_searches: dict[str, Searched]) -> None:
    _, code, output, result = short_searches["none"]
    assert code == 1, output[-3000:]
    assert result["passing_qps"] is None and result["outcome"] == "none"
    assert [p["qps"] for p in result["probes"]] == [4, 2]
    assert "No probed rate passed" in output and "error rate" in result["failing_reason"]


def test_a_rate_below_require_qps_exits_1(short_searches: dict[str, Searched]) -> None:
    _, code, output, result = short_searches["below"]
    assert code == 1, output[-3000:]
    assert result["outcome"] == "capped" and result["passing_qps"] == 3
    # a shared server's cache left as it is, and said
    assert result["prefix_cache_kept"] and all(p["cache_reset"] is None for p in result["probes"])
    assert "The prefix cache was kept between probes (--keep-prefix-cache)" in output
    answer = result["answer_qps"]  # what 4 s at 3 req/s show a server with no limit serves
    assert 0 < answer <= 3 and f"{answer:g} req/s is below --require-qps 5" in output
    assert f"Keeps up with ≥ {answer:g} req/s" in output and "its limit may lie above" in output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--goodput-slo", "ttft:p99=2000"), "ttft is one value per request, so it has no statistic 'p99'"),
        (("--goodput-slo", "queue=5"), "no per-request metric 'queue'"),
        (("--min-goodput-ratio", "0.9"), "--min-goodput-ratio needs"),
        (("--slo-ttft-p99-ms", "-5"), "--slo-ttft-p99-ms: Input should be greater than 0"),
        (("--max-qps", "0"), "--max-qps must be > 0"),
        (("--first-session", "5"), "--first-session is set by the search for every run it starts"),
        (("--stage-dur=5",), "--stage-dur abbreviates --stage-duration, which is set by the search"),
        (("--sessions-in", "2"), "--sessions-in-flight replays a closed loop, which asks for no rate"),
    ],
)
def test_bad_input_exits_2_before_any_probe(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    code, output, _ = _search(tmp_path / "reports", "--max-qps", "4", *flags, timeout=60)
    assert code == 2 and message in output, output[-2000:]
    assert not (tmp_path / "reports" / "s").exists()


# the flags every probe sets, derived from the fields its run fills (llmload.gates.locust_run)
PROBE_FLAGS = (
    "--headless", "--only-summary", "--host", "--workload", "--target-qps", "--stages", "--stage-duration", "--warmup",
    "--drain-timeout", "--seed", "--first-session", "--run-id", "--reports-dir", "--verdict", "--criteria",
    "--goodput-slo", "--reset-prefix-cache",
)  # fmt: skip


def test_every_flag_a_probe_sets_is_refused_when_passed_through(tmp_path: Path) -> None:
    """Passed through after the probe's own, a flag of PROBE_FLAGS would replace the search's value in
    every probe; Locust's other flags go through."""
    flags = ProbeFlags("loadtests/chat.py", "w.yaml", hold_s=30, warmup_s=10, drain_s=10, confirm_s=300,
                       goodput_slo=("e2e=2000",))  # fmt: skip
    result = SearchResult(search_id="s", host="http://127.0.0.1:1", workload="w.yaml", max_qps=8, probe_s=30,
                          repeats=2, started_at=0)  # fmt: skip
    searcher = Searcher(flags, (), tmp_path, result)
    for confirm in (False, True):
        command = searcher.locust_run(4, "probe-01-4qps", confirm=confirm).command(flags.locustfile)
        assert set(long_options(command)) == set(probe_options(flags)) == set(PROBE_FLAGS)
    own = probe_options(flags)
    for name in PROBE_FLAGS:
        with pytest.raises(InputError, match=f"^{name} is set by the search"):
            refuse_overrides(own, ["--arrival", "constant", name, "1"], "the search")
    refuse_overrides(own, ["--arrival=constant", "--metrics-interval", "0.5", "--timeout-total", "60"], "-")


def test_a_search_directory_in_use_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    earlier = tmp_path / "reports" / "s" / "search.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text('{"earlier": true}')
    code, output, result = _search(tmp_path / "reports", "--max-qps", "4", timeout=60)
    assert code == 2 and "already holds a search: give another --search-id" in output, output[-2000:]
    assert result == {"earlier": True} and sorted(p.name for p in earlier.parent.iterdir()) == ["search.json"]
