"""Locust glue: command-line flags, the user class, the ramp shape and the event wiring.

Thin on purpose: the engine (llmload.replay) does the work and is tested without Locust. Import
this module from a locustfile (loadtests/chat.py) and its users, shape and listeners are live.

Processes: in a local run one process does everything. In a distributed run the master writes
the run directory and decides the user count; each worker replays its share of the arrivals
and streams its records to the master once a second (Locust's custom messages).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import logging
import math
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import numpy as np
import openai
import orjson
from flask import Response, request
from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.runners import STATE_SPAWNING, LocalRunner, MasterRunner, WorkerRunner
from locust.web import WebUI
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric

from llmload.client import ChatClient, Limits
from llmload.conclude import write_report
from llmload.errors import InputError
from llmload.gates.verdict import SoakCriteria, add_criteria_arguments, criteria_from_args, evaluate
from llmload.live import LLM_TAB, LLM_TABLE, LiveStats
from llmload.models import GoodputSLO, RequestRecord, RunManifest, Stage, Verdict
from llmload.observe import Observer, gpu_reader
from llmload.records import RecordWriter
from llmload.replay import Dispatcher, RequestDispatcher, StealMeter, TraceDispatcher, TurnSender
from llmload.report.goodput import SYNTAX as GOODPUT_SYNTAX
from llmload.report.goodput import parse_goodput_slo
from llmload.rundir import MANIFEST_FILE, RECORDS_FILE, REPORT_FILE, SERVER_FILE, VERDICT_FILE
from llmload.schedule import (
    ARRIVAL_PROCESSES,
    ArrivalSchedule,
    RunClock,
    TraceClock,
    build_stages,
    expected_arrivals,
    parse_duration,
    parse_stage_percents,
    trace_period,
    trace_request_times,
    trace_session_starts,
    trace_stages,
)
from llmload.sim.process import EMBEDDED_TARGET_ARGS, SimProcess
from llmload.workload import Workload, WorkloadError, load_workload
from llmload.workload.tokens import get_tokenizer

log = logging.getLogger("llmload")

RECORDS_MESSAGE = "llmload_records"
FLUSH_INTERVAL_S = 1.0
LIVE_TICK_S = 2.0  # live gauges and the LLM tab
CONSOLE_EVERY_S = 10.0  # a headless run's live line
START_LEAD_S = 1.0  # time for users to spawn, and for the master's spawn messages to reach every worker
ASSUMED_REQUEST_S = 2.0  # first guess of a request's duration, for the initial user count
DEFAULT_WORKLOAD = "workloads/chat-multiturn.yaml"


@events.init_command_line_parser.add_listener
def add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("llmload", "open-loop replay of an LLM workload")
    group.add_argument("--workload", default=DEFAULT_WORKLOAD, help="workload YAML file (v1)")
    group.add_argument("--target-qps", type=float, default=None, help="100%% request rate (default: the workload's)")
    group.add_argument("--stages", default="25,50,100,150", help="stage rates as %% of --target-qps")
    group.add_argument("--stage-duration", type=float, default=60.0, help="seconds per stage")
    group.add_argument("--hold-duration", type=float, default=None, help="seconds of the last stage")
    group.add_argument(
        "--arrival", choices=ARRIVAL_PROCESSES, default="poisson", help="trace: the sessions' recorded times"
    )
    group.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: <1 burstier, 1 = Poisson")
    group.add_argument("--time-scale", type=float, default=1.0, help="trace replay speed (2 = twice as fast)")
    group.add_argument(
        "--warmup",
        type=functools.partial(parse_duration, allow_zero=True),
        default=None,
        help="unjudged lead-in at the first stage's rate, e.g. 30s (default: a mean session's length for"
        " multi-turn workloads, 0 for single-turn)",
    )
    group.add_argument("--seed", type=int, default=0, help="seed of the arrival process")
    group.add_argument("--model", default=None, help="served model name (default: the workload's, else /v1/models)")
    parser.add_argument(  # on the parser itself: only Locust's parser knows is_secret
        "--api-key", default="", env_var="LLMLOAD_API_KEY", is_secret=True, help="bearer token (never recorded)"
    )
    group.add_argument("--history-turns", type=int, default=None, help="send only the last N turns of history")
    group.add_argument("--run-id", default=None, help="run directory name (default: time + workload)")
    group.add_argument("--reports-dir", default="reports", help="where run directories are written")
    group.add_argument("--max-users", type=int, default=2000, help="cap on concurrent sessions (users)")
    group.add_argument("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests may finish")
    group.add_argument("--timeout-connect", type=float, default=Limits.connect_s)
    group.add_argument("--timeout-first-token", type=float, default=Limits.first_token_s)
    group.add_argument("--timeout-between-tokens", type=float, default=Limits.between_tokens_s)
    group.add_argument("--timeout-total", type=float, default=Limits.total_s)
    group.add_argument(
        "--verdict", action="store_true", help="judge the hold stage (soak criteria): exit code 0 PASS, 1 FAIL"
    )
    add_criteria_arguments(group)
    group.add_argument(
        "--goodput-slo", action="append", default=[], metavar="SPEC",
        help=f"per-request SLOs goodput counts against: {GOODPUT_SYNTAX}",
    )  # fmt: skip
    group.add_argument("--metrics-interval", type=float, default=1.0, help="seconds between /metrics scrapes")
    group.add_argument(
        "--gpu-metrics",
        metavar="URL",
        default=None,
        env_var="LLMLOAD_GPU_METRICS",
        help="an NVIDIA DCGM exporter's /metrics: GPU memory and utilisation into server.jsonl (default: nvidia-smi"
        " when the target runs on this machine, else none)",
    )
    group.add_argument(
        "--prometheus-port", type=int, default=None, help="serve live llmload metrics for Prometheus on this port"
    )


@dataclass
class RunConfig:
    """Everything the flags decide, checked before anything starts."""

    workload: Workload
    stages: list[Stage]
    plan: ArrivalSchedule | TraceClock  # request arrivals (rate modes), or the trace's clock
    target_qps: float
    limits: Limits
    options: argparse.Namespace
    goodput_slo: GoodputSLO | None

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> RunConfig:
        workload = load_workload(options.workload)
        trace = options.arrival == "trace"
        if trace:
            if any(s.offset_s is None for s in workload.sessions):
                raise ValueError(
                    f"--arrival trace needs recorded session offsets (offset_s), and {options.workload} has"
                    " sessions without one: build it from a log with timestamps, or pick another --arrival"
                )
            period = trace_period([s.offset_s or 0.0 for s in workload.sessions])
            target = workload.requests / period * options.time_scale  # the trace's own rate is 100%
        elif options.time_scale != 1.0:
            raise ValueError("--time-scale applies to --arrival trace only")
        else:
            target = options.target_qps if options.target_qps is not None else workload.spec.target_qps
        if target is None:
            raise ValueError(f"no target rate: give --target-qps (the workload {options.workload} names none)")
        warmup = options.warmup if options.warmup is not None else default_warmup_s(workload)
        stages = build_stages(
            target, parse_stage_percents(options.stages), options.stage_duration, options.hold_duration, warmup
        )
        plan: ArrivalSchedule | TraceClock
        if trace:
            plan = TraceClock(stages, options.time_scale)
            stages = trace_stages(stages, plan, workload.sessions)
        else:
            plan = ArrivalSchedule(stages, options.arrival, burstiness=options.burstiness, seed=options.seed)
        limits = Limits(
            connect_s=options.timeout_connect,
            first_token_s=options.timeout_first_token,
            between_tokens_s=options.timeout_between_tokens,
            total_s=options.timeout_total,
        )
        if options.history_turns is not None and options.history_turns < 1:
            raise ValueError("--history-turns must be ≥ 1")
        goodput_slo = parse_goodput_slo(options.goodput_slo) if options.goodput_slo else None
        return cls(workload, stages, plan, target, limits, options, goodput_slo)

    @property
    def end_s(self) -> float:
        return self.stages[-1].end_s

    def planned(self) -> int:
        """Planned request arrivals (rate modes) or session starts (trace mode)."""
        if isinstance(self.plan, ArrivalSchedule):
            return expected_arrivals(self.stages)
        return len(trace_session_starts(self.plan, self.workload.sessions))

    def plan_offsets(self) -> np.ndarray:
        """Every planned request's time, seconds from the start (trace mode: as recorded)."""
        if isinstance(self.plan, ArrivalSchedule):
            return np.fromiter(self.plan.times(), dtype=float)
        return np.asarray(trace_request_times(self.plan, self.workload.sessions), dtype=float)

    def initial_users(self) -> int:
        """Little's law with a guessed request time; the shape grows it when users run short. A user
        holds one request in the rate modes, and a whole session (think times too) in trace mode."""
        peak = max(s.qps for s in self.stages)
        busy_s = ASSUMED_REQUEST_S
        if isinstance(self.plan, TraceClock):
            peak /= self.workload.mean_turns
            busy_s = mean_session_span_s(self.workload)
        return min(self.options.max_users, math.ceil(peak * busy_s * 1.5) + 4)


