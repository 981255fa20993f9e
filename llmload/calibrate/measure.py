"""The calibration's measurements: which probes (prompt length × concurrent streams) and how each is
timed, repeated in rounds until the time budget is spent.

A probe sends its streams at once and reads vLLM's own mean TTFT or ITL for them from the growth
of its /metrics histograms: server-side times, stamped where tokens leave the engine, so a busy
client does not distort them. A probe during which the server counted requests or tokens that were
not the probe's (someone else's traffic) is discarded and counted.

Bursts time each kind of step apart; production arrives as a steady stream. The steady-load point
sends chats that share system prompts at Poisson times for a while and keeps what the client saw
of each, to be replayed through the simulator's engine (`fit.fit_steady_load`). It comes in
windows between rounds of bursts, so a server whose speed drifts over minutes (a shared VM's does
by ±15%) drifts alike under both, and the factor between them is not that drift.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gevent
import numpy as np

from llmload.calibrate.prompts import PromptMaker
from llmload.calibrate.target import public_url
from llmload.capacity.kv import longest_held, sequences_held
from llmload.client import ChatClient, Limits, StreamResult
from llmload.errors import InputError
from llmload.observe.metrics import scrape
from llmload.server.request import chat_body
from llmload.sim.profiles import EngineProfile, ProbeKind

SHORT_PROMPT = 32  # tokens: the shortest probes' prompts (a chat template and a head take ~15)
PREFILL_FRACTIONS = (0.125, 0.25, 0.5, 0.9)  # of the longest prompt the server takes
CONTEXT_FRACTIONS = (0.25, 0.5, 0.9)  # decode probes beyond the short one
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
SUCCESS = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class ProbeShape:
    """prefill: one request of one output token, its TTFT measured; decode: `streams` concurrent
    requests of `output_tokens` each, their ITL measured."""

    kind: ProbeKind
    streams: int
    prompt_tokens: int
    output_tokens: int


@dataclass
class Measurement:
    prompt_tokens: list[int]
    """Each request's prompt as the server counted it (usage)."""
    value_ms: float
    """The server's mean TTFT (prefill) or ITL (decode) over the probe's requests."""
    wall_s: float
    clean: bool
    """Nothing but the probe ran on the server meanwhile."""


