"""The preflight as text: context fit by turn, concurrency and compute by stage, the verdict and what to change."""

from __future__ import annotations

from llmload.capacity.render import format_bytes
from llmload.preflight.memory import Preflight

_TURN_ROWS_SHOWN = 12


def render_preflight(fit: Preflight) -> str:
    context = fit.context
    out = [
        "",
        f"Preflight at {fit.target_qps:g} req/s target",
        "",
        f"Context fit (max_model_len {context.max_model_len:,}): {context.refused:.2%} of {context.requests:,} "
        f"requests refused (HTTP 400 context_length), {context.truncated:.2%} with output clamped",
        "| turn | requests | prompt p99 | refused | clamped |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in context.by_turn[:_TURN_ROWS_SHOWN]:
        cells = f"{row.requests:,} | {row.prompt_tokens_p99:,.0f} | {row.refused:.1%} | {row.truncated:.1%}"
        out.append(f"| {row.turn} | {cells} |")
    if len(context.by_turn) > _TURN_ROWS_SHOWN:
        out.append(f"| … | {len(context.by_turn) - _TURN_ROWS_SHOWN} more turns (see --json) | | | |")
    if context.recommended_max_model_len is not None:
        out.append(
            f"Recommended max_model_len {context.recommended_max_model_len:,} ("
            + (
                f"capped at the model's limit; P99 prompt + max_tokens is {context.wanted_beyond_limit:,}"
                if context.wanted_beyond_limit
                else "P99 prompt + max_tokens"
            )
            + "); "
            f"one full-length sequence needs {format_bytes(context.startup_kv_bytes_at_max_model_len)} of KV at "
            f"{context.max_model_len:,}, {format_bytes(context.startup_kv_bytes_at_recommended or 0)} at the "
            "recommendation."
        )
    seqs = f"{fit.max_num_seqs}" + (" (vLLM's default, assumed)" if fit.max_num_seqs_default else "")
    out += [
        "",
        f"Concurrency fit: a running request holds ~{fit.kv_tokens_per_request:,.0f} KV tokens; max_num_seqs {seqs}",
        "| stage | req/s | E2E s | in flight | running | KV tokens needed | KV pool | outcome |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for stage in fit.stages:
        out.append(
            f"| {stage.stage} | {stage.qps:g} | {stage.e2e_s:.2f} | {stage.in_flight:.1f} | {stage.running:.1f} | "
            f"{stage.kv_tokens_needed:,.0f} | {stage.kv_tokens:,} | {stage.outcome} |"
        )
    sources = sorted({stage.e2e_source for stage in fit.stages})
    out += [f"E2E {source}" for source in sources]
    compute = fit.compute
    out += [
        "",
        f"Compute fit: the server completes at most {compute.saturation_qps:.2f} req/s of this workload "
        f"({compute.saturation_source}); timing {compute.timing}",
        "| stage | req/s | prefill tok/s asked | decode tok/s asked | of saturation | TTFT mean s | TTFT p99 s "
        "| E2E mean s | outcome |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in compute.stages:
        ttft, p99, e2e = (f"{v:.2f}" if v is not None else "–" for v in (c.ttft_mean_s, c.ttft_p99_s, c.e2e_mean_s))
        outcome = "compute-bound: the queue grows without bound" if c.outcome == "compute-bound" else c.outcome
        out.append(
            f"| {c.stage} | {c.qps:g} | {c.prefill_tokens_per_s:,.0f} | {c.decode_tokens_per_s:,.0f} | "
            f"{c.utilization:.0%} | {ttft} | {p99} | {e2e} | {outcome} |"
        )
    out += ["", f"Preflight: {'PASS' if fit.passes else 'FAIL'} ({fit.margin})"]
    out += [f"  - {reason}" for reason in fit.reasons]
    if fit.advice:
        out += ["", "What to change", *(f"  - {a}" for a in fit.advice)]
    return "\n".join(out)
