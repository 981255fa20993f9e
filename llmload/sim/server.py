"""The simulator's HTTP server: vLLM's OpenAI-compatible endpoints, paced or engine-driven, with faults.

Request handling follows vLLM 0.32's order of checks (media type, JSON and schema, model name,
admission, output cap, prompt length, sampling limits) so each error is the one vLLM would give.
Without a profile every response is paced by fixed deadlines (pacing.py); with `--profile` the
engine (engine.py) decides when each token exists and writes it from its step.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import ssl
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from llmload.capacity.plan import CapacityReport
from llmload.errors import InputError
from llmload.sim import wire
from llmload.sim.config import SimConfig
from llmload.sim.engine import ApiServer, Engine, EngineRequest
from llmload.sim.faults import NO_STRIKE, FaultPicker, Strike
from llmload.sim.metrics import EngineMetrics
from llmload.sim.pacing import LagStats, Pacer, Schedule
from llmload.sim.profiles import EngineProfile
from llmload.sim.protocol import (
    MAX_CHARS_PER_TOKEN,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    PromptTokenizer,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    render_chatml,
)

# The simulator never samples an end-of-sequence token: every completion runs to its cap.
FINISH_REASON = "length"
Parsed = TypeVar("Parsed", bound=BaseModel)
SIM: web.AppKey[SimServer] = web.AppKey("sim")
GenerationRequest = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class Job:
    """One admitted generation request: what to generate, from when, and what its fault does to it."""

    request_id: str
    t0: float
    prompt_ids: list[int]
    output_tokens: int
    include_usage: bool
    reasoning_tokens: int | None  # reasoning mode: this many of the first output tokens are thought
    strike: Strike
    chat: bool

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class StreamSink:
    """An engine request's SSE stream: each token written to the transport from the engine's step."""

    __slots__ = ("_abort", "_done", "_encoder", "_strike", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        encoder: wire.ChunkEncoder,
        done: asyncio.Future[Any],
        strike: Strike,
        *,
        abort: bool = True,
    ) -> None:
        self._transport = transport
        self._encoder = encoder
        self._done = done
        self._strike = strike
        self._abort = abort  # False: a client gone away is generated for all the same (SimConfig.abort_on_disconnect)

    def token(self, request: EngineRequest, last: bool) -> bool:
        transport = self._transport
        if transport.is_closing() or self._done.done():
            return not self._abort
        k = request.output - 1
        encoder = self._encoder
        if last:
            usage = encoder.usage(request.num_prompt, request.output, request.cached_tokens)
            strike = self._strike
            finished = encoder.last_token(k, FINISH_REASON) if strike.finish else encoder.token(k)
            data = finished + strike.ending(usage)
        else:
            data = encoder.token(k)
        transport.write(wire.http_chunk(encoder.role() + data if k == 0 else data))
        if last:
            self._done.set_result(None)
        return True

    def fail(self, error: wire.VllmError | None) -> None:
        if self._done.done():
            return
        if self._strike.event:
            self._transport.write(wire.http_chunk(self._strike.event))  # and the response ends cleanly
        elif error is None:
            self._transport.abort()
        elif not self._transport.is_closing():
            self._transport.write(wire.http_chunk(error.sse_event() + wire.DONE))
        self._done.set_result(None)


class ResponseSink:
    """A non-streaming engine request: resolves with the finished request, or the error it ended with."""

    __slots__ = ("_done",)

    def __init__(self, done: asyncio.Future[Any]) -> None:
        self._done = done

    def token(self, request: EngineRequest, last: bool) -> bool:
        if last and not self._done.done():
            self._done.set_result(request)
        return True  # a client that goes away cancels the handler, which aborts the request

    def fail(self, error: wire.VllmError | None) -> None:
        if not self._done.done():
            self._done.set_result(error)


def cache_config_labels(profile: EngineProfile, plan: CapacityReport) -> dict[str, str]:
    """vLLM's `vllm:cache_config_info` labels that say how big the KV cache is (a subset of vLLM's)."""
    vllm = profile.serving.resolved()
    return {
        "block_size": str(plan.layout.block_size),
        "cache_dtype": vllm.kv_cache_dtype,
        "enable_prefix_caching": str(vllm.enable_prefix_caching),
        "engine": "0",
        "gpu_memory_utilization": str(vllm.gpu_memory_utilization),
        "kv_cache_max_concurrency": str(plan.at_max_model_len.max_concurrency),
        "kv_cache_memory_bytes": str(profile.serving.kv_cache_memory_bytes),
        "kv_cache_size_tokens": str(plan.vllm_log_kv_cache_tokens),
        "num_gpu_blocks": str(plan.cache.num_blocks),
    }


class SimServer:
    """State shared by the handlers: config, engine, fault draws, counters and the emission-lag histogram."""

    def __init__(self, config: SimConfig, engine_plan: tuple[EngineProfile, CapacityReport] | None = None) -> None:
        self.config = config
        profile = engine_plan[0] if engine_plan else None
        self.max_model_len = profile.max_model_len if profile else config.paced_max_model_len
        self.fingerprint = wire.system_fingerprint(config.model_name, self.max_model_len)
        self.tokenizer = PromptTokenizer(config.tokenizer)
        self.lag = LagStats()
        self.metrics = EngineMetrics(config.model_name)
        if engine_plan:
            self.metrics.cache_config = cache_config_labels(*engine_plan)
        self._picker = FaultPicker(config.faults.faults, config.faults.seed)
        self._reasoning_rng = np.random.default_rng(config.faults.seed)
        self._started = time.monotonic()
        self.in_flight = 0
        self.dead = False
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self.sites: list[web.BaseSite] = []
        self.pacer: Pacer | None = None  # needs the serving loop: made on startup
        self.engine = (
            Engine(
                engine_plan[0],
                num_blocks=engine_plan[1].cache.num_blocks,
                metrics=self.metrics,
                faults=config.faults,
                lag=self.lag,
                output_ids=self.tokenizer.word_ids(wire.WORDS),
                on_death=self._on_engine_death,
            )
            if engine_plan
            else None
        )
        self.api_server = ApiServer(engine_plan[0].step_timing) if engine_plan else None
        self._engine_task: asyncio.Task[None] | None = None
        self.reset_counters()

    async def start(self, app: web.Application) -> None:
        self.pacer = Pacer(asyncio.get_running_loop(), self.lag)
        if self.engine is not None:
            self._engine_task = asyncio.create_task(self.engine.run(self.pacer))

    async def close(self, app: web.Application) -> None:
        if self._engine_task is not None:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
        if self.pacer is not None:
            self.pacer.close()

    def reset_counters(self) -> None:
        self.requests = 0
        self.completion_tokens = 0
        self.statuses: Counter[int] = Counter()
        self.faults: Counter[str] = Counter({f.kind: 0 for f in self.config.faults.faults})

    # ------------------------------------------------------------------ engine death (vLLM's watchdog)

    def _on_engine_death(self) -> None:
        """/health turns 503 now; the listener closes, then the process exits, on vLLM's timeline."""
        self.dead = True
        death = self.config.faults.engine_death
        assert death is not None
        loop = asyncio.get_running_loop()
        loop.call_later(death.stop_listening_s, lambda: asyncio.ensure_future(self._stop_listening()))
        loop.call_later(death.exit_s, self._exit, 1)

    async def _stop_listening(self) -> None:
        for site in self.sites:
            await site.stop()

    def _exit(self, code: int) -> None:
        self.exit_code = code
        self.stopped.set()

    # ------------------------------------------------------------------ small endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead else 200, headers=wire.BASE_HEADERS)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's POST /reset_prefix_cache (a development endpoint there, always offered here): `{"success": bool}`,
        false while requests hold blocks; fixed pacing caches nothing, so it always succeeds."""
        success = self.engine.pool.reset_prefix_cache() if self.engine is not None else True
        return web.Response(body=orjson.dumps({"success": success}), headers=wire.JSON_HEADERS)

    async def version(self, request: web.Request) -> web.Response:
        """vLLM's GET /version: the release whose wire the simulator speaks, marked as the simulator."""
        return web.Response(
            body=orjson.dumps({"version": f"{wire.VLLM_VERSION}+llmload-sim"}), headers=wire.JSON_HEADERS
        )

    async def models(self, request: web.Request) -> web.Response:
        root = self.engine.profile.model if self.engine is not None else None
        body = wire.model_list_body(self.config.model_name, self.max_model_len, root)
        return web.Response(body=body, headers=wire.JSON_HEADERS)

    async def prometheus(self, request: web.Request) -> web.Response:
        if self.engine is None:
            self.metrics.running = self.in_flight
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(self, request: web.Request) -> web.Response:
        """What benchmarks read: how late emissions left, and what was served."""
        body = {
            "uptime_s": time.monotonic() - self._started,
            "requests": self.requests,
            "in_flight": self.in_flight,
            "completion_tokens": self.completion_tokens,
            "responses_by_status": {str(k): v for k, v in sorted(self.statuses.items())},
            "faults": dict(self.faults),
            "emission_lag_ms": self.lag.snapshot(),
        }
        return web.Response(body=orjson.dumps(body), headers=wire.JSON_HEADERS)

    async def reset_stats(self, request: web.Request) -> web.Response:
        """Lets a benchmark discard its warm-up."""
        self.lag.reset()
        self.reset_counters()
        return web.Response(status=204)

    async def tokenize(self, request: web.Request) -> web.Response:
        """POST /tokenize: the completion form (`prompt`) or the chat form (`messages`)."""
        body = await request.read()
        is_chat = isinstance(data := _json_object(body), dict) and "messages" in data
        parsed = _parse(body, TokenizeChatRequest if is_chat else TokenizeCompletionRequest)
        error = self._request_error(request, parsed)
        if error is not None:
            return self._error(error)
        assert isinstance(parsed, TokenizeChatRequest | TokenizeCompletionRequest)
        if isinstance(parsed, TokenizeChatRequest):
            pieces = render_chatml(parsed.messages, generation_prompt=parsed.add_generation_prompt)
        else:
            pieces = [parsed.prompt]
        tokens = self.tokenizer.ids(pieces)
        strs = [self.tokenizer.tokenizer.decode([t]) for t in tokens] if parsed.return_token_strs else None
        return web.Response(body=wire.tokenize_body(tokens, self.max_model_len, strs), headers=wire.JSON_HEADERS)

    async def detokenize(self, request: web.Request) -> web.Response:
        parsed = _parse(await request.read(), DetokenizeRequest)
        error = self._request_error(request, parsed)
        if error is not None:
            return self._error(error)
        assert isinstance(parsed, DetokenizeRequest)
        try:
            text = self.tokenizer.tokenizer.decode(parsed.tokens)
        except (KeyError, ValueError, OverflowError) as exc:
            return self._error(wire.validation_error(f"Token id out of vocabulary: {exc}", param="tokens"))
        return web.Response(body=wire.detokenize_body(text), headers=wire.JSON_HEADERS)

    def _request_error(self, request: web.Request, parsed: BaseModel | wire.VllmError) -> wire.VllmError | None:
        """Media type, schema and model name, in vLLM's order."""
        if request.content_type != "application/json":
            return wire.UNSUPPORTED_MEDIA_TYPE
        if isinstance(parsed, wire.VllmError):
            return parsed
        model = getattr(parsed, "model", None)
        if model and model != self.config.model_name:
            return wire.model_not_found(model, self.config.model_name)
        return None

    # ------------------------------------------------------------------ generation

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self.requests += 1
        body = await request.read()
        t0 = time.monotonic()  # pacing and engine latencies are measured from here
        assert self.pacer is not None
        self.pacer.run_due()
        refused = self._refused(body)
        if refused is not None:
            self.statuses[400] += 1
            return web.Response(status=400, body=wire.unrecognized_argument(refused), headers=wire.JSON_HEADERS)
        parsed = _parse(body, ChatCompletionRequest if chat else CompletionRequest)
        error = self._request_error(request, parsed)
        if error is not None:
            return self._error(error)
        assert isinstance(parsed, ChatCompletionRequest | CompletionRequest)
        if self.dead:
            return self._error(wire.ENGINE_DEAD)
        config = self.config
        busy = config.concurrency_limit and self.in_flight >= config.concurrency_limit
        if busy or (self.engine is not None and self.engine.queue_full()):
            return self._error(wire.ENGINE_BUSY)
        checked = self._check_lengths(parsed)
        if isinstance(checked, wire.VllmError):
            return self._error(checked)
        self.pacer.run_due()
        fault = self._picker.draw()
        strike = NO_STRIKE
        if fault is not None:
            self.faults[fault.kind] += 1
            strike = fault.strike(stream=bool(parsed.stream), output_tokens=checked[1], stall_s=config.faults.stall_s)
        if strike.refusal is not None:
            return self._error(strike.refusal)
        if strike.page:
            self.statuses[200] += 1
            return web.Response(body=wire.HTML_PAGE, headers=wire.HTML_HEADERS)
        prefix = "chatcmpl-" if chat else "cmpl-"
        job = Job(
            request_id=prefix + (request.headers.get("X-Request-Id") or parsed.request_id or wire.random_hex()),
            t0=t0,
            prompt_ids=checked[0],
            output_tokens=checked[1],
            include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
            reasoning_tokens=self._reasoning_tokens(chat),
            strike=strike,
            chat=chat,
        )
        self.in_flight += 1
        try:
            if self.engine is not None and not strike.at_arrival:
                return await self._in_engine(request, job, self.engine, bool(parsed.stream))
            if parsed.stream:
                return await self._stream(request, job)
            return await self._complete(request, job)
        finally:
            self.in_flight -= 1

    def _refused(self, body: bytes) -> str | None:
        """The first field of `refuse_fields` the request carries (the simulator answering as OpenAI does)."""
        if not self.config.refuse_fields:
            return None
        try:
            fields = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return next((name for name in self.config.refuse_fields if isinstance(fields, dict) and name in fields), None)

    def _check_lengths(self, req: GenerationRequest) -> tuple[list[int], int] | wire.VllmError:
        """Prompt ids and output length, clamped to the context as vLLM's get_max_tokens() does."""
        max_len = self.max_model_len
        param, requested = req.output_limit()
        if requested is not None and requested > max_len:
            return wire.max_tokens_over_limit(param, requested, max_len)
        prompt = req.prompt_pieces()
        chars = sum(map(len, prompt))
        if chars > max_len * MAX_CHARS_PER_TOKEN:
            return wire.prompt_chars_error(max_len, chars, MAX_CHARS_PER_TOKEN)
        ids = self.tokenizer.ids(prompt)
        if len(ids) > max_len:
            return wire.context_length_error(max_len, len(ids))
        cap = requested if requested is not None else self.config.default_max_tokens
        n_output = min(max_len - len(ids), cap)
        if n_output < 1:
            return wire.max_tokens_below_one(n_output)
        if req.min_tokens < 0:
            return wire.validation_error(f"min_tokens must be greater than or equal to 0, got {req.min_tokens}.")
        if req.min_tokens > n_output:
            return wire.min_tokens_over_max(req.min_tokens, n_output)
        return ids, n_output

    def _reasoning_tokens(self, chat: bool) -> int | None:
        """This chat request's thought tokens, drawn in reasoning mode (text completions have no parser)."""
        spec = self.config.reasoning_tokens
        return max(0, round(float(spec.draw(self._reasoning_rng, 1)[0]))) if spec is not None and chat else None

    def _encoder(self, job: Job) -> wire.ChunkEncoder:
        return wire.ChunkEncoder(
            job.request_id,
            int(time.time()),
            self.config.model_name,
            self.fingerprint,
            include_usage=job.include_usage,
            usage_details=self.config.enable_prompt_tokens_details,
            choice=wire.CHAT if job.chat else wire.TEXT,
            reasoning_tokens=job.reasoning_tokens,
        )

    def _body(self, job: Job, cached_tokens: int = 0) -> bytes:
        return wire.completion_body(
            request_id=job.request_id,
            created=int(time.time()),
            model=self.config.model_name,
            fingerprint=self.fingerprint,
            prompt_tokens=job.prompt_tokens,
            completion_tokens=job.output_tokens,
            finish_reason=FINISH_REASON,
            usage_details=self.config.enable_prompt_tokens_details,
            cached_tokens=cached_tokens,
            chat=job.chat,
            reasoning_tokens=job.reasoning_tokens,
        )

    async def _in_engine(self, request: web.Request, job: Job, engine: Engine, stream: bool) -> web.StreamResponse:
        """Hand the request to the engine after the API server's own latency; its steps write the tokens."""
        assert self.pacer is not None and self.api_server is not None
        strike = job.strike
        ready = self.api_server.admit(job.t0) + (strike.pause_s if strike.pause_at == 0 else 0.0)
        await self.pacer.sleep_until(ready, record=False)
        if self.dead:
            return self._error(wire.ENGINE_DEAD)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        response: web.StreamResponse | None = None
        if stream:
            response = web.StreamResponse(headers=wire.SSE_HEADERS)
            response.enable_chunked_encoding()
            await response.prepare(request)
            assert request.transport is not None
            sink: StreamSink | ResponseSink = StreamSink(
                request.transport, self._encoder(job), done, strike, abort=self.config.abort_on_disconnect
            )
        else:
            sink = ResponseSink(done)
        entry = EngineRequest(job.prompt_ids, job.output_tokens, sink, job.t0)
        if strike.pause_at > 0:
            entry.pause_after, entry.stall_s = strike.pause_at - 1, strike.pause_s
        elif strike.end_at >= 0:
            entry.strike, entry.strike_error = strike.end_at, strike.error
        engine.add(entry)
        if stream:
            self.statuses[200] += 1
        try:
            outcome = await done
        finally:
            if self.config.abort_on_disconnect:
                engine.abort(entry)  # a no-op once it finished; frees its blocks if the client went away
        if response is not None:
            self.completion_tokens += entry.output
            return response
        if isinstance(outcome, wire.VllmError):
            return self._error(outcome)
        if outcome is None:  # a cut
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        self.completion_tokens += job.output_tokens
        self.statuses[200] += 1
        return web.Response(body=self._body(job, outcome.cached_tokens), headers=wire.JSON_HEADERS)

    # ------------------------------------------------------------------ fixed pacing (no profile)

    def _record_paced(self, job: Job) -> None:
        """The metrics an engine would have counted for a fully paced response."""
        metrics, config = self.metrics, self.config
        metrics.prompt_tokens += job.prompt_tokens
        metrics.generation_tokens += job.output_tokens
        metrics.success[FINISH_REASON] += 1
        ttft = config.ttft_s(job.prompt_tokens)
        metrics.ttft.observe(ttft)
        metrics.itl.observe(config.itl_s, job.output_tokens - 1)
        metrics.e2e.observe(ttft + (job.output_tokens - 1) * config.itl_s)
        self.completion_tokens += job.output_tokens

    async def _stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        schedule = self._schedule(job)
        self.statuses[200] += 1
        if job.strike.completes:
            self._record_paced(job)
        if schedule.all_due(time.monotonic()):
            # Saturation mode: headers, every event and the terminator in a single write.
            whole = web.Response(body=schedule.body(), headers=wire.SSE_HEADERS)
            whole.enable_chunked_encoding()
            return whole
        response = web.StreamResponse(headers=wire.SSE_HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)  # headers leave now, as uvicorn sends them
        assert request.transport is not None and self.pacer is not None
        await self.pacer.stream(request.transport, schedule)
        return response

    def _schedule(self, job: Job) -> Schedule:
        """One stream's emissions: role and first token at TTFT, a token per ITL, usage and [DONE]
        with the last; a fault's strike replaces token `end_at` with its tail (or a cut) and ends there."""
        config = self.config
        encoder = self._encoder(job)
        strike = job.strike
        start = job.t0 if strike.at_arrival else job.t0 + config.ttft_s(job.prompt_tokens)
        last = job.output_tokens - 1
        tail = strike.tail
        role = encoder.role()
        ending = strike.ending(encoder.usage(job.prompt_tokens, job.output_tokens))

        def payload(k: int) -> bytes:
            if k == strike.end_at:
                return tail
            if k == last:
                data = (encoder.last_token(k, FINISH_REASON) if strike.finish else encoder.token(k)) + ending
            else:
                data = encoder.token(k)
            return role + data if k == 0 else data

        return Schedule(
            start=start,
            interval=config.itl_s,
            count=strike.end_at + 1 if strike.end_at >= 0 else job.output_tokens,
            payload=payload,
            pause_at=strike.pause_at,
            pause_s=strike.pause_s,
            abort_after=strike.cut,
        )

    async def _complete(self, request: web.Request, job: Job) -> web.Response:
        """Non-streaming: the whole response when the last token would have been generated."""
        config = self.config
        strike = job.strike
        first = job.t0 + config.ttft_s(job.prompt_tokens)
        when = first + (job.output_tokens - 1) * config.itl_s
        if strike.pause_at >= 0:
            when += strike.pause_s
        elif strike.end_at >= 0:  # engine death or a cut, mid-generation
            when = first + strike.end_at * config.itl_s
        if when > time.monotonic():
            assert self.pacer is not None
            await self.pacer.sleep_until(when)
        if strike.cut:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if strike.error is not None:
            return self._error(strike.error)
        self._record_paced(job)
        self.statuses[200] += 1
        return web.Response(body=self._body(job), headers=wire.JSON_HEADERS)

    def _error(self, error: wire.VllmError) -> web.Response:
        self.statuses[error.status] += 1
        return web.Response(status=error.status, body=error.body(), headers=wire.JSON_HEADERS)