def mean_session_span_s(workload: Workload) -> float:
    """A session's length on average: its think times plus a guessed time per request."""
    sessions = workload.sessions
    think = sum(t.think_time_s for s in sessions for t in s.turns) / len(sessions)
    return think + workload.mean_turns * ASSUMED_REQUEST_S


def default_warmup_s(workload: Workload) -> float:
    """Long enough for sessions to reach every depth before anything is judged: one mean session
    (0 for single-turn workloads, which have no depth to build)."""
    return 0.0 if workload.mean_turns == 1 else float(math.ceil(mean_session_span_s(workload)))


@dataclass
class WorkerState:
    users: int = 0
    busy: int = 0
    backlog: int = 0
    done: bool = False
    cpu_max: float = 0.0


@dataclass
class ProcessRun:
    """This process's part of one run (a local run, the master, or one worker)."""

    config: RunConfig
    clock: RunClock
    run_id: str
    model: str
    worker: int
    dispatcher: Dispatcher | None = None  # processes that run users
    writer: RecordWriter | None = None  # processes that write the run directory
    observer: Observer | None = None  # processes that write the run directory
    manifest: RunManifest | None = None
    outbox: list[dict[str, Any]] = field(default_factory=list)
    workers: dict[str, WorkerState] = field(default_factory=dict)
    live: LiveStats | None = None  # processes that write the run directory
    cpu_max: float = 0.0
    steal: StealMeter = field(default_factory=StealMeter)
    greenlets: list[gevent.Greenlet] = field(default_factory=list)
    finished: bool = False

    @property
    def run_dir(self) -> Path:
        return Path(self.config.options.reports_dir) / self.run_id


