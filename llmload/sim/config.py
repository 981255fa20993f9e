"""Configuration of the simulator: one strict model, so a misspelt option fails at startup."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from llmload.models import Strict

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


class SimConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535, description="0 picks a free port")
    model_name: str = Field(default="llmload-sim", min_length=1)
    max_model_len: PositiveInt = 4096
    ttft_ms: NonNegativeFloat = Field(default=20.0, description="base time to first token")
    prefill_tokens_per_s: NonNegativeFloat = Field(
        default=0.0, description="adds prompt_tokens / this to the TTFT; 0 = off"
    )
    itl_ms: NonNegativeFloat = Field(default=5.0, description="time between output tokens")
    default_max_tokens: PositiveInt = Field(default=64, description="output length when the request gives none")
    faults: tuple[FaultSpec, ...] = ()
    stall_s: NonNegativeFloat = Field(default=3600.0, description="how long a `stall` fault stays silent")
    seed: int = Field(default=0, description="seeds the per-request fault draws")
    concurrency_limit: NonNegativeInt = Field(
        default=0, description="requests in flight above this get vLLM's 503 busy error; 0 = unlimited"
    )
    enable_prompt_tokens_details: bool = Field(
        default=False, description="like vLLM's flag: usage carries prompt_tokens_details.cached_tokens"
    )

    @model_validator(mode="after")
    def _faults_are_one_draw(self) -> SimConfig:
        # One uniform draw per request picks at most one fault, so the probabilities share [0, 1].
        kinds = [f.kind for f in self.faults]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each fault kind may be given once, got {kinds}")
        total = sum(f.probability for f in self.faults)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities add up to {total:g}, more than 1")
        return self

    def ttft_s(self, prompt_tokens: int) -> float:
        prefill = prompt_tokens / self.prefill_tokens_per_s if self.prefill_tokens_per_s else 0.0
        return self.ttft_ms / 1000.0 + prefill

    @property
    def itl_s(self) -> float:
        return self.itl_ms / 1000.0
