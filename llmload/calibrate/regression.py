"""Fit a StepTiming to measured latencies: which step costs make the simulator's own engine
reproduce them.

Each measured point is replayed through the engine without time (`llmload.sim.engine.dry_run`):
the same scheduler, chunked prefill, batch and KV cache give the steps that ran and the step at
which each request got each token. A step takes base + per_seq·seqs + per_kv·KV tokens +
prefill tokens / rate + prefill attention pairs × their cost, so every mean TTFT or ITL is a
linear combination of the six timing values (frontend, base, per sequence, per KV token, per
prefill token, per prefill attention pair), with coefficients counted from the replay. One
weighted least-squares fit (relative errors: a 3 ms ITL counts as much as a 300 ms TTFT) over all
points gives the timing; values that would fit below zero are held at zero (every subset of them
is tried, numpy's lstsq on each) and said so. R² per kind of point, each point's residual and ±1
standard error per value make a poor fit visible.

The bursts cannot show what a steady stream of arrivals does to a server whose steps cost more
when requests come and go at random times than in bursts of the same size. The steady-load point's
requests are replayed through the engine on a virtual clock (`llmload.sim.engine.replay`): the
factor on every step's cost that makes the replay's mean E2E the measured one is found by
bisection (a longer step only ever delays a token), and the profile keeps it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from llmload.calibrate.measure import SteadyRequest
from llmload.sim.engine import Arrival, Replay, dry_run, replay
from llmload.sim.profiles import CalibrationPoint, EngineProfile, ProbeKind, SteadyLoadPoint, StepTiming

# the fitted values, as the step model uses them (prefill as µs per token: linear)
PARAMETERS = (
    "frontend_ms",
    "decode_base_ms",
    "decode_per_seq_ms",
    "decode_per_kv_token_us",
    "prefill_us_per_token",
    "prefill_attention_ns",
)
POOR_R2 = 0.8
POOR_RESIDUAL_PCT = 20.0
NOISY_SPREAD_PCT = 25.0  # interquartile range / median: the middle half of the repeats a quarter apart
FACTOR_RANGE = (0.25, 8.0)  # the steady-load factor is searched within
FACTOR_STEPS = 24  # bisections: the range to 1e-6 of itself


@dataclass(frozen=True)
class Observation:
    """A measured point: the probe and the server's mean TTFT (prefill) or ITL (decode) per repeat."""

    kind: ProbeKind
    streams: int
    prompt_tokens: int
    output_tokens: int
    values_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(np.median(self.values_ms))

    @property
    def spread_pct(self) -> float:
        """Interquartile range over the median: unlike max − min, it does not grow with the repeats."""
        p25, p75 = np.percentile(self.values_ms, [25, 75])
        return float(100 * (p75 - p25) / self.median_ms)


def design_row(profile: EngineProfile, num_blocks: int, obs: Observation) -> NDArray[np.float64]:
    """The point's mean latency in ms as coefficients of PARAMETERS, counted from a dry run."""
    run = dry_run(profile, num_blocks, [(obs.prompt_tokens, obs.output_tokens)] * obs.streams)
    loads = np.array(
        [[1.0, s.seqs, s.kv_tokens / 1e3, s.prefill_tokens / 1e3, s.prefill_pairs / 1e6] for s in run.steps]
    )
    # before[k]: the loads of the steps before step k, summed
    before = np.vstack([np.zeros(loads.shape[1]), np.cumsum(loads, axis=0)])
    if obs.kind == "prefill":  # TTFT: the frontend, then every step up to the first token's
        ttft = np.mean([before[steps[0] + 1] for steps in run.token_steps], axis=0)
        return np.concatenate([[1.0], ttft])
    gaps = sum(len(steps) - 1 for steps in run.token_steps)
    spans = sum(before[steps[-1] + 1] - before[steps[0] + 1] for steps in run.token_steps)
    return np.concatenate([[0.0], spans / gaps])