@dataclass
class _ProcessState:
    config: RunConfig | None = None  # validated at init on master/local: bad flags fail before the run
    criteria: SoakCriteria | None = None  # with --verdict
    run: ProcessRun | None = None  # set at each test start


_state = _ProcessState()


def _fail_config(message: str) -> None:
    sys.stderr.write(f"llmload: {message}\n")
    sys.exit(2)


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None or isinstance(environment.runner, WorkerRunner):
        return
    try:
        _state.config = RunConfig.from_options(options)
        _state.criteria = criteria_from_args(options) if options.verdict else None
        criteria = _state.criteria
        if criteria is not None and criteria.min_goodput_ratio is not None and _state.config.goodput_slo is None:
            raise ValueError("--min-goodput-ratio needs the SLOs goodput counts against: give --goodput-slo")
    except (WorkloadError, ValueError) as exc:  # InputError is a ValueError
        _fail_config(str(exc))
    if not environment.host:
        environment.host = _start_embedded_target()
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(RECORDS_MESSAGE, _on_worker_records)
    if options.prometheus_port is not None:
        try:
            start_http_server(options.prometheus_port, addr="0.0.0.0", registry=_LiveRegistry())
        except OSError as exc:
            _fail_config(f"--prometheus-port {options.prometheus_port}: {exc.strerror}")
    if environment.web_ui is not None:
        _extend_web_ui(environment.web_ui)
    # Locust (2.47) installs its SIGTERM handler only after a headless shape run returns, so
    # until then SIGTERM would kill the process with records unflushed: make it a Ctrl-C.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)


