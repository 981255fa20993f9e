"""Does a workload fit a server's configuration at every stage, 150% included? Answered before any
GPU time is spent, from the workload's request lengths, the KV pool capacity computes for the
configuration, the server's compute (llmload/preflight/compute.py: its saturation rate and each
stage's predicted E2E) and Little's law (requests in flight = rate × E2E time).

- Context: vLLM 0.32 refuses a request whose prompt leaves no room for one output token, or
  whose max_tokens alone exceeds max_model_len (HTTP 400, `context_length`), and clamps the
  output of one whose prompt + max_tokens exceeds it (finish_reason `length`): counted per turn,
  with the history each turn carries as the replay sends it.
- Concurrency: at each stage, rate × E2E requests are in flight. At most max_num_seqs of them
  run; each running one holds the KV blocks of its prompt and the output generated so far. When
  their blocks exceed the pool, vLLM preempts; when they exceed max_num_seqs, requests queue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from llmload.capacity.plan import MAX_NUM_SEQS_DEFAULT, CapacityReport
from llmload.capacity.render import format_bytes
from llmload.errors import InputError
from llmload.preflight.compute import SATURATED, ComputeFit, StageCompute
from llmload.rundir import require_summary

# The soak verdict's error budget: more context_length failures than this fail the preflight too.
DEFAULT_MAX_ERROR_RATE = 0.01
# A shorter max_model_len is worth suggesting from this much more full-length concurrency.
MEANINGFUL_GAIN = 1.1

StageOutcome = Literal["fits", "queueing", "preemptions", "preemptions and queueing"]


class TurnFit(BaseModel):
    turn: int = Field(description="1 = first turn")
    requests: int
    prompt_tokens_p99: float
    refused: float = Field(description="share refused with HTTP 400 (context_length)")
    truncated: float = Field(description="share whose output vLLM clamps to fit max_model_len")


class ContextFit(BaseModel):
    max_model_len: int
    requests: int
    refused: float = Field(description="share of all requests refused with HTTP 400 (context_length)")
    truncated: float
    by_turn: list[TurnFit]
    recommended_max_model_len: int | None = Field(
        description="P99 prompt + max_tokens, a multiple of 16, capped at the model's limit"
    )
    wanted_beyond_limit: int | None = Field(
        default=None, description="P99 prompt + max_tokens where it exceeds the model's limit (then refused)"
    )
    concurrency_at_max_model_len: float = Field(description="full-length requests the KV pool holds (vLLM's log)")
    concurrency_at_recommended: float | None
    startup_kv_bytes_at_max_model_len: int = Field(description="KV one full-length sequence needs at startup, per GPU")
    startup_kv_bytes_at_recommended: int | None


class TimingBasis(BaseModel):
    e2e_s: float
    source: str = Field(description="measured in which run and stage, or the assumption")


class StageFit(BaseModel):
    stage: str
    qps: float
    e2e_s: float
    e2e_source: str
    in_flight: float = Field(description="rate × E2E (Little's law)")
    running: float = Field(description="in flight, capped by max_num_seqs")
    kv_tokens_needed: float = Field(description="the running requests' KV, in whole blocks")
    kv_tokens: int = Field(description="the KV pool")
    max_num_seqs: int
    outcome: StageOutcome


class Preflight(BaseModel):
    target_qps: float
    kv_tokens_per_request: float = Field(description="time-weighted KV of one running request, whole blocks")
    max_num_seqs: int
    max_num_seqs_default: bool = Field(description="the config does not set it: vLLM's default is assumed")
    starts: bool
    startup_error: str | None
    context: ContextFit
    stages: list[StageFit]
    compute: ComputeFit
    margin: str = Field(description="how far the last stage is from the server's limits, in words")
    passes: bool = Field(
        description="vLLM starts, the last stage fits in memory and in compute, and refusals stay within the "
        "error budget"
    )
    reasons: list[str] = Field(description="why it does not pass")
    advice: list[str]


def _lengths(table: pd.DataFrame, max_model_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Prompt, requested output limit and served output per request, and whether vLLM refuses it."""
    prompt = table["prompt_tokens"].to_numpy(dtype=float)
    limit = table["max_tokens"].to_numpy(dtype=float)
    output = table["output_tokens"].to_numpy(dtype=float)
    known = np.where(np.isnan(output), limit, output)
    if np.isnan(known).all():
        raise InputError("the workload gives no output lengths (output_tokens or max_tokens): cannot size its KV")
    known = np.where(np.isnan(known), np.nanmedian(known), known)
    asked = np.where(np.isnan(limit), known, limit)
    refused = (prompt + 1 > max_model_len) | (~np.isnan(limit) & (limit > max_model_len))
    served = np.minimum(known, np.maximum(max_model_len - prompt, 0))
    truncated = ~refused & (prompt + asked > max_model_len)
    return prompt, served, refused, truncated


