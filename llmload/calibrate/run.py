"""`llmload sim calibrate`'s orchestration (`calibrate`): burst rounds and the steady-load point
measured within the budget and fitted (`measure_and_fit`, the half that talks to the server), then
the profile that records them (`calibrated_profile`, built from what was measured alone)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import ValidationError

from llmload.calibrate.measure import (
    SHORT_PROMPT,
    ProbeShape,
    Rounds,
    SteadyRequest,
    measure_rounds,
    measure_steady_load,
    probes_for,
)
from llmload.calibrate.prompts import PromptMaker
from llmload.calibrate.regression import Fit, Observation, fit_steady_load, fit_timing
from llmload.calibrate.target import ServerFacts, public_url, read_facts, sized_serving
from llmload.capacity.kv import longest_held, sequences_held
from llmload.errors import InputError, validation_message
from llmload.models import ServeConfig
from llmload.sim.profiles import CalibrationFit, EngineProfile, SteadyLoadPoint, StepTiming

# the dry runs that count steps need no timing: this stands in until the fit gives one
_UNTIMED = StepTiming(
    frontend_ms=0, prefill_tokens_per_s=1, decode_base_ms=0, decode_per_seq_ms=0, decode_per_kv_token_us=0
)
MIN_PREFILL_POINTS, MIN_DECODE_POINTS = 2, 3
STEADY_LOAD_SHARE = 0.25  # of the budget, by default
STEADY_LOAD_UTILIZATION = 0.5  # of the rate the burst fit saturates at: busy, yet not queueing without end
STEADY_SYSTEM_PROMPTS = (0.1, 0.2, 0.3)  # of the longest prompt the server takes: shared by turns
STEADY_USER_PROMPT = 0.05
MIN_STEADY_REQUESTS = 8
STEADY_WINDOW_S = 8.0  # the steady-load point comes in windows at least this long, between burst rounds
MAX_STEADY_WINDOWS = 4
WINDOW_GAP_S = 1.0  # between windows in the replay: the engine is idle again by then
FACTOR_NOTE = 0.1  # a steady-load factor further than this from 1 is said in the warnings


@dataclass(frozen=True)
class CalibrationSettings:
    """How long and how wide to calibrate, and what the server does not say itself."""

    budget_s: float = 120.0
    steady_load_s: float | None = None
    """Of the budget, for the steady-load point; None: a quarter of it; 0: none."""
    max_streams: int = 64
    output_tokens: int = 64
    model_name: str | None = None
    model_config: str | None = None
    serve: ServeConfig | None = None
    vllm_log: Path | None = None
    name: str | None = None


@dataclass(frozen=True)
class SteadyPlan:
    """What the steady-load point sends: chats at `rate_qps`, each one of `systems` (shared) and a
    user message of `user` tokens, for `duration_s` in all, split into `windows` windows."""

    rate_qps: float
    systems: tuple[int, ...]
    user: int
    duration_s: float
    windows: int

    @property
    def window_s(self) -> float:
        return self.duration_s / self.windows


def _steady_plan(
    facts: ServerFacts, profile: EngineProfile, *, duration_s: float, output_tokens: int
) -> SteadyPlan | None:
    """Half the rate the burst-fitted profile saturates at, with as many requests running as the KV
    cache holds; None when `duration_s` is too short for enough requests to average."""
    block = profile.serving.resolved().block_size
    longest = longest_held(facts.num_blocks, block, profile.max_model_len)
    systems = tuple(max(SHORT_PROMPT, int(f * longest)) for f in STEADY_SYSTEM_PROMPTS)
    user = max(SHORT_PROMPT, int(STEADY_USER_PROMPT * longest))
    prompt = sum(systems) / len(systems) + user
    running = max(1, min(profile.max_num_seqs, sequences_held(facts.num_blocks, prompt + output_tokens, block)))
    rate = STEADY_LOAD_UTILIZATION * profile.step_timing.saturation_qps(running, prompt, output_tokens)
    if rate * duration_s < MIN_STEADY_REQUESTS:
        return None
    windows = max(1, min(MAX_STEADY_WINDOWS, int(duration_s // STEADY_WINDOW_S)))
    return SteadyPlan(float(f"{rate:.3g}"), systems, user, duration_s, windows)


def _after(earlier: list[SteadyRequest], window: list[SteadyRequest]) -> list[SteadyRequest]:
    """A window's requests on the point's one clock: after the earlier windows' last token and an idle gap."""
    offset = max((r.token_times_s[-1] for r in earlier), default=-WINDOW_GAP_S) + WINDOW_GAP_S
    return [
        replace(r, sent_s=r.sent_s + offset, token_times_s=tuple(t + offset for t in r.token_times_s)) for r in window
    ]


