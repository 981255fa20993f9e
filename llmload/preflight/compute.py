"""Can the server do the work each stage asks? The preflight's compute half, beside memory's.

The workload's requests (their prompt and output lengths, the history each turn carries, turns of
a session sharing their prefix as vLLM's prefix cache shares it) run through the simulator's engine
on a virtual clock (llmload.sim.engine.replay), timed by the server's profile: derived from its GPU
(llmload/perf) or calibrated. Two answers come out:

- the saturation rate: the requests/s the server completes of this workload when its queue never
  empties (the workload's requests sent all at once; completions counted between the 10th and the
  90th percentile of their finish times, so neither the start nor the tail is counted). Past it the
  waiting queue grows without bound: Little's law has no steady state there;
- each stage's predicted TTFT and E2E with queueing: Poisson arrivals at the stage's rate for its
  duration through the same engine.

A stage at or above `SATURATED` of the saturation rate is compute-bound; PASS needs the last stage
below it (the margin is stated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from llmload.sim.engine import Arrival, replay
from llmload.sim.profiles import EngineProfile

# A stage asking this share of the saturation rate or more is judged compute-bound: near saturation a
# queue is stable only on average, and its waits swing with every burst of long prompts (M/G/1's wait
# grows as 1 / (1 − ρ): ×10 at 90%).
SATURATED = 0.9
# Requests replayed per answer: enough for a steady state, few enough to answer in seconds.
BURST_REQUESTS = 2000
STAGE_REQUESTS = 3000
_VOCAB = 32000  # token ids drawn below this; only equality matters (prefix-cache block hashes)

ComputeOutcome = Literal["keeps up", "near saturation", "compute-bound"]


class StageCompute(BaseModel):
    """What one stage asks of the server's compute, and what it would get."""

    stage: str
    qps: float
    prefill_tokens_per_s: float = Field(
        description="prompt tokens/s the stage asks prefilled (prefix-cache hits aside)"
    )
    decode_tokens_per_s: float = Field(description="output tokens/s the stage asks, one per sequence per step")
    utilization: float = Field(description="qps / the saturation rate")
    outcome: ComputeOutcome
    ttft_mean_s: float | None = Field(description="predicted with queueing; None when compute-bound")
    ttft_p99_s: float | None
    e2e_mean_s: float | None


class ComputeFit(BaseModel):
    """The server's compute against the workload: its saturation rate and every stage's share of it."""

    timing: str = Field(description="where the step timing comes from (derived, calibrated, or a file)")
    saturation_qps: float
    saturation_source: str
    running_at_saturation: float = Field(description="requests the engine runs at once when saturated")
    stages: list[StageCompute]


def _prompt_ids(table: pd.DataFrame) -> list[list[int]]:
    """Token ids for each request's prompt: a session's turns share their prefix (turn k's prompt starts
    with turn k−1's), other sessions share nothing, as prefix caching sees a chat's history."""
    rng = np.random.default_rng(0)
    prompts: list[list[int]] = []
    streams: dict[object, np.ndarray] = {}
    for session, tokens in zip(table["session_id"], table["prompt_tokens"].to_numpy(dtype=float), strict=True):
        n = 0 if math.isnan(tokens) else int(tokens)
        stream = streams.get(session)
        if stream is None or stream.size < n:
            grown = rng.integers(1, _VOCAB, size=max(n, 1) * 2)
            if stream is not None:
                grown[: stream.size] = stream
            streams[session] = stream = grown
        prompts.append(stream[:n].tolist())
    return prompts