def probes_for(profile: EngineProfile, num_blocks: int, *, max_streams: int, output_tokens: int) -> list[ProbeShape]:
    """Prefill: single requests from a short prompt to 90% of the longest; decode: 1, 2, 4, ... streams
    of short prompts up to what max_num_seqs and the KV cache allow, and at longer contexts the
    fewest, a quarter and the most streams (so KV tokens vary apart from the batch size)."""
    block = profile.serving.resolved().block_size
    longest = longest_held(num_blocks, block, profile.max_model_len)
    probes = [
        ProbeShape("prefill", 1, n, 1)
        for n in sorted({SHORT_PROMPT, *(int(f * longest) for f in PREFILL_FRACTIONS)})
        if n >= SHORT_PROMPT
    ]

    def most_streams(context: int) -> int:
        held = sequences_held(num_blocks, context + output_tokens, block)
        return max(1, min(profile.max_num_seqs, max_streams, held))

    top = most_streams(SHORT_PROMPT)
    short = sorted({*(2**i for i in range(int(math.log2(top)) + 1)), top})
    probes += [ProbeShape("decode", n, SHORT_PROMPT, output_tokens) for n in short]
    for fraction in CONTEXT_FRACTIONS:
        context = int(fraction * (longest - output_tokens))
        if context <= SHORT_PROMPT:
            continue
        top = most_streams(context)
        probes += [ProbeShape("decode", n, context, output_tokens) for n in sorted({1, max(1, top // 4), top})]
    return probes


def _mean_ms(before: dict[str, float], after: dict[str, float], name: str) -> tuple[float, float]:
    """(count, mean in ms) of what a histogram observed between two scrapes."""
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    return count, 1000 * total / count if count else math.nan


def measure(url: str, model: str, probe: ProbeShape, prompts: list[str], limits: Limits) -> Measurement:
    """Send the probe's requests at once; vLLM's mean TTFT or ITL for them."""
    results: list[StreamResult] = []

    def one(content: str) -> None:
        client = ChatClient(url, limits=limits)
        body = chat_body(
            model, [{"role": "user", "content": content}], max_tokens=None, output_tokens=probe.output_tokens
        )
        try:
            results.append(client.stream_chat(body))
        finally:
            client.close()

    before = scrape(url)
    started = time.monotonic()
    gevent.joinall([gevent.spawn(one, content) for content in prompts])
    wall = time.monotonic() - started
    after = scrape(url)
    failed = [r for r in results if not r.ok]
    if failed:
        raise InputError(
            f"{public_url(url)}: {len(failed)} of {len(results)} calibration requests failed "
            f"({failed[0].error_category}: {failed[0].error_message})"
        )
    outputs = sum(r.completion_tokens or 0 for r in results)
    histogram = TTFT if probe.kind == "prefill" else ITL
    expected = probe.streams if probe.kind == "prefill" else outputs - probe.streams
    count, mean = _mean_ms(before, after, histogram)
    clean = (
        count == expected
        and after.get(SUCCESS, 0.0) - before.get(SUCCESS, 0.0) == probe.streams
        and after.get(GENERATED, 0.0) - before.get(GENERATED, 0.0) == outputs
    )
    return Measurement([r.prompt_tokens or 0 for r in results], mean, wall, clean and mean > 0)


@dataclass
class Rounds:
    """Every clean measurement of each probe, over the rounds the budget allowed."""

    measurements: dict[ProbeShape, list[Measurement]]
    rounds: int = 0
    discarded: int = 0
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    last_wall_s: dict[ProbeShape, float] = field(default_factory=dict)
    """How long each probe took last time: the next one runs only if that fits what is left."""


def measure_rounds(
    url: str,
    model: str,
    *,
    probes: list[ProbeShape],
    maker: PromptMaker,
    budget_s: float,
    progress: Callable[[str], None] = lambda line: None,
    resume: Rounds | None = None,
) -> Rounds:
    """A warm-up (unless resuming earlier rounds), then every probe in turn, round after round,
    while the next probe fits the budget (its duration last time; a probe never measured yet starts
    while any time is left)."""
    started = time.monotonic()
    deadline = started + budget_s
    limits = Limits(first_token_s=max(60.0, budget_s), between_tokens_s=60.0, total_s=budget_s + 60.0)
    done = resume or Rounds({probe: [] for probe in probes})
    if resume is None:
        widest = max((p for p in probes if p.kind == "decode"), key=lambda p: p.streams)
        longest = max((p for p in probes if p.kind == "prefill"), key=lambda p: p.prompt_tokens)
        # the first shapes are slow on some backends
        for warm in (ProbeShape("decode", widest.streams, SHORT_PROMPT, 4), longest):
            measure(url, model, warm, maker.prompts(warm.prompt_tokens, warm.streams), limits)
    while True:
        round_started = time.monotonic()
        for probe in probes:
            if time.monotonic() + done.last_wall_s.get(probe, 0.0) > deadline:
                done.elapsed_s += time.monotonic() - started
                return done
            prompts = maker.prompts(probe.prompt_tokens, probe.streams)
            result = measure(url, model, probe, prompts, limits)
            done.last_wall_s[probe] = result.wall_s
            if result.clean:
                done.measurements[probe].append(result)
            else:
                done.discarded += 1
        done.rounds += 1
        progress(f"round {done.rounds}: {len(probes)} probes in {time.monotonic() - round_started:.1f} s")


@dataclass(frozen=True)
class SteadyRequest:
    """One request of the steady-load point and what the client saw of it (perf_counter seconds)."""

    sent_s: float
    """After the point's start."""
    system: int
    """Which system prompt it shares."""
    shared_tokens: int
    """Its prompt's tokens up to the end of that system prompt (the part other requests share)."""
    prompt_tokens: int
    token_times_s: tuple[float, ...]
    """Each output token's arrival, after the point's start."""


def measure_steady_load(
    url: str,
    model: str,
    maker: PromptMaker,
    *,
    rate_qps: float,
    duration_s: float,
    system_tokens: Sequence[int],
    user_tokens: int,
    output_tokens: int,
    window: int = 0,
) -> list[SteadyRequest]:
    """Open loop: a chat every exponential gap (mean 1/rate) for `duration_s`, each a shared system
    prompt (one of `system_tokens` long, in turn) and a user message of its own; then every one of
    them to its end. Each window has system prompts of its own (numbered on from the last
    window's), so it starts with a cold prefix cache as its replay does."""
    first = window * len(system_tokens)
    systems = [f"system prompt {first + k}: " + maker.body(n) for k, n in enumerate(system_tokens)]
    shared = [maker.count([{"role": "system", "content": text}]) for text in systems]
    gaps = np.random.default_rng(window).exponential(1 / rate_qps, size=int(rate_qps * duration_s * 2) + 10)
    sends = np.cumsum(gaps)
    sends = sends[sends < duration_s]
    limits = Limits(first_token_s=duration_s + 60, between_tokens_s=60.0, total_s=duration_s + 120)
    started = time.perf_counter()
    done: list[SteadyRequest] = []
    failures: list[StreamResult] = []

    def one(at_s: float, system: int, user: str) -> None:
        gevent.sleep(max(0.0, started + at_s - time.perf_counter()))
        messages = [{"role": "system", "content": systems[system]}, {"role": "user", "content": user}]
        client = ChatClient(url, limits=limits)
        try:
            result = client.stream_chat(chat_body(model, messages, max_tokens=None, output_tokens=output_tokens))
        finally:
            client.close()
        if not result.ok:
            failures.append(result)
            return
        times = tuple(t - started for t in result.token_times)
        done.append(
            SteadyRequest(result.sent_at - started, first + system, shared[system], result.prompt_tokens or 0, times)
        )

    users = maker.prompts(user_tokens, len(sends))
    gevent.joinall(
        [
            gevent.spawn(one, float(at), i % len(systems), user)
            for i, (at, user) in enumerate(zip(sends, users, strict=True))
        ]
    )
    if failures:
        raise InputError(
            f"{public_url(url)}: {len(failures)} of {len(sends)} steady-load requests failed "
            f"({failures[0].error_category}: {failures[0].error_message})"
        )
    return sorted(done, key=lambda r: r.sent_s)
