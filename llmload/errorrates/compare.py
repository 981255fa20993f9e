"""`llmload compare` between runs against servers of known speed: how often two runs of one healthy
server are called a regression, and how often a server whose every latency is 15% longer is caught.
The runs are written as run directories (`write_run`) and compared by `compare`'s own code."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from llmload.errorrates.grid import Arrivals
from llmload.errorrates.runs import hold_plan, records
from llmload.errorrates.servers import FifoServer, Server
from llmload.gates.compare import Thresholds, compare_runs, load_run
from llmload.models import RunManifest
from llmload.records import FRAME_COLUMNS
from llmload.rundir import MANIFEST_FILE, RECORDS_FILE


def write_run(run_dir: Path, manifest: RunManifest, frame: pd.DataFrame) -> Path:
    """A generated run as a run directory: run.json and requests.jsonl (no ITL gaps: these servers
    send their tokens as one answer), as any tool following docs/metrics.md writes them."""
    run_dir.mkdir(parents=True)
    (run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(manifest.model_dump(mode="json")))
    rows = frame.assign(run_id=manifest.run_id, session_id=[f"s{i}" for i in range(len(frame))], itl_ms=None)
    rows = rows[["run_id", "session_id", *FRAME_COLUMNS, "itl_ms"]].astype(object)
    rows = rows.where(rows.notna(), None)
    lines = [orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE) for record in rows.to_dict("records")]
    (run_dir / RECORDS_FILE).write_bytes(b"".join(lines))
    return run_dir


def slower(server: Server, factor: float) -> Server:
    """The same server with every latency `factor` times as long (its capacity divided by it)."""
    if isinstance(server, FifoServer):
        return dataclasses.replace(server, ttft_s=server.ttft_s * factor, itl_s=server.itl_s * factor)
    return dataclasses.replace(server, step_s=server.step_s * factor, step_per_seq_s=server.step_per_seq_s * factor)


@dataclass(frozen=True)
class PairOutcome:
    regressed: list[str]  # the metrics called regressions
    detectable: dict[str, float]  # E2E p50/p95/p99: the smallest rise these runs could call a regression, relative


def compare_pair(
    directory: Path, server: Server, load: float, arrivals: Arrivals, seed: int, *, factor: float = 1.0
) -> PairOutcome:
    """A default soak of `server` at `load` (baseline) against one of the server `factor` times slower
    (current), compared with the default thresholds."""
    hold = hold_plan("soak", load * server.capacity_qps)
    runs = []
    for name, target, stream in (("baseline", server, 0), ("current", slower(server, factor), 1)):
        manifest, frame = records(hold, target, arrivals.process, arrivals.burstiness, seed * 2 + stream)
        runs.append(load_run(write_run(directory / f"{name}-{factor:g}-{seed}", manifest, frame)))
    comparison = compare_runs(runs[0], runs[1], Thresholds())
    detectable = {
        row.metric: (row.detectable or np.nan) / row.baseline if row.baseline else np.nan
        for row in comparison.rows
        if row.metric in ("E2E p50", "E2E p95", "E2E p99")
    }
    return PairOutcome([r.metric for r in comparison.regressions], detectable)


@dataclass
class CompareTally:
    server: Server
    factor: float
    pairs: int = 0
    regressed: int = 0
    detectable: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def median_detectable(self, metric: str) -> float:
        return float(np.nanmedian([d[metric] for d in self.detectable]))


def tally_compare(directory: Path, server: Server, factor: float, seeds: range) -> CompareTally:
    out = CompareTally(server, factor)
    for seed in seeds:
        outcome = compare_pair(directory, server, 0.7, Arrivals("poisson"), seed, factor=factor)
        out.pairs += 1
        out.regressed += bool(outcome.regressed)
        out.detectable.append(outcome.detectable)
    return out
