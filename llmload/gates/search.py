"""`llmload search`: the highest request rate whose hold passes the soak verdict.

Each probe is an ordinary run (`locust -f loadtests/chat.py --verdict`): a warm-up, then one
hold at the probed rate, judged by the soak verdict (OOM family, errors, achieved rate, SLOs,
goodput, drift). The search brackets first (the rate grows ×2 from --start-qps until a probe
fails), then bisects. A rate passes only when every probe at it passed, and once the interval is
narrow enough, the rate that would become the answer is probed again up to --repeats times, so one
lucky probe never decides it (a noisy failure can only make the answer lower: the safe side for a
release gate). A probe failing marginally (on a drift whose slope passes the limit at its estimate
but not at its confidence interval's low end, and on nothing else) is a suspicion the next probe
at the same rate decides: overload drifts again, a false alarm does not (a CI run saw a false p99
TTFT drift at 88% of saturation move the answer 19% lower). A drift past the limit at the low end
too is overload, decided at once. Each probe replays sessions of its own (`--first-session` past
every session the earlier probes could open), so a repeat judges another sample of the workload,
not the same requests at other times. The answer is always a rate that passed; the boundary is
reported as an interval with the checks that failed above it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from llmload.errors import InputError
from llmload.gates.criteria import DriftCriteria, SoakCriteria
from llmload.gates.locust_run import LocustRun
from llmload.models import Probe, SearchOutcome, SearchResult, StageFigures, StageSummary, Verdict
from llmload.plan import PlanFlags
from llmload.process_group import run_to_end
from llmload.rundir import MANIFEST_FILE, read_manifest, read_summary
from llmload.workload import load_workload

RESULT_FILE = "search.json"
PAGE_FILE = "search.html"
DRIFT_CONFIDENCE = 0.99  # a search judges many holds: at 95% one in four searches would meet a false drift
E2E_SHARE_OF_HOLD = 1 / 3  # a probe whose E2E p99 is over this share of its hold is too short to judge
PROBE_S = 30.0  # --probe-duration's default: each probe's hold
PROBE_WARMUP_S = 10.0  # --probe-warmup's default: each probe's unjudged lead-in
PROBE_DRAIN_S = 120.0  # --probe-drain's default: a cap, the drain ends with the last answer (llmload.drain)
CONFIRM_S = 300.0  # --confirm-duration's default: the confirming hold
RESOLUTION = 0.05  # --resolution's default: stop when the interval is this narrow
REPEATS = 2  # --repeats's default: the probes the answer must pass
LONGEST_HOLD = 8  # a probe too short for its latencies is lengthened, up to this many times --probe-duration

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


def _verdicts(probes: Sequence[Probe]) -> tuple[dict[float, list[bool]], set[float]]:
    """Each judged rate's verdicts, and the rates whose last probe failed marginally (on a drift only
    its estimate put over the limit) or could not tell (INCONCLUSIVE: too short for its latencies or
    its noise): a suspicion the next, longer probe at that rate decides (its verdict counts; the
    suspicion's does not). A marginal failure is retried once even after a too-short probe at its
    rate, which judged no drift (a CI run's real vLLM at 7% of its capacity lost its 2 req/s that
    way). An INCONCLUSIVE probe at the longest hold counts as not passing."""
    out: dict[float, list[bool]] = {}
    suspected: set[float] = set()
    retried: set[float] = set()  # rates whose last judged probe failed marginally: its retry counts
    for probe in probes:
        if probe.passed is None:
            continue
        if probe.confirm:  # the longest hold at that rate decides it: a failure reopens the search below
            out.setdefault(probe.qps, []).append(probe.passed)
            continue
        if probe.too_short:  # the next probe at this rate holds longer
            suspected.add(probe.qps)
            continue
        if not probe.passed and probe.marginal and probe.qps not in retried:
            suspected.add(probe.qps)
            retried.add(probe.qps)
            continue
        suspected.discard(probe.qps)
        retried.discard(probe.qps)
        out.setdefault(probe.qps, []).append(probe.passed)
    return out, suspected


def boundary(probes: Sequence[Probe]) -> tuple[float | None, float | None]:
    """(highest passing rate below the lowest failing one, lowest failing rate): a rate passes only
    when every probe at it passed; a passing rate above a failing one is noise and ignored."""
    verdicts, _ = _verdicts(probes)
    hi = min((q for q, v in verdicts.items() if not all(v)), default=None)
    lo = max((q for q, v in verdicts.items() if all(v) and (hi is None or q < hi)), default=None)
    return lo, hi


def vouched(probes: Sequence[Probe], rate: float | None) -> float | None:
    """The rate the search vouches for: what the passing holds at `rate` show the server serves
    (keeping up's lower bound, at its pass confidence), the confirm's where it ran (its hold is the
    longest), else the lowest of the probes'. A probe passes while an overload of up to 10% cannot be
    ruled in, so the rate itself may lie above the capacity; this bound does in under 1% of searches
    (docs/gates.md). The rate itself for probes judged before the bound was recorded."""
    if rate is None:
        return None
    confirms: list[float] = []
    probed: list[float] = []
    for probe in probes:
        if probe.qps == rate and probe.passed and probe.served_low_qps is not None:
            (confirms if probe.confirm else probed).append(probe.served_low_qps)
    if not confirms and not probed:
        return rate
    low = confirms[-1] if confirms else min(probed)
    digits = 2 - math.floor(math.log10(low)) if low > 0 else 0  # three significant digits, rounded down
    return min(math.floor(low * 10**digits) / 10**digits, rate)


def _round(qps: float) -> float:
    """Rates as people write them: three significant digits."""
    return float(f"{qps:.3g}")


def next_rate(bounds: Bounds, probes: Sequence[Probe]) -> tuple[float | None, SearchOutcome]:
    """The next rate to probe, or None and why the search is over."""
    verdicts, suspected = _verdicts(probes)
    if suspected:
        return min(suspected), "found"
    lo, hi = boundary(probes)
    unrepeated = lo is not None and len(verdicts[lo]) < bounds.repeats
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


@dataclass(frozen=True)
class ProbeFlags:
    """How each probe runs: an ordinary Locust run of one held stage after a warm-up."""

    locustfile: str
    workload: str
    hold_s: float
    warmup_s: float
    drain_s: float
    confirm_s: float
    confirm: bool = False  # after the search, soak confirm_s at the rate found
    goodput_slo: tuple[str, ...] = ()
    seed: int = 0  # a rate's first probe; the k-th repeat at that rate takes seed + k
    reset_prefix_cache: bool = True  # before each probe, where the server offers it (--keep-prefix-cache: not)


@dataclass
class Searcher:
    """Runs probes as Locust subprocesses and keeps search.json and search.html up to date."""

    flags: ProbeFlags
    passthrough: Sequence[str]
    directory: Path
    result: SearchResult

    def _first_session(self) -> int:
        """Where the next probe's replay begins: past every session the earlier probes could open (one
        per arrival at most), so each probe, a repeat too, is judged on requests of its own."""
        flags = self.flags
        held = (
            flags.warmup_s + (flags.confirm_s if p.confirm else p.hold_s or flags.hold_s) for p in self.result.probes
        )
        return sum(math.ceil(p.qps * s) for p, s in zip(self.result.probes, held, strict=True))

    def hold_and_drain(self, qps: float, *, confirm: bool) -> tuple[float, float]:
        """The next probe's hold and drain at `qps`: as many requests as the last probe that passed held (at
        least --probe-duration: fewer could not tell there), or longer after a probe at this rate that
        could not tell (INCONCLUSIVE): the
        hold its verdict says would tell, with a fifth more, or twice its hold, or enough for its E2E p99,
        whichever is longest, at most LONGEST_HOLD times --probe-duration; a drain of twice that p99."""
        flags = self.flags
        if confirm:
            return flags.confirm_s, flags.drain_s
        passed = [p for p in self.result.probes if not p.confirm and p.passed]
        # the requests that probe held, at this rate: a queue's noise needs requests, not seconds
        base = max(flags.hold_s, (passed[-1].hold_s or flags.hold_s) * passed[-1].qps / qps) if passed else flags.hold_s
        base = math.ceil(base)
        short = [p for p in self.result.probes if p.qps == qps and not p.confirm]
        if not short or not short[-1].too_short:
            return min(base, LONGEST_HOLD * flags.hold_s), flags.drain_s
        last = short[-1]
        held = last.hold_s or flags.hold_s
        e2e_s = (last.e2e_p99_ms or 0.0) / 1000
        told = math.ceil(1.2 * last.hold_needed_s) if last.hold_needed_s else 0
        hold = min(LONGEST_HOLD * flags.hold_s, max(2 * held, told, math.ceil(1.5 * e2e_s / E2E_SHARE_OF_HOLD)))
        return hold, max(flags.drain_s, math.ceil(2 * e2e_s))

    def locust_run(self, qps: float, run_id: str, *, confirm: bool) -> LocustRun:
        """The probe's Locust run: one judged stage at `qps` after the warm-up, on sessions of its own."""
        flags = self.flags
        # a repeat with the same arrivals would replay the same run on a deterministic target
        seed = flags.seed + sum(p.qps == qps and p.confirm == confirm for p in self.result.probes)
        criteria = self.directory / ("criteria-confirm.yaml" if confirm else "criteria.yaml")
        hold, drain = self.hold_and_drain(qps, confirm=confirm)
        plan = PlanFlags.checked(
            workload=flags.workload, target_qps=qps, stages="100", stage_duration_s=hold, warmup_s=flags.warmup_s,
            drain_s=drain, seed=seed, first_session=self._first_session(), goodput_slo=flags.goodput_slo,
        )  # fmt: skip
        return LocustRun(
            host=self.result.host, run_id=run_id, reports_dir=str(self.directory), verdict=True,
            criteria=str(criteria), reset_prefix_cache=flags.reset_prefix_cache, plan=plan,
        )  # fmt: skip

    def probe(self, qps: float, *, confirm: bool = False) -> Probe:
        number = len(self.result.probes) + 1
        run_id = f"{'confirm' if confirm else 'probe'}-{number:02d}-{qps:g}qps"
        hold, _ = self.hold_and_drain(qps, confirm=confirm)
        command = [*self.locust_run(qps, run_id, confirm=confirm).command(self.flags.locustfile), *self.passthrough]
        print(f"llmload search: probe {number} at {qps:g} req/s ({hold:g} s hold) ...", end="", flush=True)
        log = self.directory / f"{run_id}.log"
        with log.open("wb") as output:
            # a Ctrl-C at the terminal reaches only the search, which stops the probe (its group too)
            try:
                code = run_to_end(command, stdout=output)
            except KeyboardInterrupt:
                self._add(Probe(run_id=run_id, qps=qps, hold_s=hold, passed=None, confirm=confirm))
                print(" interrupted")
                raise Interrupted from None
        if code == 2:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise InputError(f"probe {run_id} refused its configuration:\n  " + "\n  ".join(tail))
        probe = self._read(run_id, qps, hold, confirm)
        self._add(probe)
        status = "not judged" if probe.passed is None else "PASS" if probe.passed else "FAIL"
        if probe.too_short:
            status = "INCONCLUSIVE (its hold is too short to tell: the next probe at this rate holds longer)"
        elif qps in _verdicts(self.result.probes)[1]:
            status += " (marginal drift: the next probe at this rate decides)"
        if probe.unfinished:
            status += f"; {probe.unfinished} of {probe.sent} sent in the hold still running when the drain ended"
        print(f" {status}" + "".join(f"\n    {line}" for line in probe.failed_checks))
        return probe

    def _read(self, run_id: str, qps: float, hold_s: float, confirm: bool) -> Probe:
        run_dir = self.directory / run_id
        summary = read_summary(run_dir)
        if summary is None or summary.verdict is None:
            probe = Probe(run_id=run_id, qps=qps, hold_s=hold_s, passed=None, confirm=confirm)
        else:
            probe = self.judged_probe(run_id, qps, hold_s, summary.verdict, summary.stages[-1], confirm=confirm)
            probe.gpu_count = summary.cost.gpu_count if summary.cost is not None else None
        if (run_dir / MANIFEST_FILE).is_file():
            probe.cache_reset = read_manifest(run_dir).prefix_cache_reset
        return probe

    def judged_probe(
        self, run_id: str, qps: float, hold_s: float, verdict: Verdict, hold: StageSummary, *, confirm: bool
    ) -> Probe:
        """What the search learns from a probe's verdict and its hold's figures."""
        failed_checks = [r for r in verdict.reasons if r.startswith(("FAIL", "INCONCLUSIVE"))]
        unsure = verdict.outcome == "inconclusive"  # too short to tell: held longer, never passed
        # a queue shows as answers that grow with the hold: asked only when the hold was short for its answers
        # (hold length), not when the count of requests was too small to tell (a noisy p99 would decide)
        short = unsure and "hold_length" in verdict.inconclusive_kinds
        queue = self._grows_with_hold(qps, hold_s, hold.e2e_p99_ms) if short else None
        if queue is not None:  # the reason that decided, first
            failed_checks.insert(0, f"FAIL hold length: {queue}")
        return Probe(
            run_id=run_id,
            qps=qps,
            hold_s=hold_s,
            passed=verdict.passed,
            failed_checks=failed_checks,
            failed_kinds=verdict.failed_kinds,
            marginal=verdict.marginal,
            inconclusive=unsure and queue is None,
            hold_needed_s=verdict.hold_needed_s,
            served_low_qps=verdict.served_low_qps,
            too_short=unsure and queue is None and not confirm and hold_s < LONGEST_HOLD * self.flags.hold_s,
            sent=hold.ok + hold.failed + hold.unfinished,
            unfinished=hold.unfinished,
            achieved_qps=hold.achieved_qps,
            **StageFigures.of(hold).model_dump(),
            confirm=confirm,
        )

    def _grows_with_hold(self, qps: float, hold_s: float, e2e_p99_ms: float | None) -> str | None:
        """Why a longer hold would not help: the E2E p99 grew about as much as the hold did since the
        last probe at this rate (a queue grows with time, a long answer does not); None when it did not."""
        earlier = next((p for p in reversed(self.result.probes) if p.qps == qps and p.too_short), None)
        if earlier is None or not earlier.e2e_p99_ms or not e2e_p99_ms:
            return None
        before, now = earlier.e2e_p99_ms / 1000, e2e_p99_ms / 1000
        held = earlier.hold_s or self.flags.hold_s
        if now / hold_s < 0.75 * before / held:
            return None
        return (
            f"the E2E p99 grew with the hold ({before:.1f} s in {held:g} s, then {now:.1f} s in {hold_s:g} s):"
            f" requests queue longer the longer the hold, so the server does not keep up at {qps:g} req/s"
        )

    def _add(self, probe: Probe) -> None:
        self.result.probes.append(probe)
        self.save()

    def save(self) -> None:
        """search.json and search.html as they stand: an interrupted search keeps what it learned."""
        from llmload.report.search_page import render_page  # matplotlib: only once there is a probe to draw

        self.conclude()
        (self.directory / RESULT_FILE).write_bytes(
            orjson.dumps(self.result.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        )
        render_page(self.result, self.directory / PAGE_FILE)

    def conclude(self) -> None:
        """The answer, the boundary and why it fails above, from the probes so far."""
        result = self.result
        lo, hi = boundary(result.probes)
        result.passing_qps = lo
        result.answer_qps = vouched(result.probes, lo)
        result.failing_qps = hi
        # the probe that decided it (a failed confirm too), not a suspicion asked again (a hold too short)
        failing = [p for p in result.probes if p.qps == hi and p.passed is False and not p.too_short]
        result.failing_reason = _reason(failing[-1]) if failing else None


def probe_options(flags: ProbeFlags) -> list[str]:
    """The flags every probe sets (a first probe's run sets them all): refused among those passed through."""
    first = Searcher(flags, (), Path(), SearchResult.model_construct(host="", probes=[]))
    return first.locust_run(1.0, "probe", confirm=False).options()


def _reason(probe: Probe) -> str:
    """The first check that failed, as `name: detail` (its verdict line), and how many more did."""
    if not probe.failed_checks:
        return "no verdict"
    more = len(probe.failed_checks) - 1
    return probe.failed_checks[0].removeprefix("FAIL ") + (f" (and {more} more check(s))" if more else "")


def bounds_from(
    workload: str, *, max_qps: float, start_qps: float | None, min_qps: float | None, resolution: float, repeats: int
) -> Bounds:
    """The search's range from the flags and the workload; InputError for nonsense."""
    if max_qps <= 0:
        raise InputError(f"--max-qps must be > 0, got {max_qps:g}")
    if repeats < 1 or not 0 < resolution < 1:
        raise InputError("--repeats must be ≥ 1 and --resolution within (0, 1)")
    lowest = min_qps if min_qps is not None else max_qps / 256
    start = start_qps or load_workload(workload).spec.target_qps or max_qps / 8
    if not 0 < lowest <= start <= max_qps:
        raise InputError(f"need 0 < --min-qps ({lowest:g}) ≤ --start-qps ({start:g}) ≤ --max-qps ({max_qps:g})")
    return Bounds(_round(start), lowest, max_qps, 2.0, resolution, repeats)


def _judged_in(criteria: SoakCriteria, hold_s: float, confidence: float) -> DriftCriteria:
    window = min(criteria.drift.window_s, hold_s / criteria.drift.min_windows)  # the fewest a slope is judged on
    return criteria.drift.model_copy(update={"window_s": window, "confidence": confidence})


def probe_criteria(criteria: SoakCriteria, probe_s: float) -> SoakCriteria:
    """A probe's criteria: the user's, with drift windows short enough for a probe's hold to be judged
    for drift, at 99% confidence at least, and a hold too short for its E2E p99 (over a third) failed,
    unless the user chose that share."""
    drift = _judged_in(criteria, probe_s, max(criteria.drift.confidence, DRIFT_CONFIDENCE))
    share = criteria.max_e2e_share_of_hold or E2E_SHARE_OF_HOLD
    return criteria.model_copy(update={"drift": drift, "max_e2e_share_of_hold": share})


def confirm_criteria(criteria: SoakCriteria, confirm_s: float) -> SoakCriteria:
    """The confirming soak's: the user's, its windows too made short enough for its hold (a 40 s confirm
    in 10 s windows had 4, every drift check SKIPped, and a queue growing tenfold passed)."""
    return criteria.model_copy(update={"drift": _judged_in(criteria, confirm_s, criteria.drift.confidence)})


def write_criteria(directory: Path, criteria: SoakCriteria, probe_s: float, confirm_s: float) -> None:
    """The probes' criteria and the confirm's, beside the probes."""
    for name, chosen in (
        ("criteria.yaml", probe_criteria(criteria, probe_s)),
        ("criteria-confirm.yaml", confirm_criteria(criteria, confirm_s)),
    ):
        (directory / name).write_text(yaml.safe_dump(chosen.model_dump(mode="json"), sort_keys=False))


def search(searcher: Searcher, bounds: Bounds) -> SearchOutcome:
    """Probe until the interval closes; with --confirm, soak at the answer, and when that longer hold
    fails (a queue a short probe could not show) go on below it: the answer is a confirmed rate."""
    while True:
        qps, outcome = next_rate(bounds, searcher.result.probes)
        confirm = qps is None
        if qps is None:
            qps, _ = boundary(searcher.result.probes)
            if not searcher.flags.confirm or qps is None:
                return outcome
        passed = searcher.probe(qps, confirm=confirm).passed
        if passed is None:
            print("llmload search: the probe did not finish (see its .log); stopping")
            return "aborted"
        if confirm:
            searcher.result.confirmed = passed
            if passed:
                return outcome