def _measure(
    url: str, facts: ServerFacts, profile: EngineProfile, probes: list[ProbeShape], *, settings: CalibrationSettings,
    progress: Callable[[str], None],
) -> tuple[Rounds, Fit, SteadyPlan | None, list[SteadyRequest]]:  # fmt: skip
    """Burst rounds, and the steady-load point in windows between the later ones: half the bursts'
    budget first, whose fit sets the point's rate, then a share of rounds before each window."""
    steady_s = STEADY_LOAD_SHARE * settings.budget_s if settings.steady_load_s is None else settings.steady_load_s
    bursts_s = settings.budget_s - steady_s
    maker = PromptMaker(url, facts.served_model)

    def rounds_for(budget_s: float, resume: Rounds | None = None) -> Rounds:
        return measure_rounds(
            url, facts.served_model, probes=probes, maker=maker, budget_s=budget_s, progress=progress, resume=resume
        )

    def plan_from(rounds: Rounds) -> SteadyPlan | None:
        try:
            early = fit_timing(profile, facts.num_blocks, _observations(rounds)).timing
        except InputError:  # too few points yet to set a rate: the point is left out, and said so
            return None
        fitted = profile.model_copy(update={"timing": early})
        return _steady_plan(facts, fitted, duration_s=steady_s, output_tokens=settings.output_tokens)

    if steady_s <= 0:
        rounds = rounds_for(bursts_s)
        return rounds, fit_timing(profile, facts.num_blocks, _observations(rounds)), None, []
    rounds = rounds_for(bursts_s / 2)
    plan = plan_from(rounds)
    requests: list[SteadyRequest] = []
    if plan is None:  # the rest of the budget goes to bursts
        rounds = rounds_for(settings.budget_s - rounds.elapsed_s, rounds)
    else:
        chats = PromptMaker(url, facts.served_model, seed=1)
        for window in range(plan.windows):
            rounds = rounds_for((bursts_s - rounds.elapsed_s) / (plan.windows - window), rounds)
            sent = measure_steady_load(
                url, facts.served_model, chats, rate_qps=plan.rate_qps, duration_s=plan.window_s,
                system_tokens=plan.systems, user_tokens=plan.user, output_tokens=settings.output_tokens, window=window,
            )  # fmt: skip
            requests += _after(requests, sent)
            progress(
                f"steady load, window {window + 1} of {plan.windows}: {len(sent)} chats at {plan.rate_qps:g} req/s"
            )
    return rounds, fit_timing(profile, facts.num_blocks, _observations(rounds)), plan, requests


def serving_profile(facts: ServerFacts, settings: CalibrationSettings, name: str) -> EngineProfile:
    """The server's serving settings as a profile (no timing yet); its own config, when given, wins."""
    try:
        profile = EngineProfile(
            name=name,
            description=f"{facts.served_model}, calibrated against its server",
            calibration="llmload sim calibrate",
            serving=sized_serving(facts),
            timing=_UNTIMED,
        )
        if settings.serve is not None:
            profile = profile.with_serving(settings.serve)
    except ValidationError as exc:
        raise InputError(f"the server's settings do not make a profile: {validation_message(exc)}") from None
    return profile


def _observations(rounds: Rounds) -> list[Observation]:
    observations = []
    for probe, measured in rounds.measurements.items():
        if measured:
            prompts = [n for m in measured for n in m.prompt_tokens]
            observations.append(
                Observation(
                    kind=probe.kind,
                    streams=probe.streams,
                    prompt_tokens=round(sum(prompts) / len(prompts)),
                    output_tokens=probe.output_tokens,
                    values_ms=tuple(m.value_ms for m in measured),
                )
            )
    prefill = sum(1 for o in observations if o.kind == "prefill")
    decode = len(observations) - prefill
    if prefill < MIN_PREFILL_POINTS or decode < MIN_DECODE_POINTS:
        raise InputError(
            f"in {rounds.elapsed_s:.0f} s the calibration measured {prefill} prefill and {decode} decode points; "
            f"the fit needs at least {MIN_PREFILL_POINTS} and {MIN_DECODE_POINTS}: give a longer --duration"
            + (f" ({rounds.discarded} probes were discarded: other traffic on the server)" if rounds.discarded else "")
        )
    return observations


@dataclass(frozen=True)
class MeasuredFit:
    """What `measure_and_fit` took from the server and fitted to it: everything the profile's record
    is built from (`calibrated_profile`), which asks the server nothing more."""

    host: str
    started_at: float
    """Epoch seconds."""
    duration_s: float
    load_average: float | None
    """The calibrating machine's at the end (shared CPUs skew the measurement)."""
    facts: ServerFacts
    untimed: EngineProfile
    """The server's settings as a profile, before any timing."""
    rounds: Rounds
    fit: Fit
    steady_load: SteadyLoadPoint | None
    steady_load_left_out: bool
    """Asked for, but the budget was too short for MIN_STEADY_REQUESTS requests."""


@dataclass
class Calibration:
    profile: EngineProfile
    measured: MeasuredFit


