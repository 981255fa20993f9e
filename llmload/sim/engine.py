"""The engine of `--profile` mode: vLLM v1's scheduler and paged KV cache, stepped in virtual time.

One asyncio task runs the loop vLLM's EngineCore runs: schedule a step (running requests first,
each its next token or prefill chunk within `max_num_batched_tokens`, then waiting requests in
FIFO order up to `max_num_seqs`; with `enable_chunked_prefill` off a prompt waits for a step with
room for all of it), let the step take the time the profile's cost model gives, then
hand each finished request its token. KV lives in fixed-size blocks from a pool sized by
llmload.capacity; full blocks are hashed (chained over the token ids, as vLLM's prefix caching
does) and shared by refcount; when a running request needs a block and none is free, the newest
running request is preempted: its blocks are freed and it goes back to the front of the waiting
queue, to be recomputed. Steps chain on their scheduled end times, so a late event loop delays
emission (measured as lag) but never the engine's own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

from llmload.sim import wire
from llmload.sim.config import FaultPlan, SlowTokens
from llmload.sim.metrics import EngineMetrics
from llmload.sim.pacing import LagStats, Pacer
from llmload.sim.profiles import EngineProfile, Timing

# What a CUDA OOM in the model runner leaves in vLLM's log before EngineDeadError reaches clients.
OOM_LOG = (
    "ERROR [core.py] EngineCore encountered a fatal error.\n"
    "torch.OutOfMemoryError: " + wire.CUDA_OOM.message + "\n"
    "ERROR [async_llm.py] AsyncLLM output_handler failed.\n"
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
    "root cause.\n"
)


class Sink(Protocol):
    """Where a request's output goes: a stream's transport, or a full response's future."""

    def token(self, request: EngineRequest, last: bool) -> bool:
        """Deliver the request's newest output token; False once the client has gone."""

    def fail(self, error: wire.VllmError | None) -> None:
        """End with `error` (in-stream event or HTTP error), or cut the connection when None."""


class Block:
    __slots__ = ("block_hash", "id", "ref")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref = 0
        self.block_hash: int | None = None


class BlockPool:
    """vLLM's BlockPool: free blocks in eviction order, full blocks findable by hash until evicted.

    Block 0 is the null block vLLM holds back. A freed block keeps its hash (a later request with
    the same prefix may take it back) until it is handed out again; requests free their blocks
    tail first, so the shared prefix of a conversation is evicted last.
    """

    def __init__(self, num_blocks: int) -> None:
        self.usable = num_blocks - 1
        self._free: dict[int, Block] = {i: Block(i) for i in range(1, num_blocks)}  # insertion order = LRU
        self._cached: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: blocks held by requests over usable blocks."""
        return 1.0 - len(self._free) / self.usable

    def lookup(self, hashes: Iterable[int]) -> list[Block]:
        """The cached blocks of the longest prefix of `hashes`."""
        hit = []
        for block_hash in hashes:
            block = self._cached.get(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def take(self, n: int) -> list[Block]:
        """n free blocks, evicting the least recently freed cached ones."""
        taken = []
        for _ in range(n):
            block = self._free.pop(next(iter(self._free)))
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) is block:
                    del self._cached[block.block_hash]
                block.block_hash = None
            block.ref = 1
            taken.append(block)
        return taken

    def touch(self, blocks: Iterable[Block]) -> None:
        """Share prefix-cache hits: a free cached block leaves the free queue."""
        for block in blocks:
            if block.ref == 0:
                del self._free[block.id]
            block.ref += 1

    def release(self, blocks: Sequence[Block]) -> None:
        for block in reversed(blocks):
            block.ref -= 1
            if block.ref == 0:
                self._free[block.id] = block

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset: every cached prefix forgotten, refused (False) while a request holds blocks."""
        if self.num_free < self.usable:
            return False
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        return True

    def cache(self, block: Block, block_hash: int) -> None:
        if block.block_hash is None:
            block.block_hash = block_hash
            self._cached.setdefault(block_hash, block)


