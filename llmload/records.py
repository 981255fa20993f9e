"""The request records read back: requests.jsonl (written as the run goes, llmload.recordlog) converted to
requests.parquet, the columnar copy every reader uses (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
import typing
from collections import deque
from collections.abc import Iterator
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

from llmload.models import RequestRecord
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
