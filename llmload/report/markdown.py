"""report.md: the run's summary as Markdown (read in a terminal, a pull request, a ticket)."""

from __future__ import annotations

from collections.abc import Callable

from llmload.cancel import cut_line
from llmload.cost.render import cost_lines, cost_table
from llmload.fleet import lost_line, worker_name
from llmload.format import fmt, percent
from llmload.models import AccessNote, GroupFigures, ReusablePrefix, ServerSummary, Summary
from llmload.report.notes import ITL_NOTE, REPLICA_SERVER_NOTE, REQUESTS_NOTE, lost_note
from llmload.server.kinds import kind

CACHE_GAP_NOTED = 0.10  # the server's hit rate this far below what the workload could hit: say why


def turn_depths(mix: dict[str, float]) -> str:
    """Turn mix as "turn 1 / 2 / 3 / 4 and deeper" percentages."""
    if not mix:
        return "–"

    def share(key: str) -> float:
        return mix.get(key, 0.0)

    deep = sum(v for k, v in mix.items() if k not in ("1", "2", "3"))
    return "/".join(f"{100 * v:.0f}" for v in (share("1"), share("2"), share("3"), deep))


def server_facts(summary: Summary) -> list[str]:
    """Sentences on the server: which it is, its own figures (KV cache, queue, preemptions over the
    whole run; prefix-cache hits of the judged stages), a figure its kind does not export said so
    (never a blank that reads as zero), what the prompts sent could have hit against what the server
    hit, and whether the workload's output lengths were forced."""
    identity, server = summary.run.server, summary.server
    lines = []
    if identity is not None:
        lines.append(f"Server: {identity.name} (told by {identity.evidence}).")
    label = identity.label if identity is not None else "the server"
    missing = set(kind(identity.kind).not_exported()) if identity is not None else set()

    def figure(field: str, value: str) -> str:
        return f"not exported by {label}" if field in missing else value

    if server is not None or missing:
        kv, waiting, preemptions = (
            (server.kv_cache_usage_max, server.waiting_max, server.preemptions) if server else (None, None, None)
        )
        line = (
            f"Its metrics (whole run): KV-cache usage max {figure('kv_cache_usage', percent(kv))}, waiting max"
            f" {figure('waiting', fmt(waiting, 0))}, preemptions {figure('preemptions_total', fmt(preemptions, 0))}."
        )
        if server is not None and server.prefix_cache_hit_rate is not None:
            line += (
                f" Prefix-cache hit rate {percent(server.prefix_cache_hit_rate)} of "
                f"{fmt(server.prefix_cache_queries, 0)} prompt tokens looked up in the judged stages."
            )
        lines.append(line)
    if server is not None and server.workload_prefix is not None and server.workload_prefix.share is not None:
        lines.append(_prefix_ceiling(server.workload_prefix, server.prefix_cache_hit_rate, figure))
    could = server.workload_prefix.by_conversation if server is not None and server.workload_prefix else None
    if could is not None:
        lines.append(f"By conversation, the prompts sent could hit {could.describe()}.")
    if summary.cached_share_by_conversation is not None:
        lines.append(f"By conversation, the server's usage says {summary.cached_share_by_conversation.describe()}.")
    if server is not None and (spec := server.spec_decode) is not None:
        lines.append(
            f"Speculative decoding (judged stages): {fmt(spec.drafts, 0)} drafts of {fmt(spec.draft_tokens, 0)} tokens,"
            f" {percent(spec.acceptance_rate, 1)} accepted; mean acceptance length"
            f" {fmt(spec.mean_acceptance_length, 2)} tokens a step; {fmt(spec.accepted_tokens_per_s)} accepted"
            " tokens/s."
            + (
                " Accepted at each draft position (of the drafts): "
                + ", ".join(percent(share, 1) for share in spec.acceptance_by_position)
                + "."
                if spec.acceptance_by_position
                else ""
            )
        )
    lines += cost_lines(summary.cost)
    lengths = summary.output_lengths
    if lengths is not None:
        asked, got = lengths.requested_tokens, lengths.output_tokens
        lines.append(
            f"Output lengths: {lengths.requested} successful requests fixed one (p50 {fmt(asked.p50, 0)} / p99"
            f" {fmt(asked.p99, 0)} tokens); {lengths.forced} asked the server to keep to it; the server gave p50"
            f" {fmt(got.p50, 0)} / p99 {fmt(got.p99, 0)}."
        )
    return lines