def context_fit(
    table: pd.DataFrame, plan: CapacityReport, recommended: CapacityReport | None, wanted: int | None = None
) -> ContextFit:
    length = plan.max_model_len
    prompt, _, refused, truncated = _lengths(table, length)
    turns = table["turn"].to_numpy()
    by_turn = [
        TurnFit(
            turn=int(turn) + 1,
            requests=int(rows.sum()),
            prompt_tokens_p99=float(np.percentile(prompt[rows], 99)),
            refused=float(refused[rows].mean()),
            truncated=float(truncated[rows].mean()),
        )
        for turn in np.unique(turns)
        for rows in [turns == turn]
    ]
    return ContextFit(
        max_model_len=length,
        requests=int(prompt.size),
        refused=float(refused.mean()),
        truncated=float(truncated.mean()),
        by_turn=by_turn,
        recommended_max_model_len=recommended.max_model_len if recommended else None,
        wanted_beyond_limit=wanted,
        concurrency_at_max_model_len=plan.at_max_model_len.max_concurrency,
        concurrency_at_recommended=recommended.at_max_model_len.max_concurrency if recommended else None,
        startup_kv_bytes_at_max_model_len=plan.at_max_model_len.kv_bytes_per_gpu,
        startup_kv_bytes_at_recommended=recommended.at_max_model_len.kv_bytes_per_gpu if recommended else None,
    )


def kv_tokens_per_request(table: pd.DataFrame, max_model_len: int, block_size: int) -> float:
    """KV a running request holds on average over its life, in whole blocks: its prompt, then one
    token more per decode step (prompt + output / 2 on average), weighted by how long it runs
    (its output length: decode steps dominate E2E). Refused requests hold none."""
    prompt, served, refused, _ = _lengths(table, max_model_len)
    held = np.ceil((prompt + served / 2) / block_size) * block_size
    weight = np.where(refused, 0.0, served + 1)
    if weight.sum() == 0:
        return 0.0
    return float(np.average(held, weights=weight))


def predicted_timing(stage: StageCompute, compute: ComputeFit) -> TimingBasis:
    """A stage's E2E as the compute half predicts it; for a compute-bound stage, the E2E the running
    requests have at saturation (the waiting ones come on top, without bound)."""
    if stage.e2e_mean_s is not None:
        return TimingBasis(e2e_s=stage.e2e_mean_s, source=f"predicted with queueing ({compute.timing})")
    return TimingBasis(
        e2e_s=compute.running_at_saturation / compute.saturation_qps,
        source="at saturation: the running requests' E2E; the queue grows without bound",
    )


def stage_fit(
    name: str, qps: float, timing: TimingBasis, *, per_request: float, kv_tokens: int, max_num_seqs: int
) -> StageFit:
    in_flight = qps * timing.e2e_s
    running = min(in_flight, max_num_seqs)
    needed = running * per_request
    preempts, queues = needed > kv_tokens, in_flight > max_num_seqs
    outcome: StageOutcome = (
        "preemptions and queueing"
        if preempts and queues
        else "preemptions"
        if preempts
        else "queueing"
        if queues
        else "fits"
    )
    return StageFit(
        stage=name,
        qps=qps,
        e2e_s=timing.e2e_s,
        e2e_source=timing.source,
        in_flight=in_flight,
        running=running,
        kv_tokens_needed=needed,
        kv_tokens=kv_tokens,
        max_num_seqs=max_num_seqs,
        outcome=outcome,
    )


