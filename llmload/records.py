"""The request record: built (pure functions on the typed model), appended to requests.jsonl as the
run goes, and converted to requests.parquet, the columnar copy every reader uses (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
import typing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llmload.client import StreamResult
from llmload.failures import refine_with_health
from llmload.models import RequestRecord
from llmload.observe.observer import ServerSample
from llmload.schedule import RunClock
from llmload.stats.sketch import Histograms

# what reports, gates and the verdict read of each record; ITL gaps are streamed apart (gap_batches)
FRAME_COLUMNS = (
    "worker", "stage", "status", "turn", "scheduled_at", "sent_at", "finished_at", "schedule_delay_ms", "ttft_ms",
    "ttfo_ms", "e2e_ms", "tpot_ms", "prompt_tokens", "output_tokens", "cached_tokens", "usage_from_server",
    "reasoning_tokens", "reasoning_tokens_counted",
    "requested_output_tokens", "output_tokens_forced", "model", "host", "error_category", "error_message",
)  # fmt: skip
# a failure as the report tells it: its category and the server's state the run recorded with it
FAILURE_COLUMNS = ("error_category", "server_health", "server_kv_cache_usage", "server_waiting")
_BLOCK_BYTES = 16 << 20  # JSONL read per batch: ~10k records, one Parquet row group
_PARALLEL_BYTES = 256 << 20  # a smaller log is parsed in a few seconds: not worth starting processes
_GAP_BATCH_ROWS = 16_384  # records whose gaps are read at once: ~3M gaps, ~40 MB with their buckets
_ARROW_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


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


def read_records(path: Path) -> pd.DataFrame:
    """All records of a run as a DataFrame, ITL lists included (small runs: tests, benchmarks; reports
    use RunRecords); a torn last line (the writer killed mid-write) is skipped."""
    rows = []
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                if handle.read(1):
                    raise ValueError(f"{path}:{number}: not a JSON record") from None
    columns = list(RequestRecord.model_fields)
    return pd.DataFrame(rows, columns=columns)


def _arrow_type(annotation: object) -> pa.DataType:
    """A RequestRecord field's column type: optional scalars are nullable, Literals are strings."""
    if typing.get_origin(annotation) is list:
        return pa.list_(pa.float32())
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return pa.string() if typing.get_origin(annotation) is typing.Literal else _ARROW_TYPES[annotation]  # type: ignore[index]


SCHEMA = pa.schema([(name, _arrow_type(field.annotation)) for name, field in RequestRecord.model_fields.items()])
# JSON numbers arrive as Python floats: building float64 lists and casting once is twice as fast
_PARSE_SCHEMA = pa.schema([f.with_type(pa.list_(pa.float64())) if f.name == "itl_ms" else f for f in SCHEMA])


def _blocks(path: Path) -> Iterator[tuple[list[bytes], int]]:
    """requests.jsonl a block of lines at a time, with the number of its first line."""
    number = 1
    with path.open("rb") as handle:
        while lines := handle.readlines(_BLOCK_BYTES):
            yield lines, number
            number += len(lines)


def _parse(lines: list[bytes], number: int, path: Path) -> pa.RecordBatch:
    """One block of JSONL lines as a record batch; only the file's last line may be torn (no newline)."""
    rows = []
    for offset, line in enumerate(lines):
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            if line.strip() and line.endswith(b"\n"):
                raise ValueError(f"{path}:{number + offset}: not a JSON record") from None
    return pa.RecordBatch.from_pylist(rows, schema=_PARSE_SCHEMA).cast(SCHEMA)


def _gevent_patched() -> bool:
    """Inside Locust: gevent-patched threads do not mix with a process pool's."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def _workers(size: int) -> int:
    """Processes that parse a big log (parsing is ~90% of the conversion), one per core."""
    return 0 if size < _PARALLEL_BYTES else min(len(os.sched_getaffinity(0)), 4)


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The log's record batches in order, never more than a few blocks of dicts in memory at once."""
    workers = _workers(path.stat().st_size)
    if not workers:
        yield from (_parse(lines, number, path) for lines, number in _blocks(path))
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        pending: deque[Future[pa.RecordBatch]] = deque()
        for lines, number in _blocks(path):
            pending.append(pool.submit(_parse, lines, number, path))
            if len(pending) > 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def parquet_records(jsonl: Path, parquet: Path) -> Path:
    """`parquet`, (re)written from the record log `jsonl` when missing or older than it: the JSONL
    stays the crash-safe log, the Parquet is what every reader uses. A big log met inside Locust is
    converted by a child process, which can use every core (Locust's own process cannot)."""
    if parquet.is_file() and parquet.stat().st_mtime_ns >= jsonl.stat().st_mtime_ns:
        return parquet
    if _gevent_patched() and jsonl.stat().st_size >= _PARALLEL_BYTES:
        code = "import sys, pathlib, llmload.records as r; r.write_parquet(*map(pathlib.Path, sys.argv[1:]))"
        child = subprocess.run(
            [sys.executable, "-c", code, jsonl, parquet], capture_output=True, text=True, check=False
        )
        if child.returncode:
            last = (child.stderr.strip().splitlines() or ["the conversion failed"])[-1]
            raise ValueError(last.removeprefix("ValueError: "))
        return parquet
    write_parquet(jsonl, parquet)
    return parquet