class _LiveRegistry(CollectorRegistry):
    """The current run's live metrics (empty between runs): the endpoint outlives a run of the web UI."""

    def collect(self) -> Iterator[Metric]:
        run = _state.run
        if run is not None and run.live is not None:
            yield from run.live.registry.collect()


def _extend_web_ui(web_ui: WebUI) -> None:
    """An LLM tab in Locust's web UI: its table rows ride along with the UI's stats polling."""
    web_ui.template_args["extended_tabs"] = [LLM_TAB]
    web_ui.template_args["extended_tables"] = [LLM_TABLE]
    assert web_ui.app is not None

    @web_ui.app.after_request
    def _with_llm_rows(response: Response) -> Response:
        run = _state.run
        if request.path == "/stats/requests" and response.is_json and run is not None and run.live is not None:
            data = response.get_json()
            data["extended_stats"] = [{"key": LLM_TAB["key"], "data": run.live.tab_rows()}]
            response.set_data(orjson.dumps(data))
        return response


def _start_embedded_target() -> str:
    """No --host: serve the run from the embedded simulator, and say so loudly."""
    sim = SimProcess(*EMBEDDED_TARGET_ARGS)
    try:
        sim.start()
    except RuntimeError as exc:
        _fail_config(f"no --host given and the embedded target did not start: {exc}")
    atexit.register(sim.stop)
    log.warning("llmload: no --host given: started the embedded target (llmload sim, pid %d) at %s", sim.pid, sim.url)
    return sim.url


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _resolve_model(host: str, options: argparse.Namespace, workload: Workload) -> str:
    """The served model: --model, else the workload's, else the first one /v1/models lists."""
    if options.model or workload.spec.model:
        return str(options.model or workload.spec.model)
    client = openai.OpenAI(base_url=host.rstrip("/") + "/v1", api_key=options.api_key or "EMPTY", max_retries=0)
    try:
        models = client.models.list().data
    except openai.OpenAIError as exc:
        raise ValueError(f"cannot list models at {host}/v1/models ({type(exc).__name__}); give --model") from None
    if not models:
        raise ValueError(f"{host}/v1/models lists no model; give --model")
    return models[0].id


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    runner, options = environment.runner, environment.parsed_options
    assert runner is not None and options is not None and environment.host
    try:
        config = _state.config if not isinstance(runner, WorkerRunner) else None
        config = config or RunConfig.from_options(options)
        if isinstance(runner, WorkerRunner):
            model = options.llmload_model
            start_wall = options.llmload_start_wall
            run_id = options.run_id
        else:
            model = _resolve_model(environment.host, options, config.workload)
            start_wall = time.time() + START_LEAD_S
            run_id = options.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{config.workload.spec.name}"
            options.run_id, options.llmload_model, options.llmload_start_wall = run_id, model, start_wall
    except (WorkloadError, ValueError) as exc:
        log.error("llmload: %s", exc)
        environment.process_exit_code = 2
        gevent.spawn(runner.quit)
        return
    clock = RunClock(time.perf_counter() + (start_wall - time.time()), start_wall)
    worker = 0
    run = ProcessRun(config, clock, run_id, model, worker)
    if isinstance(runner, MasterRunner):
        indexes = {client.id: i for i, client in enumerate(runner.clients.all)}
        options.llmload_worker_indexes = indexes
        run.workers = {client_id: WorkerState() for client_id in indexes}
    if isinstance(runner, WorkerRunner):
        run.worker = options.llmload_worker_indexes[runner.client_id]
        count = len(options.llmload_worker_indexes)
    else:
        count = 1
    if not isinstance(runner, MasterRunner):
        share = {"run_id": run_id, "worker_index": run.worker, "worker_count": count, "drain_s": options.drain_timeout}
        if isinstance(config.plan, ArrivalSchedule):
            run.dispatcher = RequestDispatcher(config.plan, config.workload.sessions, clock, **share)
        else:
            run.dispatcher = TraceDispatcher(config.plan, config.workload.sessions, clock, **share)
        run.greenlets.append(gevent.spawn(_flush_loop, environment, run))
    if not isinstance(runner, WorkerRunner):
        run.manifest = RunManifest(
            run_id=run_id,
            host=environment.host,
            model=model,
            workload=str(options.workload),
            arrival=options.arrival,
            burstiness=options.burstiness,
            seed=options.seed,
            target_qps=config.target_qps,
            time_scale=options.time_scale,
            stages=config.stages,
            drain_s=options.drain_timeout,
            started_at=start_wall,
            workers=max(1, len(run.workers)),
            limits={k: float(v) for k, v in vars(config.limits).items()},
            goodput_slo=config.goodput_slo,
        )
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(run.manifest.model_dump(mode="json")))
        run.writer = RecordWriter(run.run_dir / RECORDS_FILE)
        gpu = gpu_reader(options.gpu_metrics, environment.host)
        if gpu is not None:
            log.info("llmload: GPU memory and utilisation from %s", gpu.url)
        run.observer = Observer(
            environment.host, run.run_dir / SERVER_FILE, options.metrics_interval, options.api_key or None, gpu
        ).start()
        run.live = LiveStats(config.stages, config.plan_offsets(), start_wall)
        run.greenlets.append(gevent.spawn(_live_loop, environment, run))
        what = "request arrivals" if isinstance(config.plan, ArrivalSchedule) else "trace sessions"
        warmup = config.stages[0].duration_s if config.stages[0].warmup else 0.0
        log.info(
            "llmload: run %s -> %s (%d planned %s; %g s unjudged warm-up)",
            run_id, run.run_dir, config.planned(), what, warmup,
        )  # fmt: skip
    _state.run = run