def _advice(fit: Preflight, plan: CapacityReport) -> list[str]:
    advice: list[str] = []
    context = fit.context
    rec = context.recommended_max_model_len
    ratio = (context.concurrency_at_recommended or 0) / max(context.concurrency_at_max_model_len, 1e-9)
    if rec is not None and rec < context.max_model_len and ratio >= MEANINGFUL_GAIN:
        advice.append(
            f"max_model_len {rec:,} (P99 prompt + max_tokens) would let {ratio:.1f}× more full-length requests "
            f"run ({context.concurrency_at_recommended:.2f}x instead of {context.concurrency_at_max_model_len:.2f}x) "
            f"and needs {format_bytes(context.startup_kv_bytes_at_recommended or 0)} of KV at startup instead of "
            f"{format_bytes(context.startup_kv_bytes_at_max_model_len)}."
        )
    if rec is not None and context.refused > 0 and rec > context.max_model_len:
        advice.append(f"max_model_len {rec:,} would serve the P99 request instead of refusing it.")
    if context.wanted_beyond_limit is not None and plan.max_model_len_limit is not None:
        advice.append(
            f"The P99 request needs {context.wanted_beyond_limit:,} tokens, past the model's limit of "
            f"{plan.max_model_len_limit:,} ({plan.max_model_len_limit_key}): the recommendation is capped there, and "
            "longer requests are refused (context_length) whatever the configuration; shorten them, or serve a "
            "model with a longer context."
        )
    last = fit.stages[-1]
    if "preemptions" in last.outcome and fit.kv_tokens_per_request:
        holds = last.kv_tokens / fit.kv_tokens_per_request
        advice.append(
            f"The KV pool holds about {holds:.0f} running requests of this workload; {last.running:.0f} run at "
            f"{last.stage}. Give KV more memory (--kv-cache-dtype fp8 halves bytes per token, more tensor "
            "parallelism splits it), or expect preemptions and longer TTFT."
        )
    compute = fit.compute.stages[-1] if fit.compute.stages else None
    if compute is not None and compute.outcome != "keeps up":
        replicas = math.ceil(compute.qps / (SATURATED * fit.compute.saturation_qps))
        advice.append(
            f"The server completes at most {fit.compute.saturation_qps:.2f} req/s of this workload and stage "
            f"{compute.stage} asks {compute.qps:g}: {replicas} replicas of it carry that below {SATURATED:.0%} "
            "each, or a faster GPU does (`llmload predict --vllm-config FILE --gpu NAME` compares them)."
        )
    elif "queueing" in last.outcome:
        advice.append(
            f"{last.in_flight:.0f} requests in flight at {last.stage} but max_num_seqs {last.max_num_seqs}: "
            "the rest wait; raise --max-num-seqs if the KV pool holds them."
        )
    if plan.startup_error:
        advice.extend(plan.advice)
    return advice