def _json_object(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _parse(body: bytes, model: type[Parsed]) -> Parsed | wire.VllmError:
    """JSON, then schema; errors worded as FastAPI and vLLM word them."""
    if not body:
        return wire.request_validation_error(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:  # the standard library's message and position are the ones FastAPI reports
            data = json.loads(body)
        except json.JSONDecodeError as e:
            return wire.request_validation_error(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", e.pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": e.msg},
                    }
                ]
            )
        except ValueError as e:  # not UTF-8
            return wire.request_validation_error([f"Invalid request body: {e}"])
    if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
        return wire.stream_options_without_stream()
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors: list[dict[str, Any]] = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        return wire.request_validation_error(errors)


def build_app(config: SimConfig, engine_plan: tuple[EngineProfile, CapacityReport] | None = None) -> web.Application:
    sim = SimServer(config, engine_plan)
    app = web.Application(middlewares=[_bearer_required(config.api_key)] if config.api_key else [])
    app[SIM] = sim
    app.router.add_get("/health", sim.health)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/version", sim.version)
    app.router.add_get("/metrics", sim.prometheus)
    app.router.add_post("/v1/chat/completions", sim.chat_completions)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/tokenize", sim.tokenize)
    app.router.add_post("/detokenize", sim.detokenize)
    app.router.add_post("/reset_prefix_cache", sim.reset_prefix_cache)
    app.router.add_get("/sim/stats", sim.stats)
    app.router.add_delete("/sim/stats", sim.reset_stats)
    app.on_startup.append(sim.start)
    app.on_cleanup.append(sim.close)
    return app