def _sink(environment: Environment, run: ProcessRun, record: RequestRecord) -> None:
    """Every record: to the file (or the master), and to Locust's live statistics."""
    row = record.model_dump()
    if run.writer is not None:
        _write(run, [row])
    else:
        run.outbox.append(row)
    if record.status in ("not_sent", "cancelled"):  # neither a response nor a failure of the target
        return
    exception = None
    if record.status == "failed":
        status = f" HTTP {record.http_status}" if record.http_status else ""
        exception = RuntimeError(f"{record.error_category}{status}")
    # one Locust event per request, so its RPS and failure ratio are the run's; TTFT, ITL and TPOT
    # are in the LLM tab, the console line and the Prometheus endpoint
    environment.events.request.fire(
        request_type="LLM",
        name="chat",
        response_time=record.e2e_ms or 0.0,
        response_length=record.output_tokens or 0,
        exception=exception,
    )


def _write(run: ProcessRun, rows: list[dict[str, Any]]) -> None:
    """Records into requests.jsonl; a failure gets the server's state at that moment attached."""
    assert run.writer is not None
    for row in rows:
        if row["status"] == "failed" and run.observer is not None:
            sample = run.observer.state_at(row["finished_at"] or row["scheduled_at"])
            if sample is not None:
                row["server_kv_cache_usage"] = sample.kv_cache_usage
                row["server_waiting"] = sample.waiting
                if row["server_health"] is None:
                    row["server_health"] = sample.health
    run.writer.write(rows)
    if run.live is not None:
        for row in rows:
            run.live.add(row)


def _fleet(environment: Environment, run: ProcessRun) -> WorkerState:
    """Users, busy and backlog summed over every process running users."""
    if run.dispatcher is not None:
        d = run.dispatcher
        assert environment.runner is not None
        return WorkerState(environment.runner.user_count, d.busy, d.backlog(time.perf_counter()), d.done)
    states = list(run.workers.values())
    return WorkerState(
        sum(s.users for s in states),
        sum(s.busy for s in states),
        sum(s.backlog for s in states),
        bool(states) and all(s.done for s in states),
    )


