"""`llmload search`: the highest request rate whose hold passes the soak verdict.

Each probe is an ordinary run (`locust -f loadtests/chat.py --verdict`): a warm-up, then one
hold at the probed rate, judged by the soak verdict (OOM family, errors, achieved rate, SLOs,
goodput, drift). The search brackets first (the rate grows ×2 from --start-qps until a probe
fails), then bisects. A rate passes only when every probe at it passed, and once the interval is
narrow enough, the rate that would become the answer is probed again up to --repeats times, so one
lucky probe never decides it (a noisy failure can only make the answer lower: the safe side for a
release gate). The answer is always a rate that passed; the boundary is reported as an interval
with the checks that failed above it.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson
import yaml
from pydantic import BaseModel, Field

from llmload.errors import InputError
from llmload.goodput import SYNTAX as GOODPUT_SYNTAX
from llmload.goodput import parse_goodput_slo
from llmload.models import GoodputSLO, Summary, Verdict
from llmload.report import SUMMARY_FILE, VERDICT_FILE
from llmload.search_page import render_page
from llmload.sim.process import EMBEDDED_TARGET_ARGS, SimProcess
from llmload.soak import parse_duration
from llmload.verdict import SoakCriteria, add_criteria_arguments, criteria_from_args
from llmload.workload import load_workload

RESULT_FILE = "search.json"
PAGE_FILE = "search.html"
DRIFT_WINDOWS = 6  # drift windows per probe hold: the fewest a slope is judged on, so each holds the most requests
DRIFT_CONFIDENCE = 0.99  # a search judges many holds: at 95% one in four searches would meet a false drift
STOP_GRACE_S = 60.0  # a probe told to stop gets this long (plus its drain) to write its report

Outcome = Literal["found", "capped", "none", "interrupted", "aborted"]

# --------------------------------------------------------------------------- results


class Probe(BaseModel):
    """One probe: an ordinary run directory under the search's, and what its hold showed."""

    run_id: str
    qps: float
    passed: bool | None = Field(description="None: interrupted or unfinished, never judged")
    failed_checks: list[str] = Field(default_factory=list, description="verdict lines of the checks that failed")
    achieved_qps: float | None = None
    goodput_qps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    confirm: bool = Field(default=False, description="the --confirm soak at the rate found")


class SearchResult(BaseModel):
    """search.json: every probe and the answer."""

    search_id: str
    host: str
    workload: str
    max_qps: float
    probe_s: float
    repeats: int
    started_at: float
    finished_at: float | None = None
    goodput_slo: GoodputSLO | None = None
    probes: list[Probe] = Field(default_factory=list)
    outcome: Outcome = "interrupted"
    passing_qps: float | None = Field(default=None, description="the answer: every probe at it passed")
    failing_qps: float | None = Field(default=None, description="the lowest failing rate above the answer")
    failing_reason: str | None = None
    confirmed: bool | None = Field(default=None, description="the --confirm soak passed; None: not run")
    required_qps: float | None = None

    def judged(self) -> list[Probe]:
        return [p for p in self.probes if p.passed is not None and not p.confirm]

    @property
    def conclusion(self) -> str:
        """One sentence: the answer and the boundary, or why there is none."""
        lo, hi = self.passing_qps, self.failing_qps
        boundary = f" It fails at {hi:g} req/s: {self.failing_reason}." if hi is not None else ""
        if self.outcome == "capped":
            return f"Passes at --max-qps {lo:g} req/s: the limit lies above it."
        if lo is None:
            what = {"none": "No probed rate passed", "interrupted": "Interrupted before any rate passed"}
            return f"{what.get(self.outcome, 'The search stopped before any rate passed')}.{boundary}"
        found = f"The highest passing rate is {lo:g} req/s"
        if hi is not None:
            found += f" (boundary between {lo:g} and {hi:g} req/s)"
        suffix = {"interrupted": " (interrupted: what was learned so far)", "aborted": " (the search was aborted)"}
        return f"{found}{suffix.get(self.outcome, '')}.{boundary}"


# --------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Bounds:
    """Where the search may look and when it stops."""

    start_qps: float
    min_qps: float
    max_qps: float
    growth: float
    resolution: float  # relative width of the final interval
    repeats: int


