"""Text rendering: the tables ``llmload capacity`` prints for a plan and for an explained log."""

from __future__ import annotations

from collections.abc import Iterable

from llmload.capacity.kv import GIB, RequestFit
from llmload.capacity.plan import CapacityReport, capped_note
from llmload.capacity.vllm_log import LogExplanation
from llmload.models import ServeConfig


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _section(title: str, rows: Iterable[tuple[str, str]]) -> list[str]:
    rows = list(rows)
    width = max(len(label) for label, _ in rows)
    return ["", title, *(f"  {label.ljust(width)}  {value}" for label, value in rows)]


def _fit_row(label: str, fit: RequestFit) -> tuple[str, str]:
    refused = "" if fit.fits else "  (too long: vLLM refuses to start)"
    per_gpu = format_bytes(fit.kv_bytes_per_gpu)
    return label, f"{fit.tokens:,} tokens = {fit.blocks:,} blocks ({per_gpu}/GPU) → {fit.max_concurrency:.2f}x{refused}"


def render_capacity(report: CapacityReport) -> str:
    """The human-readable table printed by ``llmload capacity``."""
    lay, mem, cache = report.layout, report.memory, report.cache
    tp = lay.tensor_parallel_size
    if lay.head_size_v:
        formula = f"2 × {lay.layers} layers × {lay.kv_heads_per_gpu} KV heads × {lay.head_size} × {lay.dtype_bytes} B"
    else:
        formula = f"{lay.layers} layers × {lay.head_size} (kv_lora_rank + qk_rope_head_dim) × {lay.dtype_bytes} B"
    naive = lay.naive_bytes_per_token
    per_token = [
        ("per GPU", f"{format_bytes(lay.bytes_per_token)} ({lay.bytes_per_token:,} B) = {formula}"),
        (
            "naive 2×layers×hidden",
            f"{format_bytes(naive)}, {naive / lay.bytes_per_token_model:.1f}× the model's real KV",
        ),
    ]
    if tp > 1:
        per_token.insert(1, (f"all {tp} GPUs", format_bytes(lay.bytes_per_token_all_gpus)))
    budget = []
    if mem.requested_gib is not None:
        estimated = f" (estimated, {(mem.parameters or 0) / 1e9:.2f} B params)" if mem.weights_estimated else ""
        budget += [
            ("GPU × utilization", f"{mem.gpu_memory_gib:g} GiB × {mem.gpu_memory_utilization:g}"),
            ("= vLLM's budget", format_bytes(mem.requested_gib * GIB)),
            ("− weights", format_bytes((mem.weights_gib or 0) * GIB) + estimated),
            ("− activations/overhead", format_bytes((mem.overhead_gib or 0) * GIB)),
        ]
    budget.append(("= KV cache" + (" (given)" if mem.kv_cache_explicit else ""), format_bytes(cache.bytes_per_gpu)))
    if tp > 1:
        budget.append((f"KV cache, all {tp} GPUs", format_bytes(cache.bytes_per_gpu * tp)))
    cache_rows = [
        ("blocks", f"{cache.num_blocks:,} × {lay.block_size} tokens = {cache.tokens:,} tokens"),
        ("longest sequence", f"{cache.longest_servable_len:,} tokens (one block is kept as vLLM's null block)"),
    ]
    if report.starts:
        cache_rows += [
            ("vLLM will log", f"KV cache size: {report.vllm_log_kv_cache_tokens:,} tokens"),
            (
                "",
                f"Maximum concurrency for {report.max_model_len:,} tokens per request: "
                f"{report.at_max_model_len.max_concurrency:.2f}x",
            ),
        ]
    else:
        cache_rows.append(("vLLM will refuse", f"ValueError: {report.startup_error}"))
    fits = [_fit_row("at max_model_len", report.at_max_model_len)]
    limit = report.max_model_len_limit
    if not report.starts and limit is not None and report.max_model_len > limit:
        label, value = fits[0]
        fits[0] = (label, f"{value}  (past the model's limit of {limit:,}: vLLM refuses to start)")
    if report.at_request_tokens is not None:
        fits.append(_fit_row("at request tokens", report.at_request_tokens))
    one = report.recommended_max_model_len
    recommended = [("one sequence fits", f"{one:,}{capped_note(report, one)}")]
    if (for_concurrency := report.max_model_len_for_min_concurrency) is not None:
        recommended.append(
            (
                f"≥ {report.min_concurrency:g}x concurrency",
                f"{for_concurrency:,}{capped_note(report, for_concurrency)}",
            )
        )
    out = [
        f"llmload capacity: {report.model.name} ({lay.attention}), TP {tp}, KV {lay.dtype}, block {lay.block_size}",
        *_section("KV cache per token", per_token),
        *_section("Memory per GPU", budget),
        *_section("KV cache per GPU", cache_rows),
        *_section("Concurrency (requests held in KV at once)", fits),
        *_section("Recommended max_model_len", recommended),
    ]
    if report.warnings:
        out += ["", "Notes", *(f"  - {w}" for w in report.warnings)]
    if report.advice:
        out += ["", "What to change", *(f"  - {a}" for a in report.advice)]
    return "\n".join(out)


def render_serve_config(config: ServeConfig) -> str:
    """The vLLM settings read, each with where it was set, and the keys llmload does not model."""
    fields = config.model_dump(exclude={"not_modelled", "origins"}, exclude_none=True)
    rows = [(key.replace("_", "-"), f"{value}   ({config.origins.get(key, '?')})") for key, value in fields.items()]
    out = _section("vLLM configuration", rows or [("(nothing set)", "vLLM's defaults")])
    if config.not_modelled:
        out.append("  not modelled: " + ", ".join(f"{k}={v}" for k, v in config.not_modelled.items()))
    return "\n".join(out).lstrip("\n")


def render_log_explanation(explanation: LogExplanation) -> str:
    """The explained log: the failed start in one line first (when the log shows one), the settings,
    each finding with its line number, message, meaning and vLLM source, then what to change."""
    out = [explanation.failure] if explanation.failure else []
    out += [f"llmload capacity: vLLM log {explanation.source}", ""]
    if explanation.settings:
        out.append("Settings: " + ", ".join(f"{k}={v}" for k, v in explanation.settings.items()))
        out.append("")
    if not explanation.findings:
        out.append("No KV-cache or startup-failure lines: the log ends before vLLM sized its KV cache.")
    previous = 0
    for f in explanation.findings:
        if f.line_no != previous:  # one log line can hold two findings (size and concurrency)
            origin = f" ({f.origin})" if f.origin else ""
            out.append(f"line {f.line_no}{origin}: {f.text[:200]}")
        out.append(f"  → {f.meaning}   [{f.vllm_source}]")
        previous = f.line_no
    if explanation.implied_bytes_per_token is not None:
        out += [
            "",
            f"Implied KV per token (per GPU or CPU worker): {explanation.implied_bytes_per_token:,.0f} B "
            f"({explanation.implied_bytes_per_token_basis})",
        ]
    if explanation.advice:
        out += ["", "What to change", *(f"  - {a}" for a in explanation.advice)]
    return "\n".join(out)