def _flush_loop(environment: Environment, run: ProcessRun) -> None:
    """Once a second: expire arrivals the plan no longer holds, ship records, note our CPU."""
    runner = environment.runner
    assert run.dispatcher is not None and runner is not None
    while True:
        gevent.sleep(FLUSH_INTERVAL_S)
        _expire(environment, run, time.perf_counter())
        run.cpu_max = max(run.cpu_max, runner.current_cpu_usage)
        if isinstance(runner, WorkerRunner):
            _send_records(environment, run)


def _expire(environment: Environment, run: ProcessRun, now: float, *, stopping: bool = False) -> None:
    """Arrivals the run will never send become not_sent: after the plan's end, or at a stop."""
    assert run.dispatcher is not None
    if now < run.dispatcher.plan_end and not stopping:
        return
    for arrival in run.dispatcher.expire(now):
        session_id = arrival.session.session.id if arrival.session is not None else ""
        _sink(environment, run, run.dispatcher.record(session_id, 0, arrival.at, None))


def _send_records(environment: Environment, run: ProcessRun) -> None:
    runner = environment.runner
    assert isinstance(runner, WorkerRunner) and run.dispatcher is not None
    batch, run.outbox = run.outbox, []
    d = run.dispatcher
    runner.send_message(
        RECORDS_MESSAGE,
        {
            "records": batch,
            "users": runner.user_count,
            "busy": d.busy,
            "backlog": d.backlog(time.perf_counter()),
            "done": d.done,
            "cpu": run.cpu_max,
        },
    )


def _on_worker_records(environment: Environment, msg: Any, **_: Any) -> None:
    run = _state.run
    if run is None or run.writer is None or run.finished:
        return
    data = msg.data
    _write(run, data["records"])
    state = run.workers.setdefault(msg.node_id, WorkerState())
    state.users, state.busy, state.backlog, state.done = data["users"], data["busy"], data["backlog"], data["done"]
    state.cpu_max = max(state.cpu_max, data["cpu"])


def _live_loop(environment: Environment, run: ProcessRun) -> None:
    """Live gauges, the LLM tab's server state, and in a headless run a line on the console."""
    assert run.live is not None
    headless = bool(environment.parsed_options and environment.parsed_options.headless)
    last_line = time.monotonic()
    while True:
        gevent.sleep(LIVE_TICK_S)
        fleet = _fleet(environment, run)
        run.live.server = run.observer.latest() if run.observer is not None else None
        run.live.refresh(users=fleet.users, busy=fleet.busy)
        if headless and time.monotonic() - last_line >= CONSOLE_EVERY_S:
            last_line = time.monotonic()
            log.info("llmload: %s", run.live.console_line())


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_: Any) -> None:
    run = _state.run
    if run is None or run.finished:
        return
    runner = environment.runner
    assert runner is not None
    if run.dispatcher is not None:
        _expire(environment, run, time.perf_counter(), stopping=True)
        run.cpu_max = max(run.cpu_max, runner.current_cpu_usage)
    if isinstance(runner, WorkerRunner):
        _send_records(environment, run)
        run.finished = True
        gevent.killall(run.greenlets)
        return
    run.finished = True
    gevent.killall(run.greenlets)
    assert run.writer is not None and run.manifest is not None and run.observer is not None
    run.observer.stop()
    run.writer.close()
    cpu = max([run.cpu_max, *(s.cpu_max for s in run.workers.values())])
    run.manifest = run.manifest.model_copy(
        update={
            "finished_at": time.time(),
            "load_generator_cpu_max_percent": cpu,
            "cpu_steal_percent": round(run.steal.percent, 2),
        }
    )
    (run.run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(run.manifest.model_dump(mode="json")))
    if _state.criteria is not None:
        try:
            verdict = evaluate(run.run_dir, _state.criteria).verdict
        except InputError as exc:  # stopped before any request: nothing to judge, and the report still written
            verdict = Verdict(passed=False, reasons=[f"FAIL run: {exc}"])
        (run.run_dir / VERDICT_FILE).write_bytes(orjson.dumps(verdict.model_dump()))
        environment.process_exit_code = 0 if verdict.passed else 1
    summary = write_report(run.run_dir)
    if summary.verdict is not None:
        log.info("llmload: verdict %s", "PASS" if summary.verdict.passed else "FAIL")
        for reason in summary.verdict.reasons:
            log.info("llmload:   %s", reason)
    r = summary.requests
    log.info(
        "llmload: %d scheduled = %d ok + %d failed + %d cancelled + %d not sent (+ %d in the warm-up); report: %s",
        r.scheduled,
        r.ok,
        r.failed,
        r.cancelled,
        r.not_sent,
        r.warmup,
        run.run_dir / REPORT_FILE,
    )
    for warning in summary.run.warnings:
        log.warning("llmload: %s", warning)


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_: Any) -> None:
    """Ctrl-C or SIGTERM: stop the users first, so their records are flushed into the report."""
    runner = environment.runner
    if _state.run is not None and not _state.run.finished and isinstance(runner, (LocalRunner, MasterRunner)):
        runner.stop()