_TEMPLATE_NAMES = {"chatml": "ChatML template, ", "none": "message text alone, ", None: ""}


def _prefix_ceiling(reuse: ReusablePrefix, hit_rate: float | None, figure: Callable[[str, str], str]) -> str:
    """What the prompts sent could have hit in an infinite prefix cache against what the server hit;
    a server well below it lost the rest to its cache's size and eviction."""
    line = (
        f"Prefix cache: the workload could hit {percent(reuse.share, 1)} ({_TEMPLATE_NAMES[reuse.chat_template]}"
        f"block {reuse.block_size}:"
        f" {percent(reuse.history_share, 1)} history, {percent(reuse.shared_share, 1)} shared);"
        f" the server hit {figure('prefix_cache_hits_total', percent(hit_rate, 1))}."
    )
    could = reuse.ceiling
    if could.in_server_blocks:
        line += (
            f" In its own {could.block_size}-token blocks (its usage's cached tokens are multiples of it) it"
            f" could hit {percent(could.share, 1)}: a block's tail and each prompt's last token are not reused."
        )
    if hit_rate is not None and could.share is not None and could.share - hit_rate >= CACHE_GAP_NOTED:
        line += (
            " The gap is the cache's own size and eviction: blocks an infinite cache would have kept were"
            " evicted before their prefix came back (a bigger KV cache, fewer concurrent sequences or"
            " prefix-aware routing closes it)."
        )
    return line