def _verdicts(probes: Sequence[Probe]) -> dict[float, list[bool]]:
    out: dict[float, list[bool]] = {}
    for probe in probes:
        if probe.passed is not None and not probe.confirm:
            out.setdefault(probe.qps, []).append(probe.passed)
    return out


def boundary(probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    """(highest passing rate below the lowest failing one, lowest failing rate): a rate passes only
    when every probe at it passed; a passing rate above a failing one is noise and ignored."""
    verdicts = _verdicts(probes)
    hi = min((q for q, v in verdicts.items() if not all(v)), default=None)
    lo = max((q for q, v in verdicts.items() if all(v) and (hi is None or q < hi)), default=None)
    return lo, hi


def _round(qps: float) -> float:
    """Rates as people write them: three significant digits."""
    return float(f"{qps:.3g}")


def next_rate(bounds: Bounds, probes: Sequence[Probe]) -> tuple[float | None, Outcome]:
    """The next rate to probe, or None and why the search is over."""
    lo, hi = boundary(probes)
    unrepeated = lo is not None and len(_verdicts(probes)[lo]) < bounds.repeats
    if hi is None:
        if lo is None:
            return bounds.start_qps, "found"
        if lo < bounds.max_qps:
            return min(_round(lo * bounds.growth), bounds.max_qps), "found"
        return (lo, "capped") if unrepeated else (None, "capped")
    if lo is None:
        lower = _round(hi / bounds.growth)
        return (lower, "found") if lower >= bounds.min_qps and lower < hi else (None, "none")
    middle = _round((lo + hi) / 2)
    if hi - lo > bounds.resolution * lo and middle not in (lo, hi):
        return middle, "found"
    # the interval is closed: the answer-to-be is probed again (a failure reopens the interval below it)
    return (lo, "found") if unrepeated else (None, "found")


# --------------------------------------------------------------------------- probes


class Interrupted(Exception):
    """Ctrl-C during a probe: the probe was stopped and wrote its report."""


@dataclass
class Searcher:
    """Runs probes as Locust subprocesses and keeps search.json and search.html up to date."""

    args: argparse.Namespace
    passthrough: Sequence[str]
    directory: Path
    result: SearchResult

    def probe(self, qps: float, *, confirm: bool = False) -> Probe:
        number = len(self.result.probes) + 1
        run_id = f"{'confirm' if confirm else 'probe'}-{number:02d}-{qps:g}qps"
        hold = self.args.confirm_duration if confirm else self.args.probe_duration
        criteria = self.directory / ("criteria-confirm.yaml" if confirm else "criteria.yaml")
        command = [
            sys.executable, "-m", "locust", "-f", self.args.locustfile, "--headless", "--only-summary",
            "--host", self.result.host, "--workload", self.args.workload, "--target-qps", f"{qps:g}",
            "--stages", "100", "--stage-duration", f"{hold:g}", "--warmup", f"{self.args.probe_warmup:g}",
            "--drain-timeout", f"{self.args.probe_drain:g}", "--run-id", run_id,
            "--reports-dir", str(self.directory), "--verdict", "--criteria", str(criteria),
            *(f"--goodput-slo={spec}" for spec in self.args.goodput_slo), *self.passthrough,
        ]  # fmt: skip
        print(f"llmload search: probe {number} at {qps:g} req/s ({hold:g} s hold) ...", end="", flush=True)
        log = self.directory / f"{run_id}.log"
        with log.open("wb") as output:
            # its own session: a Ctrl-C at the terminal reaches the search, which stops the probe once
            proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(self.args.probe_drain + STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                self._add(Probe(run_id=run_id, qps=qps, passed=None, confirm=confirm))
                print(" interrupted")
                raise Interrupted from None
        if code == 2:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise InputError(f"probe {run_id} refused its configuration:\n  " + "\n  ".join(tail))
        probe = self._read(run_id, qps, confirm)
        self._add(probe)
        status = "unfinished" if probe.passed is None else "PASS" if probe.passed else "FAIL"
        print(f" {status}" + "".join(f"\n    {line}" for line in probe.failed_checks))
        return probe

    def _read(self, run_id: str, qps: float, confirm: bool) -> Probe:
        run_dir = self.directory / run_id
        if not (run_dir / VERDICT_FILE).is_file() or not (run_dir / SUMMARY_FILE).is_file():
            return Probe(run_id=run_id, qps=qps, passed=None, confirm=confirm)
        verdict = Verdict.model_validate_json((run_dir / VERDICT_FILE).read_bytes())
        hold = Summary.model_validate_json((run_dir / SUMMARY_FILE).read_bytes()).stages[-1]
        return Probe(
            run_id=run_id,
            qps=qps,
            passed=verdict.passed,
            failed_checks=[r for r in verdict.reasons if r.startswith("FAIL")],
            achieved_qps=hold.achieved_qps,
            goodput_qps=hold.goodput.requests_per_s if hold.goodput else None,
            ttft_p50_ms=hold.ttft_p50_ms,
            ttft_p99_ms=hold.ttft_p99_ms,
            e2e_p99_ms=hold.e2e_p99_ms,
            confirm=confirm,
        )

    def _add(self, probe: Probe) -> None:
        self.result.probes.append(probe)
        self.save()

    def save(self) -> None:
        """search.json and search.html as they stand: an interrupted search keeps what it learned."""
        result = self.result
        lo, hi = boundary(result.probes)
        result.passing_qps = lo
        result.failing_qps = hi
        failing = [p for p in result.judged() if p.qps == hi and not p.passed]
        result.failing_reason = _reason(failing[0]) if failing else None
        (self.directory / RESULT_FILE).write_bytes(
            orjson.dumps(result.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        )
        render_page(result, self.directory / PAGE_FILE)


def _reason(probe: Probe) -> str:
    """The first check that failed, as `name: detail` (its verdict line), and how many more did."""
    if not probe.failed_checks:
        return "no verdict"
    more = len(probe.failed_checks) - 1
    return probe.failed_checks[0].removeprefix("FAIL ") + (f" (and {more} more check(s))" if more else "")


# --------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="target base URL (default: the embedded target, started once)")
    parser.add_argument("--workload", default="workloads/chat-multiturn.yaml")
    parser.add_argument("--max-qps", type=float, required=True, help="the highest rate to probe, req/s")
    parser.add_argument(
        "--start-qps", type=float, default=None, help="first rate (default: the workload's, else max/8)"
    )
    parser.add_argument("--min-qps", type=float, default=None, help="lowest rate to probe (default: max/256)")
    parser.add_argument("--resolution", type=float, default=0.05, help="stop when the interval is this narrow (0.05)")
    parser.add_argument("--repeats", type=int, default=2, help="probes the answer must pass, all of them (2)")
    parser.add_argument("--probe-duration", type=parse_duration, default=30.0, help="each probe's hold (30s)")
    parser.add_argument(
        "--probe-warmup", type=lambda t: parse_duration(t, allow_zero=True), default=10.0,
        help="unjudged lead-in of each probe at its rate (10s)",
    )  # fmt: skip
    parser.add_argument(
        "--probe-drain", type=float, default=10.0, help="seconds a probe's requests may finish after its hold (10)"
    )
    parser.add_argument("--confirm", action="store_true", help="then soak at the rate found (--confirm-duration)")
    parser.add_argument("--confirm-duration", type=parse_duration, default=300.0, help="the confirming hold (5m)")
    parser.add_argument("--require-qps", type=float, default=None, help="exit 1 unless the answer is at least this")
    parser.add_argument("--goodput-slo", action="append", default=[], metavar="SPEC", help=GOODPUT_SYNTAX)
    add_criteria_arguments(parser)
    parser.add_argument("--locustfile", default="loadtests/chat.py")
    parser.add_argument("--search-id", default=None, help="directory under --reports-dir (default: search-TIME)")
    parser.add_argument("--reports-dir", default="reports")


def _bounds(args: argparse.Namespace) -> Bounds:
    """The search's range from the flags and the workload; InputError for nonsense."""
    if args.max_qps <= 0:
        raise InputError(f"--max-qps must be > 0, got {args.max_qps:g}")
    if args.repeats < 1 or not 0 < args.resolution < 1:
        raise InputError("--repeats must be ≥ 1 and --resolution within (0, 1)")
    min_qps = args.min_qps if args.min_qps is not None else args.max_qps / 256
    start = args.start_qps or load_workload(args.workload).spec.target_qps or args.max_qps / 8
    if not 0 < min_qps <= start <= args.max_qps:
        raise InputError(f"need 0 < --min-qps ({min_qps:g}) ≤ --start-qps ({start:g}) ≤ --max-qps ({args.max_qps:g})")
    return Bounds(_round(start), min_qps, args.max_qps, 2.0, args.resolution, args.repeats)


def _write_criteria(directory: Path, criteria: SoakCriteria, probe_s: float) -> None:
    """The probes' criteria: the user's, with drift windows short enough for a probe's hold to be
    judged for drift, at 99% confidence at least; the confirming soak gets the user's unchanged."""
    drift = criteria.drift.model_copy(
        update={
            "window_s": min(criteria.drift.window_s, probe_s / DRIFT_WINDOWS),
            "confidence": max(criteria.drift.confidence, DRIFT_CONFIDENCE),
        }
    )
    for name, chosen in (
        ("criteria.yaml", criteria.model_copy(update={"drift": drift})),
        ("criteria-confirm.yaml", criteria),
    ):
        (directory / name).write_text(yaml.safe_dump(chosen.model_dump(mode="json"), sort_keys=False))


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    """0: a passing rate was found (at least --require-qps; confirmed with --confirm); 1: none, or
    interrupted before one; 2: bad input."""
    if not Path(args.locustfile).is_file():
        raise InputError(f"no locustfile at {args.locustfile} (run from the repository root)")
    criteria = criteria_from_args(args)
    goodput_slo = parse_goodput_slo(args.goodput_slo) if args.goodput_slo else None
    if criteria.min_goodput_ratio is not None and goodput_slo is None:
        raise InputError("--min-goodput-ratio needs the SLOs goodput counts against: give --goodput-slo")
    bounds = _bounds(args)
    search_id = args.search_id or time.strftime("search-%Y%m%d-%H%M%S")
    directory = Path(args.reports_dir) / search_id
    directory.mkdir(parents=True, exist_ok=True)
    _write_criteria(directory, criteria, args.probe_duration)
    with contextlib.ExitStack() as stack:
        host = args.host
        if host is None:
            host = stack.enter_context(SimProcess(*EMBEDDED_TARGET_ARGS)).url
            print(f"llmload search: no --host given: started the embedded target at {host}")
        result = SearchResult(
            search_id=search_id, host=host, workload=args.workload, max_qps=bounds.max_qps,
            probe_s=args.probe_duration, repeats=bounds.repeats, started_at=time.time(), goodput_slo=goodput_slo,
            required_qps=args.require_qps,
        )  # fmt: skip
        searcher = Searcher(args, passthrough, directory, result)
        try:
            result.outcome = _search(searcher, bounds)
        except Interrupted:
            result.outcome = "interrupted"
        except KeyboardInterrupt:  # between probes
            result.outcome = "interrupted"
        except InputError:
            result.outcome = "aborted"
            searcher.save()
            raise
        result.finished_at = time.time()
        searcher.save()
    print(f"\nllmload search: {result.conclusion}")
    if result.confirmed is not None:
        print(f"  confirming soak at {result.passing_qps:g} req/s: {'PASS' if result.confirmed else 'FAIL'}")
    print(f"page: {directory / PAGE_FILE}")
    answer = result.passing_qps if result.outcome in ("found", "capped", "interrupted") else None
    if answer is None or result.confirmed is False:
        return 1
    if args.require_qps is not None and answer < args.require_qps:
        print(f"llmload search: {answer:g} req/s is below --require-qps {args.require_qps:g}")
        return 1
    return 0


def _search(searcher: Searcher, bounds: Bounds) -> Outcome:
    while True:
        qps, outcome = next_rate(bounds, searcher.result.probes)
        if qps is None:
            break
        if searcher.probe(qps).passed is None:
            print("llmload search: the probe did not finish (see its .log); stopping")
            return "aborted"
    lo, _ = boundary(searcher.result.probes)
    if searcher.args.confirm and lo is not None:
        searcher.result.confirmed = bool(searcher.probe(lo, confirm=True).passed)
    return outcome
