"""The process that writes the run directory while the run goes: run.json at the start, every
record (a failure with the server's state when it happened), the server's samples and the live
statistics; at the end the finished plan and the report (llmload.conclude). Callable without
Locust: the Locust glue hands it records and tells it when the run stops."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from llmload import rundir
from llmload.access import Access
from llmload.cancel import RELEASE_LIMIT_S
from llmload.gates.criteria import SoakCriteria
from llmload.live import LiveStats
from llmload.models import FleetWorker, RequestRecord, RunManifest, Summary
from llmload.observe.gpu import GpuReader
from llmload.observe.metrics import VLLM
from llmload.observe.observer import Observer
from llmload.plan import RunPlan
from llmload.recordlog import RecordWriter, with_server_state
from llmload.server.kinds import kind

log = logging.getLogger("llmload")


class RunRecorder:
    def __init__(
        self,
        run_dir: Path,
        plan: RunPlan,
        manifest: RunManifest,
        *,
        metrics_interval_s: float,
        access: Access,
        gpu: GpuReader | None,
    ) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        run_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_model(run_dir / rundir.MANIFEST_FILE, manifest)
        self.writer = RecordWriter(run_dir / rundir.RECORDS_FILE)
        server = kind(manifest.server.kind) if manifest.server is not None else VLLM
        self.observer = Observer(
            manifest.replicas or manifest.host,
            run_dir / rundir.SERVER_FILE,
            metrics_interval_s,
            access,
            gpu,
            server=server,
        ).start()
        self.live = LiveStats(plan.stages, plan.offsets(), manifest.started_at, manifest.server)

    def add(self, records: Iterable[RequestRecord]) -> None:
        """Records into requests.jsonl and the live statistics."""
        rows = []
        for record in records:
            at = record.finished_at or record.scheduled_at
            sample = self.observer.state_at(at) if record.status in ("failed", "unfinished") else None
            rows.append(with_server_state(record, sample).model_dump())
        self.writer.write(rows)
        for row in rows:
            self.live.add(row)

    def finish(
        self,
        *,
        cpu_max_percent: float,
        steal_percent: float,
        criteria: SoakCriteria | None,
        fleet: list[FleetWorker] | None = None,
        interrupted: bool = False,
    ) -> Summary:
        """Stop observing, close the log, complete run.json (with a distributed run's workers), and
        write the report (and the verdict). A run that cut streams first watches the server let go of them."""
        release = self.observer.release(RELEASE_LIMIT_S) if self.manifest.cancel is not None else None
        self.observer.stop()
        self.writer.close()
        self.manifest = self.manifest.model_copy(
            update={
                "finished_at": time.time(),
                "load_generator_cpu_max_percent": cpu_max_percent,
                "cpu_steal_percent": round(steal_percent, 2),
                "fleet": fleet or [],
                "interrupted": interrupted,
                "server_release": release,
            }
        )
        rundir.write_model(self.run_dir / rundir.MANIFEST_FILE, self.manifest)
        from llmload.conclude import conclude  # matplotlib: only the process that finishes a run draws its report

        return conclude(self.run_dir, criteria)