class EngineRequest:
    """One request inside the engine (vLLM's Request): its tokens, KV blocks and timestamps."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached_tokens",
        "done",
        "hashes",
        "last_token_at",
        "max_output",
        "num_cached_blocks",
        "num_computed",
        "num_prompt",
        "output",
        "pause_after",
        "paused_until",
        "preemptions",
        "queued",
        "sink",
        "stall_s",
        "strike",
        "strike_error",
        "token_ids",
    )

    def __init__(self, prompt_ids: Sequence[int], max_output: int, sink: Sink, arrival: float) -> None:
        self.token_ids = list(prompt_ids)
        self.num_prompt = len(prompt_ids)
        self.max_output = max_output
        self.sink = sink
        self.arrival = arrival
        self.output = 0
        self.num_computed = 0
        self.blocks: list[Block] = []
        self.hashes: list[int] = []
        self.num_cached_blocks = 0
        self.cached_tokens = 0
        self.preemptions = 0
        self.queued = True
        """Not yet scheduled once: its queue time is still to be recorded."""
        self.last_token_at = 0.0
        self.paused_until = 0.0
        self.strike = -1
        """Output index at which the sink is failed (an injected mid-stream fault), -1 for none."""
        self.strike_error: wire.VllmError | None = None
        """What the sink is failed with at `strike`; None cuts the connection."""
        self.pause_after = -1
        """Output index after which the request stalls for `stall_s` (an injected stall), -1 for none."""
        self.stall_s = 0.0
        self.done = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def block_hashes(self, count: int, block_size: int) -> list[int]:
        """Chained hashes of the first `count` full blocks (each covers its whole prefix)."""
        hashes, ids = self.hashes, self.token_ids
        while len(hashes) < count:
            i = len(hashes)
            hashes.append(hash((hashes[-1] if hashes else None, tuple(ids[i * block_size : (i + 1) * block_size]))))
        return hashes[:count]


class StepLoad(NamedTuple):
    """What one step computes, the inputs of the profile's step-cost model (StepTiming.step_s)."""

    seqs: int
    kv_tokens: int
    """KV tokens the step's attention reads: each scheduled request's context up to its new tokens."""
    prefill_tokens: int
    prefill_pairs: int
    """(new prompt token, token at or before it) pairs the step's prefill attention computes: a chunk of
    n tokens after c computed ones makes n·c + n(n+1)/2, so a prompt costs the square of its length."""


def step_load(scheduled: Iterable[tuple[EngineRequest, int]]) -> StepLoad:
    """The load of a step that computes `n` tokens of each (request, n)."""
    seqs = kv_tokens = prefill = pairs = 0
    for request, n in scheduled:
        seqs += 1
        kv_tokens += request.num_computed + n
        if request.output == 0 or n > 1:
            prefill += n
            pairs += n * request.num_computed + n * (n + 1) // 2
    return StepLoad(seqs, kv_tokens, prefill, pairs)


