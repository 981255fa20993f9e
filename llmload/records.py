"""requests.jsonl: one line per scheduled request, appended and flushed as the run goes."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson
import pandas as pd

from llmload.models import RequestRecord

RECORDS_FILE = "requests.jsonl"


class RecordWriter:
    """Append-only, flushed per batch: a crash loses at most the requests still in flight."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("ab")
        self.count = 0

    def write(self, records: Iterable[RequestRecord | dict[str, object]]) -> None:
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
    """All records of a run as a DataFrame; a torn last line (the writer killed mid-write) is skipped."""
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