def _bearer_required(key: str) -> Any:
    """vLLM's --api-key: every /v1 route answers 401 `{"error": "Unauthorized"}` without the key."""
    expected = f"Bearer {key}"

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1") and request.headers.get("Authorization") != expected:
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    return check


def _tls_context(config: SimConfig) -> ssl.SSLContext | None:
    """HTTPS with --ssl-certfile; with --ssl-ca-certs a client certificate that CA signed is required."""
    if config.ssl_certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
        if config.ssl_ca_certs is not None:
            context.load_verify_locations(cafile=config.ssl_ca_certs)
            context.verify_mode = ssl.CERT_REQUIRED
    except (ssl.SSLError, OSError) as exc:
        raise InputError(f"--ssl-certfile / --ssl-keyfile / --ssl-ca-certs: {exc}") from None
    return context


def serve(config: SimConfig, engine_plan: tuple[EngineProfile, CapacityReport] | None = None) -> int:
    """Run until SIGINT/SIGTERM (0) or the engine's death (1); uvloop when installed (cheaper I/O per chunk)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve(config, engine_plan))
    return uvloop.run(_serve(config, engine_plan))


async def _serve(config: SimConfig, engine_plan: tuple[EngineProfile, CapacityReport] | None) -> int:
    # handler_cancellation: a client that disconnects cancels its handler and its timers.
    app = build_app(config, engine_plan)
    sim = app[SIM]
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    # Garbage collection stops every stream while it runs. What startup loaded (tokenizer, pydantic,
    # aiohttp: ~50k objects) never becomes garbage: freeze it out of every collection. Each stream's
    # objects live for its whole response, so they survive the youngest generation; collecting the
    # middle one after every second young collection keeps each pause a few hundred microseconds
    # (the default, every tenth, makes pauses of milliseconds at 500 streams), and full collections
    # wait for a thousand of those.
    gc.freeze()
    gc.set_threshold(700, 1, 1000)
    try:
        tls = _tls_context(config)
        site = web.TCPSite(runner, config.host, config.port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:  # the port is taken, or the address is not this machine's
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise InputError(
                f"cannot listen on {config.host}:{config.port} (--host, --port): {reason[:1].lower()}{reason[1:]}"
            ) from None
        sim.sites.append(site)
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"llmload sim listening on {'https' if tls else 'http'}://{shown}:{port}", flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # Windows
                loop.add_signal_handler(sig, sim.stopped.set)
        await sim.stopped.wait()
    finally:
        await runner.cleanup()
    return sim.exit_code
