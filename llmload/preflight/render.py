"""The preflight as text: context fit by turn, concurrency by stage, the verdict and what to change."""

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
            f"Recommended max_model_len {context.recommended_max_model_len:,} (P99 prompt + max_tokens); "
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
    out += ["", f"Preflight: {'PASS' if fit.passes else 'FAIL'}"]
    out += [f"  - {reason}" for reason in fit.reasons]
    if fit.advice:
        out += ["", "What to change", *(f"  - {a}" for a in fit.advice)]
    return "\n".join(out)
