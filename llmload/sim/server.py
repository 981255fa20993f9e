"""The simulator's HTTP server: vLLM's OpenAI-compatible endpoints, paced and with faults.

Request handling follows vLLM 0.32's order of checks (media type, JSON and schema, model name,
admission, output cap, prompt length, sampling limits) so each error is the one vLLM would give.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from llmload.sim import wire
from llmload.sim.config import SimConfig
from llmload.sim.faults import Fault, FaultPicker
from llmload.sim.pacing import LagStats, Pacer, Schedule
from llmload.sim.protocol import MAX_CHARS_PER_TOKEN, ChatCompletionRequest, count_tokens, render_chatml
from llmload.workload.tokens import get_tokenizer

# The simulator never samples an end-of-sequence token: every completion runs to its cap.
FINISH_REASON = "length"


@dataclass(frozen=True, slots=True)
class Job:
    """One admitted chat request: what to generate, from when, and the fault it drew."""

    request_id: str
    t0: float
    prompt_tokens: int
    output_tokens: int
    include_usage: bool
    fault: Fault | None

    @property
    def completes(self) -> bool:
        """Delivers all its tokens (a stall only delays them)."""
        return self.fault is None or self.fault.action == "stall"


class SimServer:
    """State shared by the handlers: config, fault draws, counters and the emission-lag histogram."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.fingerprint = wire.system_fingerprint(config.model_name, config.max_model_len)
        self.lag = LagStats()
        self._picker = FaultPicker(config.faults, config.seed)
        self._started = time.monotonic()
        self.in_flight = 0
        self.pacer: Pacer | None = None  # needs the serving loop: made on startup
        self.reset_counters()

    async def start(self, app: web.Application) -> None:
        self.pacer = Pacer(asyncio.get_running_loop(), self.lag)

    async def close(self, app: web.Application) -> None:
        if self.pacer is not None:
            self.pacer.close()

    def reset_counters(self) -> None:
        self.requests = 0
        self.completion_tokens = 0
        self.statuses: Counter[int] = Counter()
        self.faults: Counter[str] = Counter({f.kind: 0 for f in self.config.faults})

    # ------------------------------------------------------------------ small endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(headers=wire.BASE_HEADERS)

    async def models(self, request: web.Request) -> web.Response:
        body = wire.model_list_body(self.config.model_name, self.config.max_model_len)
        return web.Response(body=body, headers=wire.JSON_HEADERS)

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

    # ------------------------------------------------------------------ chat completions

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if request.content_type != "application/json":
            return self._error(wire.UNSUPPORTED_MEDIA_TYPE)
        body = await request.read()
        t0 = time.monotonic()  # pacing is measured from here
        parsed = _parse_request(body)
        if isinstance(parsed, wire.VllmError):
            return self._error(parsed)
        config = self.config
        if parsed.model and parsed.model != config.model_name:
            return self._error(wire.model_not_found(parsed.model, config.model_name))
        if config.concurrency_limit and self.in_flight >= config.concurrency_limit:
            return self._error(wire.ENGINE_BUSY)
        checked = self._check_lengths(parsed)
        if isinstance(checked, wire.VllmError):
            return self._error(checked)
        fault = self._picker.draw()
        if fault is not None:
            self.faults[fault.kind] += 1
            if fault.error is not None and fault.at_arrival and not (fault.in_stream and parsed.stream):
                return self._error(fault.error)
        job = Job(
            request_id="chatcmpl-" + (request.headers.get("X-Request-Id") or parsed.request_id or wire.random_hex()),
            t0=t0,
            prompt_tokens=checked[0],
            output_tokens=checked[1],
            include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
            fault=fault,
        )
        self.in_flight += 1
        try:
            if parsed.stream:
                return await self._stream(request, job)
            return await self._complete(request, job)
        finally:
            self.in_flight -= 1

    def _check_lengths(self, req: ChatCompletionRequest) -> tuple[int, int] | wire.VllmError:
        """Prompt and output lengths, clamped to the context as vLLM's get_max_tokens() does."""
        max_len = self.config.max_model_len
        param, requested = req.output_limit()
        if requested is not None and requested > max_len:
            return wire.max_tokens_over_limit(param, requested, max_len)
        prompt = render_chatml(req.messages)
        chars = sum(map(len, prompt))
        if chars > max_len * MAX_CHARS_PER_TOKEN:
            return wire.prompt_chars_error(max_len, chars, MAX_CHARS_PER_TOKEN)
        n_prompt = count_tokens(prompt)
        if n_prompt > max_len:
            return wire.context_length_error(max_len, n_prompt)
        cap = requested if requested is not None else self.config.default_max_tokens
        n_output = min(max_len - n_prompt, cap)
        if n_output < 1:
            return wire.max_tokens_below_one(n_output)
        if req.min_tokens < 0:
            return wire.validation_error(f"min_tokens must be greater than or equal to 0, got {req.min_tokens}.")
        if req.min_tokens > n_output:
            return wire.min_tokens_over_max(req.min_tokens, n_output)
        return n_prompt, n_output

    async def _stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        schedule = self._schedule(job)
        self.statuses[200] += 1
        if job.completes:
            self.completion_tokens += job.output_tokens
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
        with the last; a fault replaces token `strike` with its error (or a cut) and ends there."""
        config = self.config
        encoder = wire.ChunkEncoder(
            job.request_id,
            int(time.time()),
            config.model_name,
            self.fingerprint,
            include_usage=job.include_usage,
            usage_details=config.enable_prompt_tokens_details,
        )
        fault = job.fault
        start = job.t0 + config.ttft_s(job.prompt_tokens)
        last = job.output_tokens - 1
        strike, tail, pause_at = -1, b"", -1
        if fault is not None and fault.action == "stall":
            pause_at = fault.strike_index(job.output_tokens)
        elif fault is not None:
            strike = fault.strike_index(job.output_tokens)
            tail = fault.error.sse_event() + wire.DONE if fault.error else b""
            if fault.at_arrival:
                start = job.t0
        role = encoder.role()
        usage_and_done = encoder.usage(job.prompt_tokens, job.output_tokens) + wire.DONE

        def payload(k: int) -> bytes:
            if k == strike:
                return tail
            data = encoder.last_token(k, FINISH_REASON) + usage_and_done if k == last else encoder.token(k)
            return role + data if k == 0 else data

        return Schedule(
            start=start,
            interval=config.itl_s,
            count=strike + 1 if strike >= 0 else job.output_tokens,
            payload=payload,
            pause_at=pause_at,
            pause_s=config.stall_s,
            abort_after=fault is not None and fault.action == "cut",
        )

    async def _complete(self, request: web.Request, job: Job) -> web.Response:
        """Non-streaming: the whole response when the last token would have been generated."""
        config = self.config
        fault = job.fault
        first = job.t0 + config.ttft_s(job.prompt_tokens)
        when = first + (job.output_tokens - 1) * config.itl_s
        if fault is not None and fault.action == "stall":
            when += config.stall_s
        elif fault is not None:  # engine death or a cut, striking mid-generation
            when = first + fault.strike_index(job.output_tokens) * config.itl_s
        if when > time.monotonic():
            assert self.pacer is not None
            await self.pacer.sleep_until(when)
        if fault is not None and fault.action == "cut":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if fault is not None and fault.error is not None:
            return self._error(fault.error)
        self.completion_tokens += job.output_tokens
        self.statuses[200] += 1
        body = wire.completion_body(
            request_id=job.request_id,
            created=int(time.time()),
            model=config.model_name,
            fingerprint=self.fingerprint,
            prompt_tokens=job.prompt_tokens,
            completion_tokens=job.output_tokens,
            finish_reason=FINISH_REASON,
            usage_details=config.enable_prompt_tokens_details,
        )
        return web.Response(body=body, headers=wire.JSON_HEADERS)

    def _error(self, error: wire.VllmError) -> web.Response:
        self.statuses[error.status] += 1
        return web.Response(status=error.status, body=error.body(), headers=wire.JSON_HEADERS)


def _parse_request(body: bytes) -> ChatCompletionRequest | wire.VllmError:
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
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as e:
        errors: list[dict[str, Any]] = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        return wire.request_validation_error(errors)


def build_app(config: SimConfig) -> web.Application:
    get_tokenizer("cl100k_base")  # load before serving, not on the first request
    sim = SimServer(config)
    app = web.Application()
    app.router.add_get("/health", sim.health)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_post("/v1/chat/completions", sim.chat_completions)
    app.router.add_get("/sim/stats", sim.stats)
    app.router.add_delete("/sim/stats", sim.reset_stats)
    app.on_startup.append(sim.start)
    app.on_cleanup.append(sim.close)
    return app


def serve(config: SimConfig) -> None:
    """Run until SIGINT/SIGTERM; uvloop when installed (cheaper I/O per chunk)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(config))
    else:
        uvloop.run(_serve(config))


async def _serve(config: SimConfig) -> None:
    # handler_cancellation: a client that disconnects cancels its handler and its timers.
    runner = web.AppRunner(build_app(config), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port).start()
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"llmload sim listening on http://{shown}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # Windows
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