@dataclass
class Fit:
    timing: StepTiming
    points: list[CalibrationPoint]
    r2_itl: float | None
    r2_ttft: float | None
    standard_errors: dict[str, float]
    warnings: list[str]

    @property
    def max_abs_residual_pct(self) -> float:
        return max(abs(p.residual_pct) for p in self.points)

    @property
    def poor(self) -> bool:
        low_r2 = any(r2 is not None and r2 < POOR_R2 for r2 in (self.r2_itl, self.r2_ttft))
        return low_r2 or self.max_abs_residual_pct > POOR_RESIDUAL_PCT


def _r2(measured: NDArray[np.float64], fitted: NDArray[np.float64]) -> float | None:
    if len(measured) < 3:
        return None
    total = float(np.sum((measured - measured.mean()) ** 2))
    return 1 - float(np.sum((measured - fitted) ** 2)) / total if total > 0 else None


def nonnegative_lstsq(
    x: NDArray[np.float64], y: NDArray[np.float64], keep: int
) -> tuple[NDArray[np.float64], list[int]]:
    """Least squares with every coefficient ≥ 0: the best of the unconstrained fits on each subset of
    columns (the others held at 0) whose coefficients are all ≥ 0; column `keep` is always in.
    Returns the coefficients and the columns fitted."""
    best: tuple[float, NDArray[np.float64], list[int]] | None = None
    others = [c for c in range(x.shape[1]) if c != keep]
    for size in range(len(others), -1, -1):
        for subset in itertools.combinations(others, size):
            columns = sorted([keep, *subset])
            solution = np.linalg.lstsq(x[:, columns], y, rcond=None)[0]
            if np.any(solution < 0):
                continue
            sse = float(np.sum((x[:, columns] @ solution - y) ** 2))
            if best is None or sse < best[0]:
                coefficients = np.zeros(x.shape[1])
                coefficients[columns] = solution
                best = (sse, coefficients, columns)
    if best is None:  # even the kept column alone fits below zero
        coefficients = np.zeros(x.shape[1])
        coefficients[keep] = max(float(np.linalg.lstsq(x[:, [keep]], y, rcond=None)[0][0]), 1e-9)
        return coefficients, [keep]
    return best[1], best[2]


def fit_timing(profile: EngineProfile, num_blocks: int, observations: Sequence[Observation]) -> Fit:
    """The StepTiming that best reproduces the observations through `profile`'s scheduler and KV pool."""
    x = np.array([design_row(profile, num_blocks, obs) for obs in observations])
    y = np.array([obs.median_ms for obs in observations])
    weight = 1 / y
    keep = PARAMETERS.index("prefill_us_per_token")
    theta, fitted_columns = nonnegative_lstsq(x * weight[:, None], y * weight, keep)
    fitted = x @ theta
    warnings = [f"{PARAMETERS[c]} fitted below 0: held at 0" for c in range(len(PARAMETERS)) if c not in fitted_columns]
    residual = (fitted - y) * weight
    dof = len(y) - len(fitted_columns)
    errors = dict.fromkeys(PARAMETERS, 0.0)
    if dof > 0:
        weighted = x[:, fitted_columns] * weight[:, None]
        covariance = float(residual @ residual) / dof * np.linalg.pinv(weighted.T @ weighted)
        for i, c in enumerate(fitted_columns):
            errors[PARAMETERS[c]] = math.sqrt(max(0.0, covariance[i, i]))
    prefill_us = theta[keep]
    timing = StepTiming(
        frontend_ms=round(float(theta[0]), 4),
        decode_base_ms=round(float(theta[1]), 4),
        decode_per_seq_ms=round(float(theta[2]), 5),
        decode_per_kv_token_us=round(float(theta[3]), 5),
        prefill_tokens_per_s=round(1e6 / prefill_us),
        prefill_attention_ns=round(float(theta[5]), 3),
    )
    errors["prefill_tokens_per_s"] = 1e6 * errors.pop("prefill_us_per_token") / prefill_us**2  # delta method
    points = [
        CalibrationPoint(
            kind=obs.kind,
            streams=obs.streams,
            prompt_tokens=obs.prompt_tokens,
            output_tokens=obs.output_tokens,
            repeats=len(obs.values_ms),
            measured_ms=round(obs.median_ms, 3),
            spread_pct=round(obs.spread_pct, 1),
            fitted_ms=round(float(f), 3),
            residual_pct=round(float(100 * r), 1),
        )
        for obs, f, r in zip(observations, fitted, residual, strict=True)
    ]
    kinds = np.array([obs.kind for obs in observations])
    noisy = [p for p in points if p.spread_pct > NOISY_SPREAD_PCT]
    if noisy:
        warnings.append(
            f"{len(noisy)} of {len(points)} points spread over more than {NOISY_SPREAD_PCT:g}% between repeats: "
            "a busy machine or server (calibrate when nothing else runs)"
        )
    return Fit(
        timing=timing,
        points=points,
        r2_itl=_r2(y[kinds == "decode"], fitted[kinds == "decode"]),
        r2_ttft=_r2(y[kinds == "prefill"], fitted[kinds == "prefill"]),
        standard_errors={k: float(f"{v:.3g}") for k, v in errors.items()},
        warnings=warnings,
    )


