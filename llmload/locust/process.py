"""This process's part of a run, wired to Locust's events.

In a local run one process does everything: it checks the target, replays every arrival and
writes the run directory (llmload.recorder). In a distributed run the master chooses the run (its
id, start, models) and writes the run directory, and each worker replays its share of the arrivals
(llmload.replay); their coordination, the fleet's ledger included, is `distributed`'s.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from llmload import rundir
from llmload.access import INSECURE_WARNING, Access
from llmload.errors import InputError
from llmload.gates.criteria import criteria_from_args
from llmload.live import LiveStats
from llmload.locust import distributed, views
from llmload.locust.state import FLUSH_INTERVAL_S, STATE, ProcessRun
from llmload.model_mix import ModelMix
from llmload.models import EXIT_CODES, PrefixCacheReset, RequestRecord, ServerIdentity
from llmload.observe.gpu import gpu_reader
from llmload.plan import PlanFlags, RunPlan
from llmload.recorder import RunRecorder
from llmload.replay import ConversationDispatcher, RequestDispatcher, TraceDispatcher, WorkerShare
from llmload.replicas import Replicas
from llmload.schedule import ArrivalSchedule, RunClock
from llmload.server.cache_reset import reset_prefix_caches
from llmload.server.detect import identify
from llmload.server.kinds import kind
from llmload.server.reach import require_reachable
from llmload.server.request import RequestShape, parse_extra_body, server_line
from llmload.sim.process import EMBEDDED_TARGET_ARGS, SimProcess
from llmload.workload import Workload

log = logging.getLogger("llmload")

LIVE_TICK_S = 2.0  # live gauges and the LLM tab
CONSOLE_EVERY_S = 10.0  # a headless run's live line
START_LEAD_S = 1.0  # time for users to spawn, and for the master's spawn messages to reach every worker
# the HTTP client under the openai SDK (httpx; httpx2 in newer releases), which logs each request at INFO
OPENAI_HTTP_LOGGERS = ("httpx", "httpx2")


def _fail_config(message: str) -> None:
    sys.stderr.write(f"llmload: {message}\n")
    sys.exit(2)


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    for name in OPENAI_HTTP_LOGGERS:  # listing the models is llmload's business, not a line on its console
        logging.getLogger(name).setLevel(logging.WARNING)
    options = environment.parsed_options
    if isinstance(environment.runner, WorkerRunner):
        distributed.listen_as_worker(environment.runner)
    if options is None or isinstance(environment.runner, WorkerRunner):
        return
    try:
        STATE.plan = RunPlan.build(PlanFlags.from_options(options))
        access = Access.from_options(options)  # a certificate that does not load is refused before the run
        parse_extra_body(options.extra_body)  # refused here, before Locust starts, rather than at each start
        if options.model:
            ModelMix.of(options.model)
        _refuse_repeated_host(sys.argv[1:])
        replicas = Replicas.parse(environment.host) if environment.host else None
        STATE.criteria = criteria_from_args(options) if options.verdict else None
        criteria = STATE.criteria
        if criteria is not None and criteria.min_goodput_ratio is not None and STATE.plan.goodput_slo is None:
            raise InputError("--min-goodput-ratio needs the SLOs goodput counts against: give --goodput-slo")
        # a local run checks before Locust starts (the web UI at each start); a master's workers check themselves
        if options.headless and replicas is not None and not isinstance(environment.runner, MasterRunner):
            for host in replicas.hosts:
                require_reachable(host, access)
    except InputError as exc:
        _fail_config(str(exc))
    if access.insecure:
        log.warning("llmload: %s", INSECURE_WARNING)
    if not environment.host:
        environment.host = _start_embedded_target()
    if isinstance(environment.runner, MasterRunner):
        distributed.listen_as_master(environment, environment.runner, options)
    if options.prometheus_port is not None:
        try:
            views.serve_prometheus(options.prometheus_port, _current_live)
        except OSError as exc:
            _fail_config(f"--prometheus-port {options.prometheus_port}: {exc.strerror}")
    if environment.web_ui is not None:
        views.add_llm_tab(environment.web_ui, _current_live)
    # Locust (2.47) installs its SIGTERM handler only after a headless shape run returns, so
    # until then SIGTERM would kill the process with records unflushed: make it a Ctrl-C.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)


def _current_live() -> LiveStats | None:
    run = STATE.run
    return run.recorder.live if run is not None and run.recorder is not None else None


def _start_embedded_target() -> str:
    """No --host: serve the run from the embedded simulator, and say so loudly."""
    sim = SimProcess(*EMBEDDED_TARGET_ARGS)
    try:
        sim.start()
    except InputError as exc:
        _fail_config(f"no --host given and the embedded target did not start: {exc}")
    atexit.register(sim.stop)
    log.warning("llmload: no --host given: started the embedded target (llmload sim, pid %d) at %s", sim.pid, sim.url)
    return sim.url


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _refuse_repeated_host(argv: list[str]) -> None:
    """Locust keeps the last of several --host flags; llmload takes replicas in one, and says so rather
    than load one replica with what was meant for all."""
    given = [arg for arg in argv if arg in ("--host", "-H") or arg.startswith("--host=")]
    if len(given) > 1:
        raise InputError("--host given more than once: give the replicas in one, --host URL,URL or --host @FILE")


def _listed_models(host: str, access: Access) -> list[str]:
    """What /v1/models lists (vLLM lists its LoRA adapters there too); InputError when it cannot be read."""
    import openai  # a second of every Locust start's imports, and only a run that names no model needs it

    client = openai.OpenAI(
        base_url=host.rstrip("/") + "/v1", api_key=access.api_key or "EMPTY", max_retries=0,
        default_headers=dict(access.headers),
        http_client=openai.DefaultHttpxClient(verify=access.ssl_context() if host.startswith("https://") else True),
    )  # fmt: skip
    try:
        return [model.id for model in client.models.list().data]
    except openai.OpenAIError as exc:
        raise InputError(f"cannot list models at {host}/v1/models ({type(exc).__name__}); give --model") from None


def _resolve_models(host: str, options: argparse.Namespace, workload: Workload, access: Access) -> ModelMix:
    """The served models of turns that name none: --model (with their weights), else the workload's, else the
    first one /v1/models lists. A model asked for that the list lacks (by --model or a turn's own `model`) is
    sent all the same (its requests fail as `model_not_found`), and said."""
    named = {turn.model for session in workload.sessions for turn in session.turns if turn.model}
    listed: list[str] | None = None
    if options.model:
        mix = ModelMix.of(options.model)
        named |= {share.name for share in mix.shares}
    elif workload.spec.model:
        mix = ModelMix.single(workload.spec.model)
    else:
        listed = _listed_models(host, access)
        if not listed:
            raise InputError(f"{host}/v1/models lists no model; give --model")
        mix = ModelMix.single(listed[0])
    if named:
        with contextlib.suppress(InputError):
            listed = listed if listed is not None else _listed_models(host, access)
            for name in sorted(named - set(listed)):
                log.warning("llmload: model %s: %s/v1/models does not list it (it lists %s)", name, host,
                            ", ".join(listed) or "none")  # fmt: skip
    return mix


def _refuse_start(environment: Environment, reason: str) -> None:
    """A start that cannot run (a --run-id in use, a target that lists no model). Headless, the
    process ends with exit code 2. In the web UI the run stops and the UI stays up, the reason in
    its log and Exceptions tab, so the user can change the host and start again."""
    runner = environment.runner
    assert runner is not None
    log.error("llmload: %s", reason)
    headless = environment.parsed_options is not None and environment.parsed_options.headless
    if environment.web_ui is None or headless:
        environment.process_exit_code = 2
        gevent.spawn(runner.quit)
        return
    runner.log_exception("local", f"llmload: the run did not start: {reason}", "")
    STATE.refused = True

    def stop() -> None:
        runner.stop()
        STATE.refused = False  # the shape is stopped with the run: the next start begins afresh

    gevent.spawn(stop)


@dataclass(frozen=True)
class _Choice:
    """What every process of a run must agree on: chosen by the master (or a local run) at the start,
    sent to the workers with the spawn message (the options' llmload_* fields)."""

    run_id: str
    start_wall: float
    models: ModelMix
    replicas: Replicas
    server_kind: str

    @classmethod
    def sent(cls, options: argparse.Namespace) -> _Choice:
        """The master's choice, as a worker received it."""
        return cls(
            options.llmload_run_id, options.llmload_start_wall, ModelMix.of(options.llmload_models),
            Replicas(tuple(options.llmload_replicas)), options.llmload_server_kind,
        )  # fmt: skip

    def send(self, options: argparse.Namespace) -> None:
        """Into the options, which the master's spawn message carries to every worker."""
        options.llmload_run_id, options.llmload_start_wall = self.run_id, self.start_wall
        options.llmload_models = [f"{share.name}:{share.weight!r}" for share in self.models.shares]
        options.llmload_server_kind = self.server_kind
        options.llmload_replicas = list(self.replicas.hosts)


@dataclass(frozen=True)
class _TargetFound:
    """What a master or a local run found of the target at its start, for run.json and the console."""

    server: ServerIdentity
    cache_reset: PrefixCacheReset | None


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    """Each start (the web UI may start several runs) builds this process's part of the run, by its role."""
    runner, options = environment.runner, environment.parsed_options
    if runner is None:  # a worker whose master was already running: its spawn came while Locust built it
        gevent.spawn(distributed.leave_run_in_progress, environment, "a run")
        return
    assert options is not None and environment.host
    if isinstance(runner, WorkerRunner):
        _start_worker(environment, runner, options)
    elif isinstance(runner, MasterRunner):
        _start_master(environment, runner, options)
    else:
        _start_local(environment, options)


def _start_local(environment: Environment, options: argparse.Namespace) -> None:
    """One process does everything: it checks the target, chooses the run, replays every arrival and
    writes the run directory."""
    try:
        run, found = _choose_run(environment, options, check_reachable=True)
    except InputError as exc:
        _refuse_start(environment, str(exc))
        return
    _dispatch(environment, run, index=0, count=1)
    _start_recording(environment, options, run, found)
    STATE.run = run


def _start_master(environment: Environment, runner: MasterRunner, options: argparse.Namespace) -> None:
    """The master chooses the run for its workers (each checks the target itself), keeps the fleet's
    ledger and writes the run directory; it replays nothing."""
    try:
        run, found = _choose_run(environment, options, check_reachable=False)
    except InputError as exc:
        _refuse_start(environment, str(exc))
        return
    distributed.keep_fleet(environment, runner, run)
    _start_recording(environment, options, run, found)
    STATE.run = run


def _start_worker(environment: Environment, runner: WorkerRunner, options: argparse.Namespace) -> None:
    """A worker replays its share of the run its master chose; one that may not run stays idle (its
    users wait, it sends nothing)."""
    try:
        plan, access = RunPlan.build(PlanFlags.from_options(options)), Access.from_options(options)
        run = _process_run(plan, access, _Choice.sent(options), options)
    except InputError as exc:
        _refuse_start(environment, str(exc))
        return
    if distributed.worker_may_run(environment, runner, options, run):
        indexes = options.llmload_worker_indexes
        _dispatch(environment, run, index=indexes[runner.client_id], count=len(indexes))
    STATE.run = run


def _choose_run(
    environment: Environment, options: argparse.Namespace, *, check_reachable: bool
) -> tuple[ProcessRun, _TargetFound]:
    """The run a master or a local run starts: the target identified, the models resolved, the run's id
    and start chosen (and passed on to the workers), its directory claimed."""
    assert environment.host
    plan = STATE.plan or RunPlan.build(PlanFlags.from_options(options))
    access = Access.from_options(options)
    replicas = Replicas.parse(environment.host)
    if check_reachable:
        for host in replicas.hosts:
            require_reachable(host, access)
    server = identify(replicas.primary, access, options.server_kind)
    cache_reset = _empty_prefix_caches(replicas, access, server) if options.reset_prefix_cache else None
    models = _resolve_models(replicas.primary, options, plan.workload, access)
    start_wall = time.time() + START_LEAD_S
    # --run-id itself stays as given: a second start from the web UI names its own run
    run_id = options.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{plan.workload.spec.name}"
    choice = _Choice(run_id, start_wall, models, replicas, server.kind)
    choice.send(options)
    rundir.claim(Path(options.reports_dir) / run_id)
    return _process_run(plan, access, choice, options), _TargetFound(server, cache_reset)


def _empty_prefix_caches(replicas: Replicas, access: Access, server: ServerIdentity) -> PrefixCacheReset:
    """--reset-prefix-cache: the run begins cold where the server's kind offers a reset, and says so."""
    cache_reset = reset_prefix_caches(replicas.hosts, access, kind(server.kind))
    done = "emptied: " if cache_reset.reset else "not emptied: "
    log.info("llmload: prefix cache %s%s", done, cache_reset.how)
    return cache_reset


def _process_run(plan: RunPlan, access: Access, choice: _Choice, options: argparse.Namespace) -> ProcessRun:
    """This process's part of the run, on the clock every process shares (the chosen start, in unix seconds)."""
    shape = RequestShape(kind(choice.server_kind), extra=parse_extra_body(options.extra_body))
    clock = RunClock(time.perf_counter() + (choice.start_wall - time.time()), choice.start_wall)
    return ProcessRun(
        plan, clock, choice.run_id, choice.models, choice.replicas, 0, access, shape, options.session_header
    )


def _dispatch(environment: Environment, run: ProcessRun, *, index: int, count: int) -> None:
    """The arrivals of this process's share (all of them in a local run), flushed once a second."""
    plan = run.plan
    run.worker = index
    share = WorkerShare(run.run_id, index, count, plan.flags.drain_s, plan.flags.cache_bust)
    if isinstance(plan.arrivals, ArrivalSchedule):
        run.dispatcher = RequestDispatcher(
            plan.arrivals, plan.workload.sessions, run.clock, share, plan.flags.first_session
        )
    elif plan.closed_loop:
        run.dispatcher = ConversationDispatcher(plan.arrivals, plan.workload.sessions, run.clock, share)
    else:
        run.dispatcher = TraceDispatcher(plan.arrivals, plan.workload.sessions, run.clock, share)
    run.greenlets.append(gevent.spawn(_flush_loop, environment, run))


def _start_recording(
    environment: Environment, options: argparse.Namespace, run: ProcessRun, found: _TargetFound
) -> None:
    """The run directory (llmload.recorder), written by a local run or the master, and its live view."""
    plan, replicas = run.plan, run.replicas
    manifest = plan.manifest(
        run_id=run.run_id, replicas=replicas, models=run.models, started_at=run.clock.start_wall,
        workers=max(1, len(run.workers)), server=found.server, access=run.access.note(replicas.primary),
        prefix_cache_reset=found.cache_reset, session_header=options.session_header,
    )  # fmt: skip
    gpu = gpu_reader(options.gpu_metrics, replicas.primary)
    if gpu is not None:
        log.info("llmload: GPU memory and utilisation from %s", gpu.url)
    run_dir = Path(options.reports_dir) / run.run_id
    run.recorder = RunRecorder(
        run_dir, plan, manifest, metrics_interval_s=options.metrics_interval, access=run.access, gpu=gpu
    )
    run.greenlets.append(gevent.spawn(_live_loop, environment, run))
    what = "request arrivals" if isinstance(plan.arrivals, ArrivalSchedule) else "trace sessions"
    planned = f"{plan.planned()} planned {what}"
    if plan.closed_loop:
        planned = f"closed loop: {'/'.join(str(s.sessions) for s in plan.stages)} conversations in flight by stage"
    warmup = plan.stages[0].duration_s if plan.stages[0].warmup else 0.0
    log.info("llmload: run %s -> %s (%s; %g s unjudged warm-up)", run.run_id, run_dir, planned, warmup)
    log.info("llmload: %s", server_line(found.server, run.shape, lengths_asked=plan.workload.asks_lengths))
    if (unused := plan.unused_weights(run.models)) is not None:
        log.warning("llmload: %s", unused)


def sink(environment: Environment, run: ProcessRun, record: RequestRecord) -> None:
    """Every record: to the run directory (or the master), and to Locust's live statistics."""
    if run.recorder is not None:
        run.recorder.add([record])
    else:
        run.outbox.append(record)
    if record.status in ("not_sent", "cancelled", "abandoned"):  # neither a response nor a failure of the target
        return
    exception = None
    if record.status != "ok":  # failed, or unfinished: the target did not answer in time
        status = f" HTTP {record.http_status}" if record.http_status else ""
        status += f", in-stream error {record.stream_error_code}" if record.stream_error_code else ""
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


def _flush_loop(environment: Environment, run: ProcessRun) -> None:
    """Once a second: expire arrivals the plan no longer holds, ship records, note our CPU."""
    runner = environment.runner
    assert run.dispatcher is not None and runner is not None
    while True:
        gevent.sleep(FLUSH_INTERVAL_S)
        _expire(environment, run, time.perf_counter())
        run.dispatcher.end_drain(time.perf_counter())
        run.cpu_max = max(run.cpu_max, runner.current_cpu_usage)
        if isinstance(runner, WorkerRunner):
            distributed.send_records(runner, run)


def _expire(environment: Environment, run: ProcessRun, now: float, *, stopping: bool = False) -> None:
    """Arrivals the run will never send become not_sent: after the plan's end, or at a stop."""
    assert run.dispatcher is not None
    if now < run.dispatcher.plan_end and not stopping:
        return
    for arrival in run.dispatcher.expire(now):
        session_id = arrival.session.session.id if arrival.session is not None else ""
        sink(environment, run, run.dispatcher.record(session_id, 0, arrival.at, None))


def _live_loop(environment: Environment, run: ProcessRun) -> None:
    """Live gauges, the LLM tab's server state, and in a headless run a line on the console."""
    assert run.recorder is not None and environment.runner is not None
    live = run.recorder.live
    headless = bool(environment.parsed_options and environment.parsed_options.headless)
    last_line = time.monotonic()
    stage = live.current_stage()
    while True:
        gevent.sleep(LIVE_TICK_S)
        fleet = run.fleet(environment.runner.user_count)
        if run.dispatcher is not None:  # a local run: this process sends the requests
            sends, until = run.dispatcher.take_sends()
            live.add_sends(sends, until=until)
        live.see_server(run.recorder.observer.latest())
        live.refresh(users=fleet.users, busy=fleet.busy)
        if not headless:
            continue
        now_in = live.current_stage()
        for ended in live.stages[live.stages.index(stage) : live.stages.index(now_in)]:
            log.info("llmload: %s", views.ended_stage_line(live, ended))
        stage = now_in
        if time.monotonic() - last_line >= CONSOLE_EVERY_S:
            last_line = time.monotonic()
            log.info("llmload: %s", views.console_line(live))


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_: Any) -> None:
    run = STATE.run
    if run is None or run.finished:
        return
    runner = environment.runner
    assert runner is not None
    if run.dispatcher is not None:
        _expire(environment, run, time.perf_counter(), stopping=True)
        run.cpu_max = max(run.cpu_max, runner.current_cpu_usage)
    run.finished = True
    gevent.killall(run.greenlets)
    if isinstance(runner, WorkerRunner):
        if run.dispatcher is not None:
            distributed.send_records(runner, run)
        return
    assert run.recorder is not None
    cpu = max([run.cpu_max, *(s.cpu_max for s in run.workers.values())])
    fleet = run.fleet_ledger.report() if run.fleet_ledger is not None else []
    summary = run.recorder.finish(
        cpu_max_percent=cpu, steal_percent=run.steal.percent, criteria=STATE.criteria, fleet=fleet,
        interrupted=not run.plan_done,
    )  # fmt: skip
    if STATE.criteria is not None and summary.verdict is not None:
        run.recorder.live.verdict = summary.verdict  # the LLM tab shows it after the run
        if environment.process_exit_code != 2:  # 2: a worker lost (--on-worker-loss stop), or the target unreachable
            environment.process_exit_code = EXIT_CODES[summary.verdict.outcome]
        log.info("llmload: verdict %s", summary.verdict.label)
        for reason in summary.verdict.reasons:
            log.info("llmload:   %s", reason)
    r = summary.requests
    log.info(
        "llmload: %d scheduled = %d ok + %d failed + %d unfinished + %d cancelled + %d not sent + %d lost"
        " (+ %d in the warm-up); report: %s",
        r.scheduled, r.ok, r.failed, r.unfinished, r.cancelled, r.not_sent, r.lost, r.warmup,
        run.recorder.run_dir / rundir.REPORT_FILE,
    )  # fmt: skip
    for warning in summary.run.warnings:
        log.warning("llmload: %s", warning)


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_: Any) -> None:
    """Ctrl-C or SIGTERM: stop the users first, so their records are flushed into the report."""
    runner = environment.runner
    if STATE.run is not None and not STATE.run.finished and isinstance(runner, (LocalRunner, MasterRunner)):
        runner.stop()