def _gpu_lines(server: ServerSummary | None) -> list[str]:
    """The GPU table of report.md; nothing for a run that read no GPU."""
    if server is None or not server.gpus:
        return []
    lines = [
        "",
        "## GPU",
        "",
        "| GPU | memory used max | MiB used max | MiB total | utilisation mean % | utilisation max % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g in server.gpus:
        lines.append(
            f"| {g.gpu} | {percent(g.memory_usage_max)} | {fmt(g.memory_used_max_mib, 0)} "
            f"| {fmt(g.memory_total_mib, 0)} | {fmt(g.utilization_mean_percent, 0)} "
            f"| {fmt(g.utilization_max_percent, 0)} |"
        )
    return [*lines, "", "Over the whole run, warm-up included, sampled with the server's metrics."]


def _replica_server_markdown(server: ServerSummary | None) -> list[str]:
    """Each replica's server figures beside its latency (By replica): the one whose KV cache runs out shows
    apart, where the fleet's figures would hide it."""
    if server is None or not server.replicas:
        return []
    header = "| replica | KV cache peak | preemptions | waiting peak | /health unanswered |"
    lines = ["", header, "|---|---:|---:|---:|---:|"]
    for r in server.replicas:
        lines.append(
            f"| `{r.host}` | {percent(r.kv_cache_usage_max)} | {fmt(r.preemptions, 0)} | {fmt(r.waiting_max, 0)} "
            f"| {r.unanswered_samples} |"
        )
    return [*lines, "", REPLICA_SERVER_NOTE]


def _groups_markdown(title: str, label: str, groups: list[GroupFigures], note: str) -> list[str]:
    """A run of several models (or LoRA adapters), or over several replicas: each one's requests, failures
    and latency."""
    if not groups:
        return []
    lines = [
        "",
        f"## {title}",
        "",
        f"| {label} | share asked | sent | ok | failed | TTFT p50 / p99 (ms) | TPOT p50 (ms) | E2E p50 / p99 (ms)"
        " | output tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in groups:
        failures = ", ".join(f"{category} {count}" for category, count in g.failures.items())
        lines.append(
            f"| `{g.name}` | {percent(g.share) if g.share is not None else '–'} | {g.sent} | {g.ok} "
            f"| {g.failed}{f' ({failures})' if failures else ''} | {fmt(g.ttft_p50_ms, 0)} / {fmt(g.ttft_p99_ms, 0)} "
            f"| {fmt(g.tpot_p50_ms)} | {fmt(g.e2e_p50_ms, 0)} / {fmt(g.e2e_p99_ms, 0)} | {fmt(g.output_tokens_per_s)} |"
        )
    return [*lines, "", f"The judged stages' requests; {note}"]


def _workers_markdown(summary: Summary) -> list[str]:
    """A distributed run's workers, a line each, and what each lost worker took with it."""
    if not summary.workers:
        return []
    lines = [
        "",
        "## Workers",
        "",
        "| worker | sent | ok | failed | lost | sent, its own count | took over | CPU max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in summary.workers:
        lines.append(
            f"| {worker_name(w)} | {w.sent} | {w.ok} | {w.failed} | {w.lost} | {w.sent_reported} | {w.adopted} "
            f"| {w.cpu_max_percent:.0f}% |"
        )
    lines += ["", "Sent, ok and failed are counted from the records (warm-up included); the worker's own count of"
              " what it sent comes in its messages."]  # fmt: skip
    lines += [f"- {lost_line(w)}." for w in summary.workers if w.lost_at_s is not None]
    lines += [f"- {worker_name(w)} sent nothing: {w.refused}." for w in summary.workers if w.refused]
    return lines


def _rounded_stages(summary: Summary) -> list[str]:
    """Stages whose rate × length is not a whole number of requests: the plan rounds once over its running
    total, so a stage may hold one more or one less than its share, and the report says which."""
    moved = [
        f"{s.name} holds {s.scheduled} ({s.target_qps:g} req/s × {s.duration_s:g} s is {s.target_qps * s.duration_s:g})"
        for s in summary.stages
        if abs(s.target_qps * s.duration_s - round(s.target_qps * s.duration_s)) > 1e-6
        and s.scheduled != s.target_qps * s.duration_s
    ]
    if not moved:
        return []
    return ["", "Rounded to whole requests over the plan's running total: " + "; ".join(moved) + "."]


def _goodput_markdown(summary: Summary) -> list[str]:
    """The goodput section: the SLO rule, the run's figure and each stage's (none without an SLO)."""
    slo, overall = summary.run.goodput_slo, summary.throughput.goodput
    if slo is None or overall is None:
        return []
    lines = [
        "",
        "## Goodput",
        "",
        f"Requests meeting every SLO ({slo.describe()}): {overall.requests_per_s:.2f} req/s, "
        f"{overall.output_tokens_per_s:,.0f} output tok/s, {percent(overall.slo_attainment, 1)} of the answered"
        " requests. Failed and unfinished requests count against it; cancelled ones are left out.",
        "",
        "| stage | achieved req/s | goodput req/s | goodput output tok/s | SLO met |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in summary.stages:
        if s.goodput is not None:
            name = f"{s.name} (not judged)" if s.warmup else s.name
            lines.append(
                f"| {name} | {s.achieved_qps:.2f} | {s.goodput.requests_per_s:.2f} "
                f"| {s.goodput.output_tokens_per_s:,.0f} | {percent(s.goodput.slo_attainment, 1)} |"
            )
    return lines


def _reasoning_lines(summary: Summary) -> list[str]:
    """What the successful requests thought before answering, when any did (docs/metrics.md: TTFO)."""
    r = summary.reasoning
    if r is None:
        return []
    think, answer = r.reasoning_tokens, r.answer_tokens
    counted = ""
    if r.counted:
        counted = f"; {r.counted} counted from the stream's reasoning chunks (the server's usage told none)"
    return [
        "",
        f"Reasoning: {r.requests} of {summary.requests.ok} successful requests thought before answering."
        f" Reasoning tokens per request p50/p95/p99/max: {fmt(think.p50, 0)}/{fmt(think.p95, 0)}/"
        f"{fmt(think.p99, 0)}/{fmt(think.max, 0)}, mean {r.reasoning_tokens_mean:,.1f}; answer tokens:"
        f" {fmt(answer.p50, 0)}/{fmt(answer.p95, 0)}/{fmt(answer.p99, 0)}/{fmt(answer.max, 0)}{counted}."
        " TTFO is the time to the first answer token, after the thinking; TTFT the first token of either.",
    ]


def _access_line(access: AccessNote | None) -> list[str]:
    """How the target was reached, when there is more to say than plain HTTP (values never shown)."""
    if access is None or (access.tls_verify == "plain_http" and not access.headers):
        return []
    trust = {
        "plain_http": "plain HTTP",
        "system": "TLS, verified against the system's CAs",
        "ca_cert": f"TLS, verified against `{access.ca_cert}`",
        "insecure": "**TLS, certificates not verified (--insecure)**",
    }[access.tls_verify]
    parts = [trust]
    if access.client_cert:
        parts.append(f"client certificate `{access.client_cert}`")
    if access.headers:
        parts.append(f"headers {', '.join(access.headers)} (values not recorded)")
    return [f"Connection: {'; '.join(parts)}.", ""]


def _header_lines(summary: Summary) -> list[str]:
    """The title, the target and plan in one sentence, how it was reached, and the verdict on top."""
    run = summary.run
    mix = ", ".join(f"`{g.name}` {percent(g.share)}" for g in summary.by_model if g.share is not None)
    models = f"models {mix}" if mix else f"model `{run.model or '?'}`"
    hosts = f"replicas {', '.join(f'`{g.name}`' for g in summary.by_host)}" if summary.by_host else f"`{run.host}`"
    scaled = f" with every length ×{run.token_scale:g} (--scale-tokens)" if run.token_scale != 1 else ""
    load = f"{run.arrival} arrivals, target {run.target_qps:g} req/s"
    if run.sessions_in_flight is not None:
        load = f"a closed loop of {run.sessions_in_flight} trace conversations in flight at 100% (--sessions-in-flight)"
    lines = [
        f"# llmload run `{run.run_id}`",
        "",
        f"Target {hosts}{f', {run.server.name}' if run.server else ''} ({models}), workload"
        f" `{run.workload}`{scaled}, {load}, {run.workers} load-generator process(es), "
        f"{run.finished_at - run.started_at:.0f} s.",
        "",
        *_access_line(run.access),
    ]
    if summary.verdict is not None:
        lines += [f"**Verdict: {summary.verdict.label}**", "", *[f"- {r}" for r in summary.verdict.reasons], ""]
    return lines


def _requests_lines(summary: Summary) -> list[str]:
    req = summary.requests
    lines = [
        "## Requests",
        "",
        "| scheduled | sent | ok | failed | unfinished | cancelled | not sent | lost | OOM family "
        "| warm-up (not judged) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {req.scheduled} | {req.sent} | {req.ok} | {req.failed} | {req.unfinished} | {req.cancelled} "
        f"| {req.not_sent} | {req.lost} | {summary.failures.oom_family} | {req.warmup} |",
        "",
        REQUESTS_NOTE,
    ]
    if req.lost:
        lines += ["", f"**{lost_note(req.lost)}**"]
    if cut := cut_line(summary):
        lines += ["", cut]
    return lines


def _latency_lines(summary: Summary) -> list[str]:
    """The latency table, then throughput and token lengths, reasoning, the server's facts and the GPUs."""
    lat, tp, tok = summary.latency_ms, summary.throughput, summary.tokens
    lines = [
        "",
        "## Latency (ms, successful requests, from send)",
        "",
        "| metric | p50 | p90 | p95 | p99 | p99.9 | mean | max | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in (
        *lat.headline(),
        ("schedule delay", lat.schedule_delay),
        ("TTFT from schedule", lat.ttft_from_schedule),
        ("E2E from schedule", lat.e2e_from_schedule),
    ):
        cells = " | ".join(fmt(v) for v in (p.p50, p.p90, p.p95, p.p99, p.p999, p.mean, p.max))
        lines.append(f"| {name} | {cells} | {p.count} |")
    return [
        *lines,
        "",
        ITL_NOTE,
        "",
        f"Throughput: {tp.requests_per_s:.2f} req/s, {tp.output_tokens_per_s:,.0f} output tok/s, "
        f"{tp.total_tokens_per_s:,.0f} total tok/s. Prompt tokens p50/p95/p99/max: "
        f"{fmt(tok.prompt.p50, 0)}/{fmt(tok.prompt.p95, 0)}/{fmt(tok.prompt.p99, 0)}/{fmt(tok.prompt.max, 0)}; "
        f"output: {fmt(tok.output.p50, 0)}/{fmt(tok.output.p95, 0)}/{fmt(tok.output.p99, 0)}/"
        f"{fmt(tok.output.max, 0)}.",
        *_reasoning_lines(summary),
        *(line for fact in server_facts(summary) for line in ("", fact)),
        *_gpu_lines(summary.server),
        *cost_table(summary.cost),
    ]


def _stage_lines(summary: Summary) -> list[str]:
    lines = [
        "",
        "## Stages",
        "",
        "| stage | target req/s | offered | achieved | scheduled | ok | failed | unfinished | cancelled | not sent "
        "| delay p99 ms | TTFT p50 | TTFT p99 | E2E p99 | prompt tok p50 | prompt tok p99 | turns 1/2/3/4+ % "
        "| shortfall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for s in summary.stages:
        name = f"{s.name} (not judged)" if s.warmup else s.name
        lines.append(
            f"| {name} | {s.target_qps:.2f} | {s.offered_qps:.2f} | {s.achieved_qps:.2f} | {s.scheduled} | {s.ok} "
            f"| {s.failed} | {s.unfinished} | {s.cancelled} | {s.not_sent} | {fmt(s.schedule_delay_p99_ms)} "
            f"| {fmt(s.ttft_p50_ms)} "
            f"| {fmt(s.ttft_p99_ms)} | {fmt(s.e2e_p99_ms)} | {fmt(s.prompt_tokens_p50, 0)} "
            f"| {fmt(s.prompt_tokens_p99, 0)} | {turn_depths(s.turn_mix)} | {'**yes**' if s.shortfall else 'no'} |"
        )
    if any(s.warmup for s in summary.stages):
        lines += ["", "The warm-up fills sessions to every depth; it is reported, and left out of every other figure."]
    lines += _rounded_stages(summary)
    return lines


def _turn_lines(summary: Summary) -> list[str]:
    lines: list[str] = []
    lines += [
        "",
        "## By turn (history growth)",
        "",
        "| turn | requests | prompt tokens p50 | prompt tokens p99 | TTFT p50 ms | TTFT p99 ms | from cache |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in summary.turns:
        lines.append(
            f"| {t.turn} | {t.requests} | {fmt(t.prompt_tokens_p50, 0)} | {fmt(t.prompt_tokens_p99, 0)} "
            f"| {fmt(t.ttft_p50_ms)} | {fmt(t.ttft_p99_ms)} | {percent(t.cached_share)} |"
        )
    lines += [
        "",
        "From cache: the share of prompt tokens the server's usage reports as `cached_tokens` (vLLM sends it"
        " with `--enable-prompt-tokens-details`; – without).",
    ]
    return lines


def _failure_lines(summary: Summary) -> list[str]:
    lines: list[str] = []
    lines += ["", "## Failures", ""]
    if summary.failures.by_category:
        lines += ["| category | count | example |", "|---|---:|---|"]
        for category, count in sorted(summary.failures.by_category.items(), key=lambda kv: -kv[1]):
            example = summary.failures.examples.get(category, "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {category} | {count} | {example[:160]} |")
    else:
        lines.append("None.")
    return lines


def render_markdown(summary: Summary) -> str:
    """report.md: one section after another, each from its own function."""
    lines = [*_header_lines(summary), *_requests_lines(summary), *_latency_lines(summary), *_stage_lines(summary)]
    lines += _groups_markdown(
        "By model", "model", summary.by_model, "each session asks for one model, drawn by its share."
    )
    lines += _groups_markdown(
        "By replica", "replica", summary.by_host,
        "all turns of a session go to one replica; its server kind and model list are the first's.",
    )  # fmt: skip
    lines += _replica_server_markdown(summary.server)
    lines += _workers_markdown(summary)
    lines += _goodput_markdown(summary)
    lines += _turn_lines(summary)
    lines += _failure_lines(summary)
    if summary.run.warnings:
        lines += ["", "## Warnings", "", *[f"- {w}" for w in summary.run.warnings]]
    return "\n".join(lines) + "\n"
