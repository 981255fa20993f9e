"""The run directory: its file names, writing its plan, and the one way to read a run back.

A run directory is what a run leaves and everything after it reads (report, verdict, compare,
search): run.json (the plan, `RunManifest`), requests.jsonl (the crash-safe record log) and its
columnar copy requests.parquet, server.jsonl (the server's metrics), and what the end of the run
writes from those: verdict.json, summary.json, report.md, report.html.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from pydantic import BaseModel, ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import RunManifest, Summary, Verdict
from llmload.workload.files import Workload, WorkloadError, load_workload
from llmload.workload.scale import scaled

if TYPE_CHECKING:  # pandas and Arrow: loaded by `load`, not by every Locust process that writes a run
    from llmload.observe.summary import ServerSamples
    from llmload.records import RunRecords

MANIFEST_FILE = "run.json"
RECORDS_FILE = "requests.jsonl"
PARQUET_FILE = "requests.parquet"
SERVER_FILE = "server.jsonl"
VERDICT_FILE = "verdict.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
HTML_FILE = "report.html"


def write_model(path: Path, model: BaseModel, *, indent: bool = False) -> None:
    """A model as JSON (run.json, verdict.json, summary.json)."""
    option = orjson.OPT_INDENT_2 if indent else 0
    path.write_bytes(orjson.dumps(model.model_dump(mode="json"), option=option))


def claim(run_dir: Path) -> None:
    """Refuse a directory that already holds a run: two runs' records in one log would make a
    report of neither, and overwriting would lose the first."""
    held = [name for name in (MANIFEST_FILE, RECORDS_FILE) if (run_dir / name).exists()]
    if held:
        raise InputError(f"{run_dir} already holds a run ({', '.join(held)}): give another --run-id or move it away")


def read_manifest(run_dir: Path) -> RunManifest:
    """run.json, or an InputError that says what is wrong with the directory."""
    path = run_dir / MANIFEST_FILE
    if not path.is_file():
        raise InputError(f"{run_dir} is not a run directory (no {MANIFEST_FILE})")
    try:
        return RunManifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise InputError(f"{path}: {validation_message(exc)}") from None


def read_verdict(run_dir: Path) -> Verdict | None:
    path = run_dir / VERDICT_FILE
    return Verdict.model_validate_json(path.read_bytes()) if path.is_file() else None


def read_summary(run_dir: Path) -> Summary | None:
    """summary.json, the run summarised once (None when the run wrote none: it did not end); an
    InputError when an older llmload wrote it without a figure this one reads."""
    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return Summary.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise InputError(f"{path}: {validation_message(exc)}; `llmload report {run_dir}` rebuilds it") from None


def require_summary(run_dir: Path) -> Summary:
    """summary.json, or an InputError that says how to write it (a run killed before its end has none)."""
    read_manifest(run_dir)  # not a run directory: say so first
    summary = read_summary(run_dir)
    if summary is None:
        raise InputError(f"{run_dir} has no {SUMMARY_FILE}: `llmload report {run_dir}` writes it from its records")
    return summary


@dataclass(frozen=True)
class Run:
    """A finished run as every reader after it sees it: the plan, the records (columns in memory,
    ITL gaps streamed from requests.parquet) and the server's samples."""

    path: Path
    manifest: RunManifest
    records: RunRecords
    server: ServerSamples
    cut_off: str | None = None
    """requests.jsonl ends in half a record (the run was killed mid-write): what was kept, in words."""

    @property
    def finished_at(self) -> float:
        """When the run ended: as the run wrote it, else its last record's end (a killed run)."""
        return self.manifest.finished_at or float(self.records.frame.finished_at.max())

    def workload(self) -> Workload | None:
        """The workload the run replayed (its file, scaled as the run's --scale-tokens), where run.json
        names it; None when it is gone or unreadable."""
        try:
            return scaled(load_workload(self.manifest.workload), self.manifest.flags.get("scale_tokens", 1.0))
        except (OSError, WorkloadError):
            return None


def load(run_dir: Path) -> Run:
    """The run in `run_dir` (requests.parquet written from requests.jsonl when it is not fresh), or
    an InputError that says what is missing or broken."""
    from llmload.observe.summary import read_server
    from llmload.records import RunRecords

    manifest = read_manifest(run_dir)
    if not (run_dir / RECORDS_FILE).is_file():
        raise InputError(f"{run_dir} has no {RECORDS_FILE}")
    try:
        records = RunRecords.load(run_dir / RECORDS_FILE, run_dir / PARQUET_FILE)
    except ValueError as exc:
        raise InputError(f"{run_dir}: {exc}") from None
    kept = len(records.frame)
    cut_off = (
        f"{RECORDS_FILE} line {kept + 1} is cut off ({kept:,} complete record{'s' if kept != 1 else ''} kept)"
        if _ends_mid_line(run_dir / RECORDS_FILE)
        else None
    )
    return Run(run_dir, manifest, records, read_server(run_dir / SERVER_FILE), cut_off)


def _ends_mid_line(path: Path) -> bool:
    """The file's last line has no newline: its writer stopped in the middle of it."""
    with path.open("rb") as handle:
        if handle.seek(0, 2) == 0:
            return False
        handle.seek(-1, 2)
        return handle.read(1) != b"\n"
