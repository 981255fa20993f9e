"""requests.jsonl's contract: one record per scheduled request, whatever became of it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# --------------------------------------------------------------------------- run records

RequestStatus = Literal["ok", "failed", "unfinished", "cancelled", "abandoned", "not_sent", "lost"]
"""`unfinished`: still running when the drain after the plan ended: the target did not keep up, judged as a
failure. `cancelled`: cut by the operator (Ctrl-C, SIGTERM, -t); like `not_sent`, never judged. `lost`: a
distributed run's worker died with it, in flight (sent, its outcome unknown) or due and never sent (llmload.fleet);
never judged against the target, and the achieved-rate check fails the hold that lost any."""
ANSWERED_STATUSES: tuple[str, ...] = ("ok", "failed", "unfinished")
"""The statuses the target is judged on: every request it was sent and the run waited for."""

FailureCategory = Literal[
    "context_length",
    "model_not_found",
    "oom",
    "engine_dead",
    "server_down",
    "tls",
    "stream_error",
    "incomplete",
    "malformed",
    "timeout",
    "rate_limited",
    "http_4xx",
    "http_5xx",
    "unfinished",
    "cancelled",
    "abandoned",
    "worker_lost",
]
FAILURE_CATEGORIES: tuple[str, ...] = FailureCategory.__args__  # type: ignore[attr-defined]
OOM_FAMILY: frozenset[str] = frozenset({"oom", "engine_dead", "server_down"})


class RequestRecord(BaseModel):
    """One line of requests.jsonl: one scheduled request, whatever became of it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    worker: int
    stage: str
    session_id: str
    turn: int
    scheduled_at: float
    sent_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    schedule_delay_ms: float | None = None
    ttft_ms: float | None = None
    ttfo_ms: float | None = Field(
        default=None, description="time to the first answer chunk after any reasoning: the TTFT without reasoning"
    )
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = Field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    usage_from_server: bool = False
    reasoning_tokens: int | None = Field(default=None, description="of output_tokens, those thought before answering")
    answer_tokens: int | None = Field(default=None, description="output_tokens - reasoning_tokens")
    reasoning_tokens_counted: bool = Field(
        default=False, description="reasoning_tokens counted from the reasoning chunks, not told by the server's usage"
    )
    requested_output_tokens: int | None = Field(default=None, description="the workload's exact output length")
    output_tokens_forced: bool = Field(
        default=False, description="the request asked the server for exactly that length in a way it honours"
    )
    status: RequestStatus
    model: str | None = Field(default=None, description="the model or LoRA adapter it asked for")
    host: str | None = Field(default=None, description="the replica it was sent to (a run over several; None: one)")
    error_category: FailureCategory | None = None
    http_status: int | None = Field(default=None, description="the response's HTTP status, as its status line said")
    stream_error_code: int | None = Field(
        default=None, description="the code of an error object inside a 200 stream (http_status stays 200)"
    )
    error_message: str | None = None
    # the server's state when a request failed: /health right after, last scraped metrics
    server_health: int | None = None
    server_kv_cache_usage: float | None = None
    server_waiting: float | None = None
