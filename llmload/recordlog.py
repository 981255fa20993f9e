"""The request record as a run writes it: built (pure functions on the typed model) and appended to
requests.jsonl as the run goes. Apart from llmload.records, which reads the log back (pandas, Arrow):
every Locust process writes records, and only the one that finishes a run reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson

from llmload.client import StreamResult
from llmload.failures import refine_with_health
from llmload.models import RequestRecord
from llmload.observe.observer import ServerSample
from llmload.schedule import RunClock


def request_record(
    *,
    run_id: str,
    worker: int,
    stage: str,
    session_id: str,
    turn: int,
    scheduled: float,
    result: StreamResult | None,
    clock: RunClock,
) -> RequestRecord:
    """The record of one scheduled request (times on the perf clock): `not_sent` without a result,
    `unfinished` when the drain ended first, `cancelled` when the operator stopped the run, else `ok` or
    `failed` with its category."""
    record = RequestRecord(
        run_id=run_id,
        worker=worker,
        stage=stage,
        session_id=session_id,
        turn=turn,
        scheduled_at=clock.wall(scheduled),
        status="not_sent",
    )
    if result is None:
        return record
    first, times = result.first_token_at, result.token_times
    output_tokens = result.completion_tokens if result.completion_tokens is not None else len(times)
    tpot = None
    if first is not None and output_tokens > 1:
        tpot = (times[-1] - first) * 1000 / (output_tokens - 1)
    reasoning_tokens, counted = reasoning_count(result)
    answered_at = result.first_answer_at
    category = result.error_category
    status = (
        "ok" if category is None else category if category in ("unfinished", "cancelled", "abandoned") else "failed"
    )
    return record.model_copy(
        update={
            "sent_at": clock.wall(result.sent_at),
            "first_token_at": clock.wall(first) if first is not None else None,
            "finished_at": clock.wall(result.finished_at),
            "schedule_delay_ms": max(0.0, (result.sent_at - scheduled) * 1000),
            "ttft_ms": (first - result.sent_at) * 1000 if first is not None else None,
            "ttfo_ms": (answered_at - result.sent_at) * 1000 if answered_at is not None else None,
            "e2e_ms": (result.finished_at - result.sent_at) * 1000,
            "tpot_ms": tpot,
            "itl_ms": np.round(np.diff(times) * 1000, 3).tolist() if len(times) > 1 else [],
            "prompt_tokens": result.prompt_tokens,
            "output_tokens": output_tokens,
            "cached_tokens": result.cached_tokens,
            "usage_from_server": result.completion_tokens is not None,
            "reasoning_tokens": reasoning_tokens,
            "answer_tokens": max(output_tokens - reasoning_tokens, 0),
            "reasoning_tokens_counted": counted,
            "status": status,
            "error_category": result.error_category,
            "http_status": result.http_status,
            "stream_error_code": result.stream_error_code,
            "error_message": result.error_message,
        }
    )


def lost_record(
    *,
    run_id: str,
    worker: int,
    stage: str,
    session_id: str,
    turn: int,
    scheduled_at: float,
    sent_at: float | None,
    reason: str,
) -> RequestRecord:
    """A request a distributed run's worker took with it when it died (llmload.fleet): in flight (sent,
    its outcome unknown) or due and never sent. Written by the master, times in unix seconds."""
    delay = None if sent_at is None else max(0.0, (sent_at - scheduled_at) * 1000)
    return RequestRecord(
        run_id=run_id, worker=worker, stage=stage, session_id=session_id, turn=turn, scheduled_at=scheduled_at,
        sent_at=sent_at, schedule_delay_ms=delay, status="lost", error_category="worker_lost", error_message=reason,
    )  # fmt: skip


def reasoning_count(result: StreamResult) -> tuple[int, bool]:
    """(reasoning tokens, counted from the chunks): the server's usage where it tells a count, else
    one per reasoning chunk. A server that says 0 after streaming reasoning is not believed: vLLM
    0.32 counts only the tokens after a generated `<think>`, so a model whose chat template puts
    `<think>` in the prompt (DeepSeek R1) reports 0 (vllm/reasoning/basic_parsers.py)."""
    told = result.reasoning_tokens
    if told is not None and (told > 0 or result.reasoning_chunks == 0):
        return told, False
    return result.reasoning_chunks, True


def with_health(record: RequestRecord, health: int | None) -> RequestRecord:
    """A transport-level failure told apart by what /health answered right after: a dead engine, a
    server gone, or neither."""
    assert record.error_category is not None and record.error_message is not None
    category, message = refine_with_health(record.error_category, record.error_message, health)
    return record.model_copy(update={"error_category": category, "error_message": message, "server_health": health})


def with_server_state(record: RequestRecord, sample: ServerSample | None) -> RequestRecord:
    """A failure with the server's state when it happened (the last scrape before it): in a run over several
    replicas, the state of the replica it was sent to, whose health and queue explain it."""
    if record.status not in ("failed", "unfinished") or sample is None:
        return record
    state = next((r for r in sample.replicas if r.host == record.host), sample)
    update: dict[str, object] = {"server_kv_cache_usage": state.kv_cache_usage, "server_waiting": state.waiting}
    if record.server_health is None:
        update["server_health"] = state.health
    return record.model_copy(update=update)


class RecordWriter:
    """Append-only, flushed per batch: a crash loses at most the requests still in flight."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("ab")
        self.count = 0

    def write(self, records: Iterable[RequestRecord | dict[str, object]]) -> None:
        """Records, or rows already dumped from them (RequestRecord.model_dump())."""
        lines = [
            orjson.dumps(r.model_dump() if isinstance(r, RequestRecord) else r, option=orjson.OPT_APPEND_NEWLINE)
            for r in records
        ]
        if lines:
            self._file.write(b"".join(lines))
            self._file.flush()
            self.count += len(lines)

    def close(self) -> None:
        self._file.close()