def _requests(table: pd.DataFrame, max_model_len: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output tokens) of the requests the server would serve, in the workload's order:
    refused ones (prompt beyond max_model_len) left out, outputs clamped to fit as vLLM clamps them.
    A workload of more than BURST_REQUESTS requests is thinned to whole sessions spread evenly over it
    (every k-th session), so the mix is the whole workload's, not its first hour's."""
    sessions = table["session_id"].to_numpy()
    unique = pd.unique(sessions)
    if len(table) > BURST_REQUESTS and len(unique) > 1:
        step = math.ceil(len(table) / BURST_REQUESTS)
        table = table[np.isin(sessions, unique[::step])]
    output = table["output_tokens"].to_numpy(dtype=float)
    limit = table["max_tokens"].to_numpy(dtype=float)
    known = np.where(np.isnan(output), limit, output)
    known = np.where(np.isnan(known), np.nanmedian(known) if not np.isnan(known).all() else 1.0, known)
    served = []
    for ids, out in zip(_prompt_ids(table), known, strict=True):
        if len(ids) + 1 > max_model_len or not ids:
            continue
        served.append((ids, max(1, min(int(out), max_model_len - len(ids)))))
    return served


def _cycle(requests: Sequence[tuple[list[int], int]], count: int) -> list[tuple[list[int], int]]:
    """`count` requests, the workload's again from the start when it runs out, each pass's prompts given a
    first token of their own (a pass shares no prefix with another, as a replay's new sessions share none)."""
    chosen = []
    for i in range(count):
        ids, out = requests[i % len(requests)]
        again = i // len(requests)
        chosen.append(([_VOCAB + again, *ids[1:]] if again else ids, out))
    return chosen


def saturation(
    profile: EngineProfile, num_blocks: int, requests: Sequence[tuple[list[int], int]]
) -> tuple[float, float]:
    """(requests/s, requests running) the engine sustains on these requests with its queue never empty."""
    burst = _cycle(requests, BURST_REQUESTS)
    run = replay(profile, num_blocks, [Arrival(0.0, ids, out) for ids, out in burst])
    finished = np.sort([times[-1] for times in run.token_times])
    low, high = int(0.1 * len(finished)), int(0.9 * len(finished))
    span = finished[high] - finished[low]
    rate = (high - low) / span if span > 0 else len(finished) / finished[-1]
    return float(rate), run.mean_running


def stage_replay(
    profile: EngineProfile, num_blocks: int, requests: Sequence[tuple[list[int], int]], qps: float, duration_s: float
) -> tuple[float, float, float]:
    """(mean TTFT, p99 TTFT, mean E2E), seconds, of Poisson arrivals at `qps` for `duration_s` (at most
    STAGE_REQUESTS of them)."""
    count = max(1, min(STAGE_REQUESTS, round(qps * duration_s)))
    gaps = np.random.default_rng(1).exponential(1 / qps, size=count)
    at = np.cumsum(gaps) - gaps[0]
    chosen = _cycle(requests, count)
    run = replay(profile, num_blocks, [Arrival(float(t), ids, out) for t, (ids, out) in zip(at, chosen, strict=True)])
    ttft = np.array([times[0] - sent for sent, times in zip(run.sent_s, run.token_times, strict=True)])
    e2e = np.array([times[-1] - sent for sent, times in zip(run.sent_s, run.token_times, strict=True)])
    return float(ttft.mean()), float(np.percentile(ttft, 99)), float(e2e.mean())


def compute_fit(
    table: pd.DataFrame,
    profile: EngineProfile,
    num_blocks: int,
    stages: Sequence[tuple[str, float, float]],
    measured_saturation: tuple[float, str] | None = None,
) -> ComputeFit:
    """Each (name, req/s, seconds) stage against the server `profile` times with its KV pool of `num_blocks`.
    `measured_saturation` (req/s, where): a run's own completion rate, used instead of the prediction."""
    requests = _requests(table, profile.max_model_len)
    if not requests:
        raise ValueError("no request of the workload fits max_model_len: nothing to time")
    predicted, running = saturation(profile, num_blocks, requests)
    rate, source = measured_saturation or (
        predicted,
        f"predicted: {BURST_REQUESTS} of the workload's requests sent at once through the engine on a virtual clock",
    )
    prompt_mean = float(np.mean([len(ids) for ids, _ in requests]))
    output_mean = float(np.mean([out for _, out in requests]))
    fits = []
    for name, qps, duration in stages:
        share = qps / rate
        outcome: ComputeOutcome = (
            "compute-bound" if share >= 1 else "near saturation" if share >= SATURATED else "keeps up"
        )
        ttft_mean = ttft_p99 = e2e_mean = None
        if outcome != "compute-bound":
            ttft_mean, ttft_p99, e2e_mean = stage_replay(profile, num_blocks, requests, qps, duration)
        fits.append(
            StageCompute(
                stage=name,
                qps=qps,
                prefill_tokens_per_s=qps * prompt_mean,
                decode_tokens_per_s=qps * output_mean,
                utilization=share,
                outcome=outcome,
                ttft_mean_s=ttft_mean,
                ttft_p99_s=ttft_p99,
                e2e_mean_s=e2e_mean,
            )
        )
    return ComputeFit(
        timing=profile.calibration,
        saturation_qps=rate,
        saturation_source=source,
        running_at_saturation=running,
        stages=fits,
    )