def write_parquet(jsonl: Path, parquet: Path) -> None:
    """Convert the record log, through a partial file: a reader never meets half a Parquet."""
    partial = parquet.with_name(f".{parquet.name}.partial")
    strings = [f.name for f in SCHEMA if f.type == pa.string()]
    # gaps byte-stream-split: half the decoding time of dictionaries, for 40% more bytes
    encoding = {"itl_ms.list.element": "BYTE_STREAM_SPLIT"}
    with pq.ParquetWriter(
        partial, SCHEMA, use_dictionary=strings, column_encoding=encoding, compression="lz4"
    ) as writer:
        for batch in _batches(jsonl):
            writer.write_batch(batch)
    partial.replace(parquet)


def read_frame(parquet: Path) -> pd.DataFrame:
    """FRAME_COLUMNS of every record (no ITL lists): ~100 bytes a record. Read a column at a time,
    so the Arrow buffers in memory are one column's, not the table's (1 GB less at 10M records);
    stage and status as categories (a byte a row, not ~14)."""
    file = pq.ParquetFile(parquet, read_dictionary=["stage", "status", "model", "host"], pre_buffer=False)
    columns = {}
    written = set(file.schema_arrow.names)
    for name in FRAME_COLUMNS:
        if name not in written:  # a file of an earlier llmload: the field's default (null)
            columns[name] = pd.Series([None] * file.metadata.num_rows, dtype=object)
            continue
        column = file.read(columns=[name]).column(0)
        columns[name] = (column.cast(pa.int32()) if name == "turn" else column).to_pandas()
    return pd.DataFrame(columns, copy=False)


def gap_batches(parquet: Path, selected: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The ITL gaps of the `selected` records (a mask over all), one row group at a time: their row
    numbers, their gap counts and the gaps (float32, in row order)."""
    start = 0
    # pre-buffering keeps every row group read so far: 8 GB for 10M records
    for batch in pq.ParquetFile(parquet, pre_buffer=False).iter_batches(batch_size=_GAP_BATCH_ROWS, columns=["itl_ms"]):
        column = batch.column(0)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy()
        gaps = column.flatten().to_numpy()
        keep = selected[start : start + len(lengths)]
        rows = np.flatnonzero(keep)
        yield rows + start, lengths[rows], gaps if rows.size == keep.size else gaps[np.repeat(keep, lengths)]
        start += len(lengths)


@dataclass(frozen=True)
class RunRecords:
    """A run's records as reports read them: FRAME_COLUMNS in memory, ITL gaps streamed."""

    parquet: Path
    frame: pd.DataFrame

    @classmethod
    def load(cls, jsonl: Path, parquet: Path) -> RunRecords:
        parquet = parquet_records(jsonl, parquet)
        return cls(parquet, read_frame(parquet))

    def failures(self) -> pd.DataFrame:
        """FAILURE_COLUMNS of the failed and unfinished records only (a run may hold millions of the others)."""
        judged = [("status", "in", ["failed", "unfinished"])]
        table = pq.read_table(self.parquet, columns=list(FAILURE_COLUMNS), filters=judged)
        return table.to_pandas()

    def session_ids(self) -> pd.Series:
        """Each record's session id, as a category (read apart from the frame: few readers need it)."""
        file = pq.ParquetFile(self.parquet, read_dictionary=["session_id"], pre_buffer=False)
        return file.read(columns=["session_id"]).column(0).to_pandas()

    def itl(self, selected: np.ndarray, groups: np.ndarray, count: int) -> Histograms:
        """Histograms of the gaps of the selected records, each in its record's group (a time window,
        a bootstrap block). A row group spans few groups: one pass over its gaps each."""
        histograms = Histograms(count)
        for rows, lengths, gaps in gap_batches(self.parquet, selected):
            owner = groups[rows]
            for group in np.unique(owner).tolist():
                mine = owner == group
                histograms.add(gaps if mine.all() else gaps[np.repeat(mine, lengths)], group)
        return histograms

    def itl_per_request(self, selected: np.ndarray, percentile: float | None) -> np.ndarray:
        """Each selected record's statistic of its own gaps: the linear `percentile` (as numpy's), or
        the max when None; NaN for other records and those without gaps. One row group at a time,
        so no record's gap list is ever a Python object."""
        out = np.full(len(selected), np.nan)
        for batch_rows, batch_lengths, gaps in gap_batches(self.parquet, selected):
            has = batch_lengths > 0
            rows, lengths = batch_rows[has], batch_lengths[has]
            if not rows.size:
                continue
            starts = np.cumsum(lengths) - lengths
            if percentile is None:
                out[rows] = np.maximum.reduceat(gaps, starts)
                continue
            owner = np.repeat(np.arange(rows.size), lengths)
            ordered = gaps[np.lexsort((gaps, owner))].astype(float)  # each record's gaps, ascending
            position = percentile / 100 * (lengths - 1)
            low = np.floor(position).astype(np.int64)
            high = np.minimum(low + 1, lengths - 1)
            below, above = ordered[starts + low], ordered[starts + high]
            out[rows] = below + (position - low) * (above - below)
        return out
