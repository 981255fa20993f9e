"""The sweep: each configuration in turn gets its own server, its search (or soak) as ordinary run
directories, and a row; one that does not start is a row that says why. sweep.json, sweep.md and
sweep.html are rewritten after every configuration, so an interrupted sweep keeps what it learned
and `--resume` goes on from there."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from llmload import rundir
from llmload.capacity.plan import plan_capacity
from llmload.capacity.serving import serve_inputs, serve_model
from llmload.errors import InputError
from llmload.gates.search import RESULT_FILE as SEARCH_RESULT_FILE
from llmload.gates.search import Bounds, Interrupted, ProbeFlags, Searcher, boundary, search
from llmload.gates.soak import SoakRun, run_soak
from llmload.models import ParetoPoint, SearchResult, StageFigures, Summary, SweepMode, SweepResult, SweepRow
from llmload.report import pareto
from llmload.server.serve_config import read_serve_config, serve_launcher
from llmload.sweep.configs import CONFIG_FILE, SweepConfig
from llmload.sweep.server import ServerProcess, Startup, free_port, serve_command

RESULT_FILE = "sweep.json"
ROW_FILE = "row.json"  # a configuration's row once it is done: what --resume skips
SERVER_LOG = "server.log"
SEARCH_DIR = "search"
SOAK_RUN = "soak"
PREDICTED_DIR = "predicted"
SOAK_STAGE = "100%"  # soak mode: the figures are the target's


def simulator_serve(*extra: str) -> str:
    """The --serve template of the embedded target sized by each configuration (`sim --vllm-config`)."""
    return " ".join([sys.executable, "-m", "llmload.sim", "--host", "127.0.0.1", "--port", "{port}",
                     "--vllm-config", "{config}", *extra])  # fmt: skip


@dataclass
class Sweep:
    """One sweep's configurations, how each is judged, and where it all goes."""

    directory: Path
    configs: Sequence[SweepConfig]
    result: SweepResult
    startup_timeout_s: float
    passthrough: Sequence[str]
    probe: ProbeFlags
    bounds: Bounds | None  # search mode
    soak: SoakRun | None  # soak mode: each configuration's soak, but for its host and directory
    gpu_memory_gib: float | None = None
    predicted: dict[str, SweepRow] = field(default_factory=dict)  # --predict: the simulator's rows by name

    @property
    def mode(self) -> SweepMode:
        return self.result.mode

    def run(self, resume: bool) -> None:
        """Every configuration not done yet; Ctrl-C stops the one running (its server too) and returns."""
        done = {row.name: row for row in self.result.rows} if resume else {}
        self.result.rows = []
        try:
            for config in self.configs:
                row = done.get(config.name) or self._config(config)
                self.result.rows.append(self._with_prediction(row))
                self.save()
        except (Interrupted, KeyboardInterrupt):
            self.result.interrupted = True
            print("llmload sweep: interrupted; its server was stopped; --resume goes on from here")
        self.result.finished_at = time.time()
        self.save()

    def _config(self, config: SweepConfig) -> SweepRow:
        """The configuration's row: its server started, its startup recorded, then judged if it started."""
        directory = self.directory / config.name
        row = SweepRow(
            name=config.name, varied=config.varied, predicted_startup=self._capacity(directory / CONFIG_FILE)
        )
        _keep_interrupted_attempt(directory)
        with self._server(directory) as server:
            startup = server.wait_healthy(self.startup_timeout_s)
            self._record_startup(row, startup, server.url)
            if startup.started:
                self._judge(row, directory, server.url)
        (directory / ROW_FILE).write_bytes(orjson.dumps(row.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        return row

    def _server(self, directory: Path) -> ServerProcess:
        """The configuration's server, on a free port, its log beside its config (started on `with`)."""
        port = free_port()
        print(f"llmload sweep: {directory.name}: starting the server ...", end="", flush=True)
        return ServerProcess(
            serve_command(self.result.serve, directory / CONFIG_FILE, port), directory / SERVER_LOG, port
        )

    def _record_startup(self, row: SweepRow, startup: Startup, url: str) -> None:
        """What the start showed, printed and into the row: its seconds and KV figures, or why it did not start."""
        row.startup_s = round(startup.seconds, 1)
        row.kv_cache_tokens, row.max_concurrency = startup.kv_cache_tokens, startup.max_concurrency
        row.concurrency_tokens, row.kv_cache_gib = startup.concurrency_tokens, startup.kv_cache_gib
        row.prediction_warnings = list(startup.warnings) if self.result.predicted else []
        if not startup.started:
            row.server, row.reason = "did_not_start", startup.reason
            print(f" did not start: {startup.reason}")
        else:
            print(f" healthy after {startup.seconds:.0f} s at {url}")

    def _judge(self, row: SweepRow, directory: Path, host: str) -> None:
        """The search or soak of a started server; the row says `interrupted` until it has finished."""
        row.server = "interrupted"
        if self.mode == "search":
            self._search(row, directory, host)
        else:
            self._soak(row, directory, host)
        row.server = "started"

    def _capacity(self, path: Path) -> str:
        """What `llmload capacity --vllm-config` says of the file before anything starts."""
        try:
            config = read_serve_config(path, serve_launcher(self.result.serve))  # as the --serve command reads it
            plan = plan_capacity(serve_model(config), serve_inputs(config, gpu_memory_gib=self.gpu_memory_gib))
        except InputError as exc:
            return f"no prediction: {exc}"
        if plan.startup_error is not None:
            return f"refuses to start: {plan.startup_error}"
        return (
            f"starts: KV cache {plan.vllm_log_kv_cache_tokens:,} tokens, "
            f"{plan.at_max_model_len.max_concurrency:.2f}x at {plan.max_model_len:,} tokens"
        )

    def _search(self, row: SweepRow, directory: Path, host: str) -> None:
        assert self.bounds is not None
        where = directory / SEARCH_DIR
        where.mkdir(exist_ok=True)
        for name in ("criteria.yaml", "criteria-confirm.yaml"):
            (where / name).write_bytes((self.directory / name).read_bytes())
        found = SearchResult(
            search_id=f"{self.result.sweep_id}/{row.name}", host=host, workload=self.probe.workload,
            max_qps=self.bounds.max_qps, probe_s=self.probe.hold_s, repeats=self.bounds.repeats,
            started_at=time.time(), required_qps=self.result.required_qps, latency_slo=self.result.latency_slo,
            prefix_cache_kept=not self.probe.reset_prefix_cache,
        )  # fmt: skip
        searcher = Searcher(self.probe, self.passthrough, where, found)
        try:
            found.outcome = search(searcher, self.bounds)
        finally:
            found.finished_at = time.time()
            searcher.save()
        lo, hi = boundary(found.probes)
        row.outcome, row.passing_qps, row.failing_qps, row.failing_reason = found.outcome, lo, hi, found.failing_reason
        row.passed = lo is not None and lo >= (self.result.required_qps or 0)
        judged = [p for p in found.probes if p.passed is not None]
        row.inconclusive = lo is None and bool(judged) and all(p.inconclusive for p in judged if not p.passed)
        row.reports = [f"{row.name}/{SEARCH_DIR}/{p.run_id}/{rundir.HTML_FILE}" for p in found.probes]
        row.cache_note = found.cache_note
        answer = found.answer_probe
        if answer is not None:
            _figures(row, where / answer.run_id, stage=None)

    def _soak(self, row: SweepRow, directory: Path, host: str) -> None:
        assert self.soak is not None
        run_soak(
            replace(self.soak, host=host, run_id=SOAK_RUN, reports_dir=str(directory)),
            passthrough=["--criteria", str(self.directory / "criteria-confirm.yaml"), *self.passthrough],
        )
        run_dir = directory / SOAK_RUN
        row.reports = [f"{row.name}/{SOAK_RUN}/{rundir.HTML_FILE}"]
        summary = _figures(row, run_dir, stage=SOAK_STAGE)
        if summary is None or summary.verdict is None:
            row.passed, row.verdict_reasons = False, ["no verdict: the soak did not finish (see its log)"]
            return
        row.passed = summary.verdict.passed
        row.inconclusive = summary.verdict.outcome == "inconclusive"
        row.passing_qps = summary.run.target_qps if row.passed else None
        row.failing_qps = None if row.passed else summary.run.target_qps
        row.verdict_reasons = [r for r in summary.verdict.reasons if r.startswith(("FAIL", "INCONCLUSIVE"))]
        row.failing_reason = row.verdict_reasons[0].split(" ", 1)[1] if row.verdict_reasons else None

    def _with_prediction(self, row: SweepRow) -> SweepRow:
        predicted = self.predicted.get(row.name)
        if predicted is None:
            return row
        return row.model_copy(
            update={
                "predicted_qps": predicted.passing_qps,
                "predicted_passed": predicted.passed,
                "predicted_reason": predicted.reason,
                "prediction_warnings": predicted.prediction_warnings,
            }
        )

    def save(self) -> None:
        from llmload.report.sweep_page import write_pages  # matplotlib: only once there is a row to draw

        self.result.best, self.result.best_why = best_config(self.result.rows, self.mode)
        self.result.pareto = pareto.frontier(pareto_points(self.directory, self.result.rows, self.mode))
        (self.directory / RESULT_FILE).write_bytes(
            orjson.dumps(self.result.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
        )
        write_pages(self.result, self.directory)


def _keep_interrupted_attempt(directory: Path) -> None:
    """An interrupted attempt's runs are kept, renamed, beside the new ones."""
    for earlier in (SEARCH_DIR, SOAK_RUN):
        if (directory / earlier).exists():
            (directory / earlier).rename(directory / f"{earlier}-interrupted-{time.strftime('%Y%m%d-%H%M%S')}")


def _figures(row: SweepRow, run_dir: Path, stage: str | None) -> Summary | None:
    """The run's figures at `stage` (None: its last, a probe's hold) and its server's peaks, into the row."""
    summary = rundir.read_summary(run_dir)
    if summary is None:
        return None
    chosen = next((s for s in summary.stages if s.name == stage), None) if stage else summary.stages[-1]
    if chosen is not None:
        row.measured_at_qps = chosen.target_qps
        for name, value in StageFigures.of(chosen):
            setattr(row, name, value)
    if summary.server is not None:
        row.kv_cache_usage_max = summary.server.kv_cache_usage_max
        row.preemptions = summary.server.preemptions
        row.gpu_memory_usage_max = summary.server.gpu_memory_usage_max
        if (spec := summary.server.spec_decode) is not None:
            row.spec_acceptance_rate, row.spec_acceptance_length = spec.acceptance_rate, spec.mean_acceptance_length
    return summary


def pareto_points(directory: Path, rows: Sequence[SweepRow], mode: SweepMode) -> list[ParetoPoint]:
    """Every probe of each configuration's search (soak: its soak), read from the runs themselves, so the
    configurations an earlier run of the sweep finished (--resume) have theirs too."""
    read = _search_points if mode == "search" else _soak_points
    return [p for row in rows if row.server == "started" for p in read(directory, row.name)]


def _search_points(directory: Path, name: str) -> list[ParetoPoint]:
    path = directory / name / SEARCH_DIR / SEARCH_RESULT_FILE
    if not path.is_file():
        return []
    found = SearchResult.model_validate_json(path.read_bytes())
    return pareto.search_points(found, name, under=f"{name}/{SEARCH_DIR}/")


def _soak_points(directory: Path, name: str) -> list[ParetoPoint]:
    """The soak at the target's rate (its 100% stage: 150% is the overload it must survive)."""
    summary = rundir.read_summary(directory / name / SOAK_RUN)
    stage = next((s for s in summary.stages if s.name == SOAK_STAGE), None) if summary is not None else None
    if summary is None or stage is None:
        return []
    soaked = pareto.point(
        configuration=name, qps=stage.target_qps, run=f"{name}/{SOAK_RUN}",
        output_tokens_per_s=stage.output_tokens_per_s, tpot_p50_ms=stage.tpot_p50_ms,
        gpu_count=summary.cost.gpu_count if summary.cost is not None else None,
        passed=summary.verdict.passed if summary.verdict is not None else None,
    )  # fmt: skip
    return [soaked] if soaked is not None else []


def _memory(row: SweepRow) -> tuple[float, float, float]:
    """What a configuration costs in memory, the measured peak first; unknown sorts last."""
    return (
        row.gpu_memory_usage_max if row.gpu_memory_usage_max is not None else math.inf,
        row.kv_cache_gib if row.kv_cache_gib is not None else math.inf,
        float(row.kv_cache_tokens) if row.kv_cache_tokens is not None else math.inf,
    )


def _memory_words(row: SweepRow) -> str:
    if row.gpu_memory_usage_max is not None:
        return f"peak GPU memory {row.gpu_memory_usage_max:.0%}"
    if row.kv_cache_gib is not None:
        return f"{row.kv_cache_gib:g} GiB of KV cache"
    return f"{row.kv_cache_tokens:,} KV tokens" if row.kv_cache_tokens is not None else "memory not known"


def best_config(rows: Sequence[SweepRow], mode: SweepMode) -> tuple[str | None, str | None]:
    """The configuration to ship and why: the highest passing rate (soak: a PASS), ties to less memory,
    then to more output tokens/s; a tie is called so only where a figure tells the two apart."""
    passing = [r for r in rows if r.server == "started" and r.passing_qps is not None and r.passed is not False]
    if not passing:
        return None, None
    ranked = sorted(passing, key=lambda r: (-(r.passing_qps or 0.0), _memory(r), -(r.output_tokens_per_s or 0.0)))
    best = ranked[0]
    if mode == "soak":
        what = "passes the soak at the target"
    elif best.outcome == "capped":
        what = f"keeps up with {best.answer}, the highest probed"
    else:
        what = f"passes at {best.answer}, the highest"
    tied = [r for r in ranked[1:] if r.passing_qps == best.passing_qps]
    if tied:
        names = ", ".join(r.name for r in tied)
        if _memory(best) < min(_memory(r) for r in tied):
            what += f"; tied with {names}, it uses less memory ({_memory_words(best)})"
        elif (best.output_tokens_per_s or 0.0) > max(r.output_tokens_per_s or 0.0 for r in tied):
            what += f"; tied with {names} on rate and memory, it gave more output tokens/s"
        else:
            what += f"; tied with {names}: nothing measured tells them apart"
    elif len(ranked) > 1:
        what += f" (next: {ranked[1].name} at {ranked[1].answer})"
    return best.name, what


def load_rows(directory: Path, configs: Sequence[SweepConfig]) -> list[SweepRow]:
    """The rows of configurations an earlier run of this sweep finished (--resume)."""
    rows = []
    for config in configs:
        path = directory / config.name / ROW_FILE
        if path.is_file():
            rows.append(SweepRow.model_validate_json(path.read_bytes()))
    return rows