class Engine:
    """Continuous batching over a paged KV cache, one step at a time (see the module docstring)."""

    def __init__(
        self,
        profile: EngineProfile,
        *,
        num_blocks: int,
        metrics: EngineMetrics,
        faults: FaultPlan,
        lag: LagStats,
        output_ids: Sequence[int],
        on_death: Callable[[], None],
    ) -> None:
        self.profile = profile
        vllm = profile.serving.resolved()  # once: the steps read these
        self.block_size, self.prefix_caching = vllm.block_size, vllm.enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.metrics = metrics
        self.lag = lag
        self.output_ids = tuple(output_ids)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.dead = False
        self._death = faults.engine_death
        self._slow: tuple[SlowTokens, ...] = faults.slow_tokens
        self._admitted = 0
        self._doomed = False
        self._on_death = on_death
        self._started = time.monotonic()
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ requests in and out

    def queue_full(self) -> bool:
        limit = self.profile.serving.max_num_queued_reqs
        return limit is not None and len(self.waiting) >= limit

    def add(self, request: EngineRequest) -> None:
        self.waiting.append(request)
        self._admitted += 1
        if self._death is not None and self._death.after_requests == self._admitted:
            self._doomed = True
        self._publish()
        self._wake.set()

    def abort(self, request: EngineRequest) -> None:
        """The client went away: free what the request holds, as vLLM aborts a disconnected request."""
        if request.done:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
        self._finish(request, "abort")

    def _finish(self, request: EngineRequest, reason: str | None) -> None:
        """Release the request's blocks; count it when it ended normally or was aborted."""
        request.done = True
        self.pool.release(request.blocks)
        request.blocks = []
        if reason is not None:
            self.metrics.success[reason] += 1
        self._publish()

    # ------------------------------------------------------------------ the loop

    async def run(self, pacer: Pacer) -> None:
        """Step until the engine dies; idle (no timer) while there is nothing to do."""
        clock = time.monotonic()
        while not self.dead:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                clock = max(clock, time.monotonic())
            scheduled = self._schedule(clock)
            if not scheduled:
                clock = await self._wait_for_change(clock)
                continue
            end = clock + self._step_s(scheduled, clock)
            if end > time.monotonic():
                await pacer.sleep_until(end, record=False)
            else:  # behind (a starved event loop): catch up, but let requests and writes in between
                await asyncio.sleep(0)
            self._complete(scheduled, end)
            clock = end
            if self._doomed or self._kv_death():
                self.die()

    def _kv_death(self) -> bool:
        level = self._death.at_kv_usage if self._death is not None else None
        return level is not None and self.pool.usage() >= level

    async def _wait_for_change(self, clock: float) -> float:
        """Nothing can be scheduled (stalled requests, or no room): wait for a stall to end or a request."""
        paused = [r.paused_until for r in self.running if r.paused_until > clock]
        self._wake.clear()
        timeout = min(paused) - time.monotonic() if paused else None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        return max(clock, time.monotonic())

    def _step_s(self, scheduled: list[tuple[EngineRequest, int]], now: float) -> float:
        seconds = self.profile.step_timing.step_s(*step_load(scheduled))
        elapsed = now - self._started
        return seconds + sum(w.extra_ms for w in self._slow if w.start_s <= elapsed < w.end_s) / 1000

    # ------------------------------------------------------------------ scheduling (vLLM's Scheduler.schedule)

    def _schedule(self, now: float) -> list[tuple[EngineRequest, int]]:
        budget = self.profile.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            if request.paused_until > now:
                i += 1
                continue
            n = min(request.num_tokens - request.num_computed, budget)
            lost = False
            while not lost and not self._allocate(request, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                lost = victim is request
            if lost:
                break
            scheduled.append((request, n))
            budget -= n
            i += 1
        if preempted:  # as vLLM: no new admissions in a step that had to preempt
            self._publish()
            return scheduled
        while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
            request = self.waiting[0]
            hits = self._prefix_hits(request)
            computed = len(hits) * self.block_size
            if self.profile.serving.enable_chunked_prefill is False and request.num_tokens - computed > budget:
                break  # as vLLM without chunked prefill: a prompt is prefilled whole, in a step with room for it
            n = min(request.num_tokens - computed, budget)
            if not self._allocate(request, n, hits):
                break
            self.waiting.popleft()
            if request.preemptions == 0 and self.prefix_caching:
                self.metrics.prefix_cache_queries += request.num_tokens
                self.metrics.prefix_cache_hits += computed
                request.cached_tokens = computed
            request.num_computed = computed
            request.num_cached_blocks = len(hits)
            if request.queued:
                request.queued = False
                self.metrics.queue_time.observe(max(0.0, now - request.arrival))
            self.running.append(request)
            scheduled.append((request, n))
            budget -= n
        self._publish()
        return scheduled

    def _prefix_hits(self, request: EngineRequest) -> list[Block]:
        """Cached blocks of the request's prefix; the last token is always recomputed (for its logits)."""
        if not self.prefix_caching:
            return []
        full = (request.num_tokens - 1) // self.block_size
        return self.pool.lookup(request.block_hashes(full, self.block_size))

    def _allocate(self, request: EngineRequest, n: int, hits: Sequence[Block] = ()) -> bool:
        """Blocks for `n` more tokens (after `hits`); False, changing nothing, when too few are free."""
        computed = request.num_computed + len(hits) * self.block_size
        needed = -(-(computed + n) // self.block_size) - len(request.blocks) - len(hits)
        if needed + sum(1 for b in hits if b.ref == 0) > self.pool.num_free:
            return False
        self.pool.touch(hits)
        request.blocks += [*hits, *self.pool.take(max(0, needed))]
        return True

    def _preempt(self, request: EngineRequest) -> None:
        """Recompute preemption: free the blocks, forget the KV, back to the front of the queue."""
        self.pool.release(request.blocks)
        request.blocks = []
        request.num_computed = 0
        request.num_cached_blocks = 0
        request.preemptions += 1
        self.metrics.preemptions += 1
        self.waiting.appendleft(request)

    # ------------------------------------------------------------------ a step's results

    def _complete(self, scheduled: list[tuple[EngineRequest, int]], end: float) -> None:
        """Advance what the step computed; each request whose tokens are all computed samples one."""
        lag = self.lag
        metrics = self.metrics
        for request, n in scheduled:
            if request.done:  # aborted while the step ran
                continue
            request.num_computed += n
            self._cache_blocks(request)
            if request.num_computed < request.num_tokens:
                continue  # a prefill chunk
            k = request.output
            request.output += 1
            request.token_ids.append(self.output_ids[k % len(self.output_ids)])
            metrics.generation_tokens += 1
            if k == 0:
                metrics.prompt_tokens += request.num_prompt
                metrics.ttft.observe(end - request.arrival)
            else:
                metrics.itl.observe(end - request.last_token_at)
            request.last_token_at = end
            if k == request.strike:
                self.running.remove(request)
                self._finish(request, None)
                request.sink.fail(request.strike_error)
                continue
            last = request.output == request.max_output
            lag.record(time.monotonic() - end)
            if not request.sink.token(request, last):
                self.running.remove(request)
                self._finish(request, "abort")
            elif last:
                self.running.remove(request)
                metrics.e2e.observe(end - request.arrival)
                self._finish(request, "length")
            elif k == request.pause_after:
                request.paused_until = end + request.stall_s
        self._publish()

    def _cache_blocks(self, request: EngineRequest) -> None:
        """Register the request's newly computed full blocks for prefix caching."""
        if not self.prefix_caching:
            return
        full = request.num_computed // self.block_size
        if full > request.num_cached_blocks:
            hashes = request.block_hashes(full, self.block_size)
            for i in range(request.num_cached_blocks, full):
                self.pool.cache(request.blocks[i], hashes[i])
            request.num_cached_blocks = full

    def _publish(self) -> None:
        metrics = self.metrics
        metrics.running = len(self.running)
        metrics.waiting = len(self.waiting)
        metrics.kv_cache_usage = self.pool.usage()

    # ------------------------------------------------------------------ death

    def die(self) -> None:
        """EngineDeadError: every request in the engine fails with vLLM's 500, then the server winds down."""
        if self.dead:
            return
        self.dead = True
        print(OOM_LOG, file=sys.stderr, end="", flush=True)
        for request in [*self.running, *self.waiting]:
            request.done = True
            request.sink.fail(wire.ENGINE_DEAD)
        self.running.clear()
        self.waiting.clear()
        self._wake.set()
        self._on_death()


# ---------------------------------------------------------------------- the engine without time


class _TokenSteps:
    """A Sink that notes the step at which each of its request's tokens came."""

    __slots__ = ("steps", "token_steps")

    def __init__(self, steps: list[StepLoad]) -> None:
        self.steps = steps
        self.token_steps: list[int] = []

    def token(self, request: EngineRequest, last: bool) -> bool:
        self.token_steps.append(len(self.steps) - 1)
        return True

    def fail(self, error: wire.VllmError | None) -> None:
        raise AssertionError("a dry run injects no faults")


class DryRun(NamedTuple):
    """The steps the engine takes, and the step at which each request got each output token."""

    steps: list[StepLoad]
    token_steps: list[list[int]]


def _offline_engine(profile: EngineProfile, num_blocks: int) -> Engine:
    """An engine no server drives: no faults, no clients, the caller steps it."""
    return Engine(
        profile,
        num_blocks=num_blocks,
        metrics=EngineMetrics("offline"),
        faults=FaultPlan(),
        lag=LagStats(),
        output_ids=(0,),
        on_death=lambda: None,
    )


def dry_run(profile: EngineProfile, num_blocks: int, requests: Sequence[tuple[int, int]]) -> DryRun:
    """Schedule requests that all arrive together, each (prompt tokens, output tokens), until all
    are done: the same scheduler, KV cache and preemption as a served run, with steps counted
    instead of timed. A latency of the served run is a sum of step times, so it is linear in the
    step-cost model's parameters (what calibration fits). Prompts share no prefix."""
    steps: list[StepLoad] = []
    engine = _offline_engine(profile, num_blocks)
    sinks = []
    for i, (prompt, output) in enumerate(requests):
        sinks.append(_TokenSteps(steps))
        engine.add(EngineRequest([i + 1] * prompt, output, sinks[-1], 0.0))
    while engine.running or engine.waiting:
        scheduled = engine._schedule(len(steps))
        if not scheduled:
            raise ValueError(f"the engine cannot schedule these requests: {list(requests)[:4]}...")
        steps.append(step_load(scheduled))
        engine._complete(scheduled, len(steps))
    return DryRun(steps, [sink.token_steps for sink in sinks])


class ApiServer:
    """vLLM's API server in front of the engine: each request takes `api_server_ms` of its CPU, one after
    another (tokenizing, validating, handing over), then `frontend_ms` more before the engine sees it.
    The serial part is what caps a server's rate of short requests."""

    __slots__ = ("busy_until", "frontend_s", "serial_s")

    def __init__(self, timing: Timing) -> None:
        self.serial_s, self.frontend_s = timing.api_server_ms / 1000, timing.frontend_ms / 1000
        self.busy_until = 0.0

    def admit(self, sent_s: float) -> float:
        """When a request sent at `sent_s` reaches the engine (s, the same clock)."""
        self.busy_until = max(sent_s, self.busy_until) + self.serial_s
        return self.busy_until + self.frontend_s


class Arrival(NamedTuple):
    """A request of a virtual-time replay: when it is ready to be sent (s), its prompt's token ids, its output."""

    at_s: float
    prompt_ids: Sequence[int]
    output_tokens: int


class _TokenTimes:
    """A Sink that notes when each of its request's tokens came, and counts the requests it saw end."""

    __slots__ = ("finished", "times")

    def __init__(self, finished: list[int]) -> None:
        self.times: list[float] = []
        self.finished = finished

    def token(self, request: EngineRequest, last: bool) -> bool:
        self.times.append(request.last_token_at)
        if last:
            self.finished[0] += 1
        return True

    def fail(self, error: wire.VllmError | None) -> None:
        raise AssertionError("a replay injects no faults")


class Replay(NamedTuple):
    """What a served run of the arrivals would show on an idle machine."""

    sent_s: list[float]
    """Per arrival (in the order given), when it was sent: its `at_s`, or later when every slot was taken."""
    token_times: list[list[float]]
    """Per arrival (in the order given), the time of each output token, in seconds."""
    preemptions: int
    mean_running: float
    """Requests running, averaged over the time the engine was busy."""


def replay(
    profile: EngineProfile, num_blocks: int, arrivals: Sequence[Arrival], max_concurrency: int | None = None
) -> Replay:
    """The arrivals through the API server and the engine on a virtual clock, as in a served run, but
    with no event loop and no sleeping, so a minute of load replays in well under a second. An arrival
    is sent at its `at_s`, or, with `max_concurrency`, once fewer than that many are in flight (as
    `vllm bench serve --max-concurrency` does); each goes through the API server (`ApiServer`) and the
    engine's steps take what the profile's step model gives. What `llmload predict` and the
    calibration's steady-load point run."""
    engine = _offline_engine(profile, num_blocks)
    timing = profile.step_timing
    api = ApiServer(timing)
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].at_s)
    cap = max_concurrency or len(arrivals)
    finished = [0]
    sinks = [_TokenTimes(finished) for _ in arrivals]
    sent_s = [0.0] * len(arrivals)
    entering: list[tuple[float, int]] = []  # (when it reaches the engine, index), a heap
    clock = busy = running_time = 0.0
    sent = 0
    while sent < len(order) or entering or engine.running or engine.waiting:
        while sent < len(order) and sent - finished[0] < cap and arrivals[order[sent]].at_s <= clock:
            i = order[sent]
            sent_s[i] = max(clock, arrivals[i].at_s)
            heapq.heappush(entering, (api.admit(sent_s[i]), i))
            sent += 1
        while entering and entering[0][0] <= clock:
            i = heapq.heappop(entering)[1]
            engine.add(EngineRequest(arrivals[i].prompt_ids, arrivals[i].output_tokens, sinks[i], sent_s[i]))
        if not engine.running and not engine.waiting:
            ready = [entering[0][0]] if entering else []
            if sent < len(order) and sent - finished[0] < cap:
                ready.append(arrivals[order[sent]].at_s)
            clock = max(clock, min(ready))
            continue
        scheduled = engine._schedule(clock)
        if not scheduled:
            raise ValueError("the engine cannot schedule the waiting requests: a prompt longer than the KV cache")
        step = timing.step_s(*step_load(scheduled))
        running_time += len(engine.running) * step
        busy += step
        clock += step
        engine._complete(scheduled, clock)
    return Replay(
        sent_s, [sink.times for sink in sinks], engine.metrics.preemptions, running_time / busy if busy else 0.0
    )