def preflight(
    table: pd.DataFrame,
    plan: CapacityReport,
    recommended: CapacityReport | None,
    stages: Sequence[tuple[str, float, TimingBasis]],
    compute: ComputeFit,
    *,
    wanted_beyond_limit: int | None = None,
    max_num_seqs: int | None,
    target_qps: float,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
) -> Preflight:
    """The whole answer: context fit, each stage's concurrency and compute fit, and whether the last stage
    passes (memory and compute both)."""
    seqs = max_num_seqs or MAX_NUM_SEQS_DEFAULT
    per_request = kv_tokens_per_request(table, plan.max_model_len, plan.layout.block_size)
    context = context_fit(table, plan, recommended, wanted_beyond_limit)
    fits = [
        stage_fit(name, qps, timing, per_request=per_request, kv_tokens=plan.cache.tokens, max_num_seqs=seqs)
        for name, qps, timing in stages
    ]
    reasons = []
    if not plan.starts:
        reasons.append("vLLM would refuse to start: " + (plan.startup_error or "KV cache too small"))
    if fits and fits[-1].outcome != "fits":
        last = fits[-1]
        reasons.append(
            f"stage {last.stage} ({last.qps:g} req/s): {last.in_flight:.1f} requests in flight, "
            f"{last.kv_tokens_needed:,.0f} KV tokens needed of {last.kv_tokens:,}, max_num_seqs {seqs}: "
            f"{last.outcome} expected"
        )
    last_compute = compute.stages[-1] if compute.stages else None
    if last_compute is not None and last_compute.outcome != "keeps up":
        why = (
            "the queue grows without bound"
            if last_compute.outcome == "compute-bound"
            else f"at {last_compute.utilization:.0%} of saturation a queue's waits swing without a steady level"
        )
        reasons.append(
            f"stage {last_compute.stage} ({last_compute.qps:g} req/s): {last_compute.outcome}: {why}; the server "
            f"completes at most {compute.saturation_qps:.2f} req/s of this workload ({compute.saturation_source})"
        )
    if context.refused > max_error_rate:
        reasons.append(
            f"{context.refused:.1%} of requests exceed max_model_len {plan.max_model_len:,} and would be refused "
            f"(context_length), over the {max_error_rate:.0%} error budget"
        )
    result = Preflight(
        target_qps=target_qps,
        kv_tokens_per_request=per_request,
        max_num_seqs=seqs,
        max_num_seqs_default=max_num_seqs is None,
        starts=plan.starts,
        startup_error=plan.startup_error,
        context=context,
        stages=fits,
        compute=compute,
        margin=_margin(fits[-1] if fits else None, last_compute, compute),
        passes=not reasons,
        reasons=reasons,
        advice=[],
    )
    result.advice = _advice(result, plan)
    return result


def _margin(memory: StageFit | None, stage: StageCompute | None, compute: ComputeFit) -> str:
    if memory is None or stage is None:
        return "no stage"
    kv = memory.kv_tokens_needed / memory.kv_tokens if memory.kv_tokens else math.inf
    return (
        f"stage {stage.stage} asks {stage.qps:g} req/s, {stage.utilization:.0%} of the "
        f"{compute.saturation_qps:.2f} req/s the server completes at most (judged below {SATURATED:.0%}); "
        f"its running requests need {kv:.0%} of the KV pool and "
        f"{memory.running / memory.max_num_seqs:.0%} of max_num_seqs"
    )


def measured_saturation(run_dir: Path) -> tuple[float, str] | None:
    """The throughput a run measured where a judged stage fell behind (over 5% of its requests unfinished
    when the run ended: the server completed what it could, `ok` / the stage's seconds), else None (the run
    never reached the server's limit)."""
    summary = require_summary(run_dir)
    behind = [s for s in summary.stages if s.scheduled and s.unfinished > 0.05 * s.scheduled and s.duration_s > 0]
    if not behind:
        return None
    stage = max(behind, key=lambda s: s.ok / s.duration_s)
    rate = stage.ok / stage.duration_s
    return rate, (
        f"measured: {run_dir.name}, stage {stage.name} completed {rate:.2f} of {stage.target_qps:g} req/s "
        f"({stage.unfinished:,} of {stage.scheduled:,} unfinished)"
    )


def measured_timing(run_dir: Path) -> tuple[dict[str, TimingBasis], TimingBasis]:
    """Mean E2E of a run's successful requests, per stage and over its judged stages (Little's law
    takes the mean). E2E grows with load: a run at a lower rate than a stage underestimates it."""
    summary = require_summary(run_dir)
    overall = summary.latency_ms.e2e.mean
    if overall is None:
        raise InputError(f"{run_dir}: no successful request in its judged stages to measure E2E from")
    by_stage = {
        s.name: TimingBasis(e2e_s=s.e2e_mean_ms / 1000, source=f"measured: {run_dir.name}, stage {s.name}")
        for s in summary.stages
        if s.e2e_mean_ms is not None
    }
    return by_stage, TimingBasis(e2e_s=overall / 1000, source=f"measured: {run_dir.name}, all judged stages")