def measure_and_fit(
    url: str, settings: CalibrationSettings, progress: Callable[[str], None] = lambda line: None
) -> MeasuredFit:
    """Measure the server within `settings.budget_s` (plus its answers to a few /tokenize calls), fit
    its step timing to the bursts and the steady-load factor to the steady-load point."""
    url = url.rstrip("/")
    started = time.time()
    facts = read_facts(
        url,
        model_name=settings.model_name,
        model_config=settings.model_config,
        vllm_log=settings.vllm_log,
    )
    if settings.serve is not None:  # what the server's own config sets is no longer assumed
        set_keys = {k for k, v in settings.serve.model_dump().items() if v is not None}
        facts.assumed = {k: v for k, v in facts.assumed.items() if k not in set_keys}
    profile = serving_profile(facts, settings, settings.name or f"{facts.served_model}-calibrated")
    probes = probes_for(
        profile, facts.num_blocks, max_streams=settings.max_streams, output_tokens=settings.output_tokens
    )
    rounds, fit, plan, requests = _measure(url, facts, profile, probes, settings=settings, progress=progress)
    steady = None
    if plan is not None and requests:
        steady = fit_steady_load(
            profile.model_copy(update={"timing": fit.timing}), facts.num_blocks, requests, rate_qps=plan.rate_qps,
            duration_s=plan.duration_s, windows=plan.windows,
        )  # fmt: skip
    return MeasuredFit(
        host=public_url(url),
        started_at=started,
        duration_s=round(time.time() - started, 1),
        load_average=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        facts=facts,
        untimed=profile,
        rounds=rounds,
        fit=fit,
        steady_load=steady,
        steady_load_left_out=steady is None and settings.steady_load_s != 0,
    )


def _warnings(measured: MeasuredFit) -> list[str]:
    """The fit's own warnings, then what the steady-load point, the KV sizing and the rounds say."""
    warnings = list(measured.fit.warnings)
    steady = measured.steady_load
    if steady is not None and abs(steady.factor - 1) > FACTOR_NOTE:
        warnings.append(
            f"under steady arrivals ({steady.rate_qps:g} req/s) the server's steps took {steady.factor:.2f}× "
            "what the bursts fitted: the profile's steady_load_factor keeps that"
        )
    elif measured.steady_load_left_out:
        warnings.append(f"no steady-load point: too short a budget for {MIN_STEADY_REQUESTS} requests")
    planned, served = measured.untimed.plan().cache.num_blocks, measured.facts.num_blocks
    if planned != served:
        warnings.append(
            f"the profile's KV sizing gives {planned} blocks, the server has {served}: "
            "check --vllm-config / --model-config"
        )
    if measured.rounds.discarded:
        warnings.append(f"{measured.rounds.discarded} probes discarded: the server served other traffic meanwhile")
    return warnings


def calibrated_profile(measured: MeasuredFit) -> EngineProfile:
    """The profile a calibration writes: the server's settings, the fitted timing (with the steady-load
    factor) and the record of the fit, summed up in its `calibration` line; the fit is kept, poor or not."""
    fit, steady, rounds = measured.fit, measured.steady_load, measured.rounds
    timing = fit.timing if steady is None else fit.timing.model_copy(update={"steady_load_factor": steady.factor})
    record = CalibrationFit(
        host=measured.host,
        served_model=measured.facts.served_model,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(measured.started_at)),
        duration_s=measured.duration_s,
        rounds=rounds.rounds,
        load_average=measured.load_average,
        r2_itl=None if fit.r2_itl is None else round(fit.r2_itl, 4),
        r2_ttft=None if fit.r2_ttft is None else round(fit.r2_ttft, 4),
        max_abs_residual_pct=fit.max_abs_residual_pct,
        standard_errors=fit.standard_errors,
        poor=fit.poor,
        warnings=_warnings(measured),
        assumed=list(measured.facts.assumed.values()),
        points=fit.points,
        steady_load=steady,
    )
    quality = "POOR FIT" if fit.poor else "fit"
    r2 = ", ".join(f"R² {k} {v:.3f}" for k, v in (("ITL", fit.r2_itl), ("TTFT", fit.r2_ttft)) if v is not None)
    summary = (
        f"llmload sim calibrate against {record.host} on {record.measured_at[:10]}: {len(fit.points)} points, "
        f"{rounds.rounds} rounds in {record.duration_s:.0f} s; {quality}: {r2}, largest residual "
        f"{fit.max_abs_residual_pct:.0f}%"
    )
    return EngineProfile.model_validate(
        {
            **measured.untimed.model_dump(),
            "calibration": summary,
            "timing": timing.model_dump(),
            "fit": record.model_dump(),
        }
    )


def calibrate(
    url: str, settings: CalibrationSettings, progress: Callable[[str], None] = lambda line: None
) -> Calibration:
    """Measure and fit the server, and the profile that records it."""
    measured = measure_and_fit(url, settings, progress)
    return Calibration(calibrated_profile(measured), measured)
