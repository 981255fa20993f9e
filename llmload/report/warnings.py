"""The summary's warnings: what makes a run's figures less than they seem (the load not offered, a
load generator short of CPU or stalled, answers unfinished or unforced, an insecure connection),
each with its numbers and what to do. Their limits are here, beside the words that name them."""

from __future__ import annotations

import math

import pandas as pd

from llmload.access import INSECURE_WARNING
from llmload.models import OutputLengths, RunManifest, ServerIdentity, StageSummary
from llmload.observe.observer import LAG_WARNING_MS
from llmload.server.kinds import kind
from llmload.stats.percentiles import quantile

CPU_WARNING_PERCENT = 60.0
STEAL_WARNING_PERCENT = 2.0
SHORTFALL_RATIO = 0.98  # a stage must send this share of its target's requests
SHORTFALL_DELAY_MS = 100.0  # schedule delay p99 beyond this means the generator fell behind
INTERRUPTED = "interrupted before the plan's end (Ctrl-C, SIGTERM, -t): what was measured until then"
NO_USAGE = (
    "some responses carried no usage: their output tokens were counted from the stream's chunks and their"
    " prompt tokens with the workload's tokenizer (estimates)"
)
SPECULATION_ON_SYNTHETIC_TEXT = (
    "the server speculates and the prompts are synthetic text: a draft's acceptance depends on the text"
    " (an n-gram or draft model predicts made-up words otherwise than real ones); replay prompts from"
    " production logs to measure it"
)


def shortfall_reason(stage: StageSummary) -> str:
    """Why a stage is short, with the numbers."""
    achieved = (
        f"achieved {stage.achieved_qps:.2f} of {stage.target_qps:.2f} req/s target"
        f" ({stage.achieved_qps / stage.target_qps:.1%}; limit ≥ {SHORTFALL_RATIO:.0%}), offered"
        f" {stage.offered_qps:.2f}"
        if stage.target_qps
        else f"achieved {stage.achieved_qps:.2f} req/s (a closed loop: no target)"
    )
    return (
        f"stage {stage.name}: {achieved}, schedule delay p99 {stage.schedule_delay_p99_ms or 0:.0f} ms"
        f" (limit {SHORTFALL_DELAY_MS:g} ms)"
    )


def _load_generator_warnings(manifest: RunManifest, lag_max_ms: float | None) -> list[str]:
    """The load generator's own trouble: its CPU, the hypervisor's steal, its timer's lateness."""
    warnings = []
    cpu = manifest.load_generator_cpu_max_percent
    if cpu is not None and cpu > CPU_WARNING_PERCENT:
        warnings.append(
            f"load generator CPU reached {cpu:.0f}% (> {CPU_WARNING_PERCENT:.0f}%): timings may include client delay;"
            " add Locust workers (--processes)"
        )
    steal = manifest.cpu_steal_percent
    if steal is not None and steal > STEAL_WARNING_PERCENT:
        warnings.append(
            f"the hypervisor took {steal:.1f}% of the load generator machine's CPU"
            f" (steal > {STEAL_WARNING_PERCENT:.0f}%): latency tails include descheduled vCPUs;"
            " repeat on a quieter or dedicated machine"
        )
    if lag_max_ms is not None and lag_max_ms > LAG_WARNING_MS:
        warnings.append(
            f"the load generator stalled for up to {lag_max_ms / 1000:.2f} s (its timer fired that late; "
            f"> {LAG_WARNING_MS:.0f} ms): latencies measured then include the stall; give it cores of its own "
            "(taskset, away from a local server) or more Locust workers (--processes)"
        )
    return warnings


def unfinished_warning(unfinished: int, sent: int, drain_s: float, e2e_p99_ms: float | None) -> str:
    """Requests the target had not finished when the drain ended: a failure to keep up, unless the
    drain was shorter than the answers take (then the advice is a longer drain)."""
    text = (
        f"{unfinished} of {sent} requests sent were still running when the {drain_s:g} s drain after the plan ended:"
        " the target did not keep up; they count as failures"
    )
    if e2e_p99_ms is not None and e2e_p99_ms / 1000 > drain_s / 2:
        text += (
            f" (the finished requests' E2E p99 is {e2e_p99_ms / 1000:.1f} s: if answers this long are expected,"
            f" give --drain-timeout {math.ceil(2 * e2e_p99_ms / 1000):d} or more)"
        )
    return text


def unforced_warning(lengths: OutputLengths, server: ServerIdentity | None) -> str:
    """Which server, why, and the workload's lengths against the measured ones."""
    why = server.name if server is not None else "the server"
    note = kind(server.kind).force_note if server is not None else None
    asked, got = lengths.requested_tokens, lengths.output_tokens
    return (
        f"output lengths not forced for {lengths.requested - lengths.forced} of {lengths.requested} requests that fix"
        f" one: {why}"
        + (f" ({note})" if note else " refused the fields that force it")
        + f"; the workload asked p50 {asked.p50:.0f} / p99 {asked.p99:.0f} output tokens, the server gave"
        f" p50 {got.p50:.0f} / p99 {got.p99:.0f}"
    )


def run_warnings(
    manifest: RunManifest,
    stages: list[StageSummary],
    ok: pd.DataFrame,
    *,
    lag_max_ms: float | None,
    sent: int,
    unfinished: int,
    lengths: OutputLengths | None,
) -> list[str]:
    """The summary's warnings in the order the report lists them (an interrupted run and an insecure
    connection first); `ok`: the judged successful requests (e2e_ms, usage_from_server)."""
    warnings = []
    if manifest.interrupted:
        warnings.append(INTERRUPTED)
    if manifest.access is not None and manifest.access.tls_verify == "insecure":
        warnings.append(INSECURE_WARNING)
    warnings += [f"{shortfall_reason(s)}: the target was not offered the load asked for" for s in stages if s.shortfall]
    warnings += _load_generator_warnings(manifest, lag_max_ms)
    if unfinished:
        warnings.append(unfinished_warning(unfinished, sent, manifest.drain_s, quantile(ok.e2e_ms, 99)))
    if len(ok) and not ok.usage_from_server.all():
        warnings.append(NO_USAGE)
    if lengths is not None and lengths.forced < lengths.requested:
        warnings.append(unforced_warning(lengths, manifest.server))
    return warnings