class ChatUser(User):
    """One request slot: claims the next planned arrival and plays it (one request, or in trace
    mode one session with its think times)."""

    def on_start(self) -> None:
        run = _state.run
        assert run is not None and run.dispatcher is not None, "test_start did not set up the run"
        config = run.config
        host = self.host or self.environment.host
        self._client = ChatClient(host, api_key=config.options.api_key or None, limits=config.limits)
        self._sender = TurnSender(
            self._client,
            run.dispatcher,
            lambda record: _sink(self.environment, run, record),
            model=run.model,
            tokenizer=get_tokenizer(config.workload.spec.tokenizer),
            history_turns=config.options.history_turns or config.workload.spec.history_turns,
        )
        self._dispatcher = run.dispatcher

    @task
    def replay_next_session(self) -> None:
        arrival = self._dispatcher.claim()
        if arrival is None:
            gevent.sleep(FLUSH_INTERVAL_S)  # plan over: idle until the shape ends the run
            return
        self._sender.play(arrival)

    def on_stop(self) -> None:
        self._client.close()


class StagedRamp(LoadTestShape):
    """Keeps enough users for the open-loop plan and ends the run when every record is in.

    Users are request slots (session slots in trace mode), not the load: the rate comes from the
    arrival plan. The shape grows the user count when arrivals wait for a free user, up to
    --max-users; past that the shortfall shows as schedule delay and achieved < target.
    """

    SPAWN_RATE_PER_PROCESS = 100.0  # the most Locust starts per process without warning of trouble

    def __init__(self) -> None:
        super().__init__()
        self._users = 0

    @property
    def spawn_rate(self) -> float:
        """Users started per second across the fleet: Locust shares it out among the workers."""
        workers = self.runner.worker_count if isinstance(self.runner, MasterRunner) else 1
        return self.SPAWN_RATE_PER_PROCESS * max(1, workers)

    def tick(self) -> tuple[int, float] | None:
        config, run = _state.config, _state.run
        if config is None:
            return None
        if run is None or run.manifest is None:
            self._users = self._users or config.initial_users()
            return self._users, self.spawn_rate
        now = time.time()
        plan_end = run.manifest.started_at + config.end_s
        fleet = _fleet(self.runner.environment, run) if self.runner else WorkerState()
        if now >= plan_end and fleet.done:
            return None
        if now >= plan_end + run.manifest.drain_s + 10:
            log.warning("llmload: workers did not report done within the drain time; stopping")
            return None
        spawning = self.runner is not None and self.runner.state == STATE_SPAWNING
        idle = fleet.users - fleet.busy
        if not spawning and now < plan_end and (fleet.backlog > 0 or idle < max(2, 0.1 * self._users)):
            grown = min(config.options.max_users, math.ceil(self._users * 1.5) + fleet.backlog)
            if grown > self._users:
                log.info(
                    "llmload: %d of %d users busy, %d arrivals waiting: %d users",
                    fleet.busy,
                    fleet.users,
                    fleet.backlog,
                    grown,
                )
                self._users = grown
        return self._users, self.spawn_rate
