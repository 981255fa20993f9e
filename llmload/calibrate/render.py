"""A calibration as the terminal shows it: the server's settings and where each came from, every
point measured against fitted, the timing with its standard errors, and the verdict on the fit."""

from __future__ import annotations

from llmload.sim.profiles import EngineProfile

TIMING_UNITS = {
    "frontend_ms": "ms",
    "prefill_tokens_per_s": "tok/s",
    "decode_base_ms": "ms",
    "decode_per_seq_ms": "ms",
    "decode_per_kv_token_us": "µs",
    "prefill_attention_ns": "ns",
}


def render_fit(profile: EngineProfile, sources: dict[str, str] | None = None) -> str:
    """The calibrated profile's fit, as Markdown tables and lines (the YAML holds the same figures)."""
    fit = profile.fit
    if fit is None:
        return f"{profile.name}: not calibrated ({profile.calibration})"
    lines = [profile.calibration, ""]
    if sources:
        settings = profile.model_dump(include=set(sources))
        lines.append("server: " + "; ".join(f"{k} {settings[k]} ({sources[k]})" for k in sources if k in settings))
    lines += [
        "",
        "| point | streams | prompt tokens | output tokens | repeats | measured ms | spread | fitted ms | residual |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in fit.points:
        what = "TTFT (prefill)" if p.kind == "prefill" else "ITL (decode)"
        lines.append(
            f"| {what} | {p.streams} | {p.prompt_tokens:,} | {p.output_tokens} | {p.repeats} | {p.measured_ms:,.2f} "
            f"| {p.spread_pct:.0f}% | {p.fitted_ms:,.2f} | {p.residual_pct:+.1f}% |"
        )
    timing = profile.step_timing.model_dump()
    lines += [
        "",
        "timing: "
        + ", ".join(
            f"{k} {timing[k]:,.4g} ± {fit.standard_errors.get(k, 0):,.2g} {unit}" for k, unit in TIMING_UNITS.items()
        ),
    ]
    steady = fit.steady_load
    if steady is not None:
        lines.append(
            f"steady load: {steady.requests} chats at {steady.rate_qps:g} req/s for {steady.duration_s:g} s "
            f"in {steady.windows} window{'s' if steady.windows > 1 else ''} between burst rounds "
            f"({steady.prompt_tokens:,}-token prompts sharing system prompts, {steady.output_tokens} out): mean E2E "
            f"{steady.measured_e2e_ms:,.0f} ms, the burst fit replays {steady.burst_fit_e2e_ms:,.0f} ms: "
            f"steady_load_factor {steady.factor:.3g}; with it TTFT {steady.fitted_ttft_ms:,.1f} ms "
            f"(measured {steady.measured_ttft_ms:,.1f}), ITL {steady.fitted_itl_ms:.2f} ms (measured "
            f"{steady.measured_itl_ms:.2f})"
        )
    r2 = ", ".join(f"{k} {v:.3f}" for k, v in (("ITL", fit.r2_itl), ("TTFT", fit.r2_ttft)) if v is not None)
    verdict = "POOR FIT: do not trust predictions from this profile" if fit.poor else "good fit"
    lines.append(f"{verdict}: R² {r2 or 'n/a'}; largest residual {fit.max_abs_residual_pct:.1f}%")
    lines += [f"warning: {w}" for w in fit.warnings] + [f"assumed: {a}" for a in fit.assumed]
    if fit.load_average is not None:
        lines.append(f"machine load average (1 min) at the end: {fit.load_average:.2f}")
    return "\n".join(lines)
