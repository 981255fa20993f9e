"""search.json's contract: a capacity search's probes and answer, and the Pareto points probes plot."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmload.models.run import GoodputSLO, PrefixCacheReset
from llmload.models.summary import StageFigures
from llmload.models.verdict import CheckKind

# --------------------------------------------------------------------------- capacity search (search.json)

SearchOutcome = Literal["found", "capped", "none", "interrupted", "aborted"]


def answer_words(passing_qps: float | None, outcome: SearchOutcome | None) -> str:
    """A search's answer as a figure that says what it is: `9.5 req/s`, or at --max-qps a lower bound,
    `≥ 32 req/s (the cap, --max-qps)`."""
    if passing_qps is None:
        return "no passing rate"
    if outcome == "capped":
        return f"≥ {passing_qps:g} req/s (the cap, --max-qps)"
    return f"{passing_qps:g} req/s"


class Probe(StageFigures):
    """One probe: an ordinary run directory under the search's, and what its hold showed (its figures: the hold's)."""

    run_id: str
    qps: float
    hold_s: float | None = Field(default=None, description="its hold; None: the search's --probe-duration")
    passed: bool | None = Field(description="None: interrupted or unfinished, never judged")
    failed_checks: list[str] = Field(default_factory=list, description="verdict lines of the checks that failed")
    failed_kinds: list[CheckKind] = Field(default_factory=list, description="the kind of each check that failed")
    marginal: bool = Field(default=False, description="failed only on checks a second hold may reverse")
    hold_needed_s: float | None = Field(default=None, description="INCONCLUSIVE: about the hold that would tell")
    served_low_qps: float | None = Field(
        default=None, description="the rate its hold shows the server serves (keeping up's lower bound)"
    )
    inconclusive: bool = Field(default=False, description="its verdict was INCONCLUSIVE: never a pass")
    too_short: bool = Field(
        default=False,
        description="failed only because its hold was short for its latencies: the next probe at its rate holds longer",
    )
    sent: int | None = Field(default=None, description="requests sent in the hold the target is judged on")
    unfinished: int | None = Field(default=None, description="of those, still running when the drain ended")
    achieved_qps: float | None = None
    gpu_count: int | None = Field(default=None, description="GPUs its run saw (summary.json's cost); None: none")
    confirm: bool = Field(default=False, description="the --confirm soak at the rate found")
    cache_reset: PrefixCacheReset | None = Field(default=None, description="the prefix cache emptied before it")

    def figures(self) -> str:
        """The latency it measured, as a sentence's end: `TTFT p50 40 / p99 120 ms, E2E p50 ...`."""

        def ms(value: float | None) -> str:
            return "–" if value is None else f"{value:,.0f}"

        return (
            f"TTFT p50 {ms(self.ttft_p50_ms)} / p99 {ms(self.ttft_p99_ms)} ms, "
            f"E2E p50 {ms(self.e2e_p50_ms)} / p99 {ms(self.e2e_p99_ms)} ms"
        )


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
    outcome: SearchOutcome = "interrupted"
    passing_qps: float | None = Field(default=None, description="the highest rate every probe at it passed")
    answer_qps: float | None = Field(
        default=None,
        description="the answer: the rate the passing holds at passing_qps show the server serves, at keeping up's"
        " pass confidence (gates.search.vouched)",
    )
    failing_qps: float | None = Field(default=None, description="the lowest failing rate above the answer")
    failing_reason: str | None = None
    confirmed: bool | None = Field(default=None, description="the --confirm soak passed; None: not run")
    required_qps: float | None = None
    prefix_cache_kept: bool = Field(default=False, description="--keep-prefix-cache: no probe emptied it")
    latency_slo: bool = Field(
        default=False,
        description="the gate holds latency to an SLO (--slo-ttft-p99-ms, --slo-ttfo-p99-ms, --slo-e2e-p99-ms,"
        " --min-goodput-ratio);"
        " without one, the answer is the highest rate the server keeps up with, however slow",
    )

    def judged(self) -> list[Probe]:
        return [p for p in self.probes if p.passed is not None and not p.confirm]

    @property
    def cache_note(self) -> str | None:
        """Whether each probe began with an empty prefix cache, in a sentence; None before any probe said."""
        if self.prefix_cache_kept:
            return (
                "The prefix cache was kept between probes (--keep-prefix-cache): a probe may have been served prefixes"
                " the one before it left cached."
            )
        told = [p.cache_reset for p in self.probes if p.cache_reset is not None]
        if not told:
            return None
        emptied = sum(reset.reset for reset in told)
        if emptied == len(told):
            return f"The prefix cache was emptied before each probe ({told[0].how})."
        why = next(reset.how for reset in told if not reset.reset)
        before = "any probe" if not emptied else f"{len(told) - emptied} of {len(told)} probes"
        return (
            f"The prefix cache was not emptied before {before}: {why}. A probe may have been served prefixes the"
            " one before it left cached."
        )

    @property
    def answer_probe(self) -> Probe | None:
        """The last probe that passed at the answer: the figures it is reported with."""
        return next((p for p in reversed(self.judged()) if p.qps == self.passing_qps and p.passed), None)

    @property
    def answer(self) -> str:
        """`≥ 9.3 req/s`: what the search vouches for (answer_qps; a search.json of an earlier llmload has
        only its passing rate), at --max-qps said as the cap."""
        qps = self.answer_qps if self.answer_qps is not None else self.passing_qps
        if qps is None:
            return "no passing rate"
        at_cap = qps == self.passing_qps and self.outcome == "capped"
        return f"≥ {qps:g} req/s" + (" (the cap, --max-qps)" if at_cap else "")

    @property
    def shown(self) -> str:
        """How the answer was found: the holds at the passing rate, when they vouch for less than it."""
        lo = self.passing_qps
        if lo is None or self.answer_qps is None or self.answer_qps >= lo:
            return ""
        where = "the cap, --max-qps" if self.outcome == "capped" else "the highest rate that passed"
        return (
            f" (what its holds at {lo:g} req/s, {where}, show it serves at 99%; a hold passes once it rules out an"
            " overload of 10%, so a rate up to 10% over the limit can pass)"
        )

    @property
    def conclusion(self) -> str:
        """One sentence: the answer and the boundary, or why there is none."""
        lo, hi = self.passing_qps, self.failing_qps
        boundary = f" It fails at {hi:g} req/s: {self.failing_reason}." if hi is not None else ""
        if self.outcome == "capped":
            return f"Keeps up with {self.answer}{self.shown}: the highest rate probed passed, its limit may lie above."
        if lo is None:
            what = {"none": "No probed rate passed", "interrupted": "Interrupted before any rate passed"}
            return f"{what.get(self.outcome, 'The search stopped before any rate passed')}.{boundary}"
        found = f"Keeps up with {self.answer}{self.shown}"
        if hi is not None:
            found += f"; the boundary lies between {lo:g} and {hi:g} req/s"
        suffix = {"interrupted": " (interrupted: what was learned so far)", "aborted": " (the search was aborted)"}
        return f"{found}{suffix.get(self.outcome, '')}.{boundary}"

    @property
    def latency_note(self) -> str | None:
        """Without a latency SLO the answer only says the server keeps up: its latency there, and how to
        ask for a usable rate."""
        probe = self.answer_probe
        if probe is None:
            return None
        at = f"At {probe.qps:g} req/s: {probe.figures()}."
        if self.latency_slo:
            return at
        return (
            f"{at} No latency SLO was given, so this is the highest rate the server keeps up with, however slow:"
            " give --slo-ttft-p99-ms / --slo-e2e-p99-ms for the highest rate users can live with."
        )


# --------------------------------------------------------------------------- the Pareto frontier


class ParetoPoint(BaseModel):
    """One configuration held at one rate (a search's probe, a soak's 100% stage): what the server gives
    in all against what each of its users sees, the two a configuration trades against each other."""

    configuration: str | None = Field(description="the sweep's configuration; None: a search's own probe")
    qps: float = Field(description="the rate it was held at")
    run: str = Field(description="its run directory, relative to the page")
    output_tokens_per_s_per_gpu: float = Field(
        description="the hold's output tok/s of successful requests over the GPUs its run saw (all, when none)"
    )
    gpu_count: int | None = Field(description="GPUs its run saw; None: none, the tok/s are the server's")
    tokens_per_s_per_user: float = Field(description="1000 / the hold's TPOT p50: one user's stream")
    passed: bool | None = Field(description="the verdict of its probe or soak; None: not judged")
    on_frontier: bool = Field(
        default=False, description="it passed, and no other that passed gives as much on both axes and more on one"
    )

    @property
    def label(self) -> str:
        rate = f"{self.qps:g} req/s"
        return rate if self.configuration is None else f"{self.configuration} @ {rate}"