def _arrivals(requests: Sequence[SteadyRequest]) -> list[Arrival]:
    """Token ids a replay can share blocks by: one run of ids per system prompt, then the request's own."""
    arrivals = []
    for i, request in enumerate(requests):
        shared = min(request.shared_tokens, request.prompt_tokens - 1)
        ids = [(request.system + 1) * 1_000_000 + j for j in range(shared)]
        ids += [-(i + 1) * 1_000_000 - j for j in range(request.prompt_tokens - shared)]
        arrivals.append(Arrival(request.sent_s, ids, len(request.token_times_s)))
    return arrivals


def _means_ms(arrivals: Sequence[Arrival], token_times: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """Mean E2E, TTFT and ITL (over all gaps) in ms."""
    e2e = [times[-1] - a.at_s for a, times in zip(arrivals, token_times, strict=True)]
    ttft = [times[0] - a.at_s for a, times in zip(arrivals, token_times, strict=True)]
    gaps = [b - a for times in token_times for a, b in itertools.pairwise(times)]
    return 1000 * float(np.mean(e2e)), 1000 * float(np.mean(ttft)), 1000 * float(np.mean(gaps)) if gaps else math.nan


def fit_steady_load(
    profile: EngineProfile,
    num_blocks: int,
    requests: Sequence[SteadyRequest],
    *,
    rate_qps: float,
    duration_s: float,
    windows: int = 1,
) -> SteadyLoadPoint:
    """The factor on the profile's step costs that makes its replay of `requests` take the mean E2E
    they took on the server."""
    arrivals = _arrivals(requests)
    measured_e2e, measured_ttft, measured_itl = _means_ms(arrivals, [r.token_times_s for r in requests])

    def run(factor: float) -> Replay:
        fitted = profile.step_timing
        assert isinstance(fitted, StepTiming), "a calibration fits a linear step timing"
        timing = fitted.model_copy(update={"steady_load_factor": factor})
        return replay(profile.model_copy(update={"timing": timing}), num_blocks, arrivals)

    burst_e2e = _means_ms(arrivals, run(1.0).token_times)[0]
    low, high = FACTOR_RANGE
    for _ in range(FACTOR_STEPS):
        middle = math.sqrt(low * high)
        if _means_ms(arrivals, run(middle).token_times)[0] < measured_e2e:
            low = middle
        else:
            high = middle
    factor = math.sqrt(low * high)
    _, fitted_ttft, fitted_itl = _means_ms(arrivals, run(factor).token_times)
    return SteadyLoadPoint(
        rate_qps=rate_qps,
        duration_s=duration_s,
        windows=windows,
        requests=len(requests),
        prompt_tokens=round(float(np.mean([r.prompt_tokens for r in requests]))),
        output_tokens=len(requests[0].token_times_s),
        measured_e2e_ms=round(measured_e2e, 2),
        measured_ttft_ms=round(measured_ttft, 2),
        measured_itl_ms=round(measured_itl, 3),
        burst_fit_e2e_ms=round(burst_e2e, 2),
        factor=round(factor, 3),
        fitted_ttft_ms=round(fitted_ttft, 2),
        fitted_itl_ms=round(fitted_itl, 3),
    )
