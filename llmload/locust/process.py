"""This process's part of a run, wired to Locust's events.

In a local run one process does everything. In a distributed run the master writes the run
directory (llmload.recorder), decides the user count and keeps the fleet's ledger (llmload.fleet:
a lost worker's requests recorded, its arrivals handed to the others); each worker checks it can
reach the target, replays its share of the arrivals (llmload.replay) and streams its records to
the master (messaging).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import signal
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import openai
from locust import events
from locust.env import Environment
from locust.runners import STATE_MISSING, STATE_RUNNING, STATE_SPAWNING, LocalRunner, MasterRunner, WorkerRunner

from llmload import rundir
from llmload.access import INSECURE_WARNING, Access, tls_reason
from llmload.errors import InputError
from llmload.fleet import Fleet
from llmload.gates.verdict import SoakCriteria, criteria_from_args
from llmload.live import LiveStats
from llmload.locust import messaging, views
from llmload.locust.flags import plan_flags
from llmload.locust.messaging import WorkerState
from llmload.model_mix import ModelMix
from llmload.models import EXIT_CODES, PrefixCacheReset, RequestRecord, ServerIdentity
from llmload.observe.gpu import gpu_reader
from llmload.plan import RunPlan
from llmload.recorder import RunRecorder
from llmload.replay import Dispatcher, RequestDispatcher, StealMeter, TraceDispatcher, WorkerShare
from llmload.replicas import Replicas
from llmload.schedule import ArrivalPlan, ArrivalSchedule, RunClock
from llmload.server.cache_reset import reset_prefix_caches
from llmload.server.detect import identify
from llmload.server.kinds import kind
from llmload.server.request import RequestShape, parse_extra_body, server_line
from llmload.sim.process import EMBEDDED_TARGET_ARGS, SimProcess
from llmload.workload import Workload

log = logging.getLogger("llmload")

FLUSH_INTERVAL_S = 1.0
LIVE_TICK_S = 2.0  # live gauges and the LLM tab
CONSOLE_EVERY_S = 10.0  # a headless run's live line
START_LEAD_S = 1.0  # time for users to spawn, and for the master's spawn messages to reach every worker
TARGET_PROBE_TIMEOUT_S = 3.0  # a worker's TCP connect to the target before its first arrival
WORKERS_WAIT_S = 300.0  # a headless master's wait for --expect-workers, unless --expect-workers-max-wait says
# the HTTP client under the openai SDK (httpx; httpx2 in newer releases), which logs each request at INFO
OPENAI_HTTP_LOGGERS = ("httpx", "httpx2")


@dataclass
class ProcessRun:
    """This process's part of one run (a local run, the master, or one worker)."""

    plan: RunPlan
    clock: RunClock
    run_id: str
    models: ModelMix
    replicas: Replicas  # where the sessions go; the first stands for all (kind, model list, /metrics)
    worker: int
    access: Access  # the key, headers and TLS trust of every connection to the target
    shape: RequestShape  # what this server kind is sent
    session_header: str | None = None  # the header that carries each session's id (--session-header)
    dispatcher: Dispatcher | None = None  # processes that run users
    recorder: RunRecorder | None = None  # the process that writes the run directory
    outbox: list[RequestRecord] = field(default_factory=list)
    workers: dict[str, WorkerState] = field(default_factory=dict)
    cpu_max: float = 0.0
    steal: StealMeter = field(default_factory=StealMeter)
    greenlets: list[gevent.Greenlet] = field(default_factory=list)
    finished: bool = False
    plan_done: bool = False  # the shape ended the run: the plan and its drain over; else it was stopped
    fleet_ledger: Fleet | None = None  # the master's: who owns which arrivals, who was lost
    address: str = ""  # a worker's address as its master sees it

    @property
    def plan_end(self) -> float:
        return self.clock.start_wall + self.plan.end_s

    def fleet(self, users: int) -> WorkerState:
        """Users, busy and backlog summed over every process running users."""
        if self.dispatcher is not None:
            return messaging.local_state(self.dispatcher, users)
        return messaging.fleet(list(self.workers.values()))


@dataclass
class ProcessState:
    plan: RunPlan | None = None  # checked at init on master/local: bad flags fail before the run
    criteria: SoakCriteria | None = None  # with --verdict
    run: ProcessRun | None = None  # set at each test start
    refused: bool = False  # the web UI's last start was refused: the shape ends it at once


STATE = ProcessState()


def _fail_config(message: str) -> None:
    sys.stderr.write(f"llmload: {message}\n")
    sys.exit(2)


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    for name in OPENAI_HTTP_LOGGERS:  # listing the models is llmload's business, not a line on its console
        logging.getLogger(name).setLevel(logging.WARNING)
    options = environment.parsed_options
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message(messaging.HANDOVER_MESSAGE, _on_handover)
    if options is None or isinstance(environment.runner, WorkerRunner):
        return
    try:
        STATE.plan = RunPlan.build(plan_flags(options))
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
                _require_reachable(host, access)
    except InputError as exc:
        _fail_config(str(exc))
    if access.insecure:
        log.warning("llmload: %s", INSECURE_WARNING)
    if not environment.host:
        environment.host = _start_embedded_target()
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(messaging.RECORDS_MESSAGE, _on_worker_records)
        environment.runner.register_message(messaging.UNREACHABLE_MESSAGE, _on_unreachable_target)
        if options.headless:  # a worker that cannot reach the master must not hang it
            gevent.spawn(_wait_for_workers, environment, options.expect_workers_max_wait or WORKERS_WAIT_S)
            options.expect_workers_max_wait = 0  # llmload's wait, with its own line and exit code
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


def _wait_for_workers(environment: Environment, wait_s: float) -> None:
    """A headless master whose --expect-workers did not all connect in time ends with exit code 2 and
    says why, instead of waiting for ever (Locust's default)."""
    runner, options = environment.runner, environment.parsed_options
    assert isinstance(runner, MasterRunner) and options is not None
    gevent.sleep(wait_s)
    connected = len(runner.clients.ready) + len(runner.clients.spawning) + len(runner.clients.running)
    if STATE.run is not None or connected >= options.expect_workers:
        return
    log.error(
        "llmload: %d of %d workers connected in %g s (--expect-workers-max-wait): a worker that cannot reach this"
        " master at %s:%d never joins; check the workers' --master-host and --master-port, and that the port is"
        " open to them. No run was started (exit code 2)",
        connected, options.expect_workers, wait_s, options.master_bind_host, options.master_bind_port,
    )  # fmt: skip
    runner.quit()
    raise SystemExit(2)


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


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    runner, options = environment.runner, environment.parsed_options
    if runner is None:  # a worker whose master was already running: its spawn came while Locust built it
        gevent.spawn(_leave_run_in_progress, environment, "a run")
        return
    assert options is not None and environment.host
    worker = isinstance(runner, WorkerRunner)
    try:
        plan = STATE.plan if not worker else None
        plan = plan or RunPlan.build(plan_flags(options))
        access = Access.from_options(options)
        server: ServerIdentity | None = None
        cache_reset: PrefixCacheReset | None = None
        if worker:  # the master's choices, sent with the spawn message
            models = ModelMix.of(options.llmload_models)
            replicas = Replicas(tuple(options.llmload_replicas))
            start_wall, run_id = options.llmload_start_wall, options.llmload_run_id
            server_kind = kind(options.llmload_server_kind)
        else:
            replicas = Replicas.parse(environment.host)
            if not isinstance(runner, MasterRunner):
                for host in replicas.hosts:
                    _require_reachable(host, access)
            server = identify(replicas.primary, access, options.server_kind)
            server_kind = kind(server.kind)
            if options.reset_prefix_cache:
                cache_reset = reset_prefix_caches(replicas.hosts, access, server_kind)
                done = "emptied: " if cache_reset.reset else "not emptied: "
                log.info("llmload: prefix cache %s%s", done, cache_reset.how)
            models = _resolve_models(replicas.primary, options, plan.workload, access)
            start_wall = time.time() + START_LEAD_S
            # --run-id itself stays as given: a second start from the web UI names its own run
            run_id = options.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{plan.workload.spec.name}"
            options.llmload_run_id, options.llmload_start_wall = run_id, start_wall
            options.llmload_models = [f"{share.name}:{share.weight!r}" for share in models.shares]  # to the workers
            options.llmload_server_kind = server.kind
            options.llmload_replicas = list(replicas.hosts)
            rundir.claim(Path(options.reports_dir) / run_id)
        shape = RequestShape(server_kind, extra=parse_extra_body(options.extra_body))
    except InputError as exc:
        _refuse_start(environment, str(exc))
        return
    clock = RunClock(time.perf_counter() + (start_wall - time.time()), start_wall)
    run = ProcessRun(plan, clock, run_id, models, replicas, 0, access, shape, options.session_header)
    if isinstance(runner, MasterRunner):
        indexes = {client.id: i for i, client in enumerate(runner.clients.all)}
        options.llmload_worker_indexes = indexes
        run.workers = {client_id: WorkerState() for client_id in indexes}
        run.fleet_ledger = Fleet(ArrivalPlan.of(plan.arrivals, plan.workload.sessions), plan.stages, run_id,
                                 start_wall, list(indexes))  # fmt: skip
        run.greenlets.append(gevent.spawn(_watch_workers, environment, run))
    if isinstance(runner, WorkerRunner) and not _worker_may_run(environment, runner, options, run):
        STATE.run = run  # idle: its users wait, it sends nothing
        return
    if not isinstance(runner, MasterRunner):
        index = options.llmload_worker_indexes[runner.client_id] if isinstance(runner, WorkerRunner) else 0
        count = len(options.llmload_worker_indexes) if isinstance(runner, WorkerRunner) else 1
        run.worker = index
        share = WorkerShare(run_id, index, count, plan.flags.drain_s)
        if isinstance(plan.arrivals, ArrivalSchedule):
            run.dispatcher = RequestDispatcher(
                plan.arrivals, plan.workload.sessions, clock, share, plan.flags.first_session
            )
        else:
            run.dispatcher = TraceDispatcher(plan.arrivals, plan.workload.sessions, clock, share)
        run.greenlets.append(gevent.spawn(_flush_loop, environment, run))
    if not worker:
        manifest = plan.manifest(
            run_id=run_id, replicas=replicas, models=models, started_at=start_wall,
            workers=max(1, len(run.workers)), server=server, access=access.note(replicas.primary),
            prefix_cache_reset=cache_reset, session_header=options.session_header,
        )  # fmt: skip
        gpu = gpu_reader(options.gpu_metrics, replicas.primary)
        if gpu is not None:
            log.info("llmload: GPU memory and utilisation from %s", gpu.url)
        run_dir = Path(options.reports_dir) / run_id
        run.recorder = RunRecorder(
            run_dir, plan, manifest, metrics_interval_s=options.metrics_interval, access=access, gpu=gpu
        )
        run.greenlets.append(gevent.spawn(_live_loop, environment, run))
        what = "request arrivals" if isinstance(plan.arrivals, ArrivalSchedule) else "trace sessions"
        warmup = plan.stages[0].duration_s if plan.stages[0].warmup else 0.0
        log.info(
            "llmload: run %s -> %s (%d planned %s; %g s unjudged warm-up)",
            run_id, run_dir, plan.planned(), what, warmup,
        )  # fmt: skip
        if server is not None:
            log.info("llmload: %s", server_line(server, shape, lengths_asked=plan.workload.asks_lengths))
    STATE.run = run


def _worker_may_run(
    environment: Environment, runner: WorkerRunner, options: argparse.Namespace, run: ProcessRun
) -> bool:
    """A worker runs its share if it has one (it was there when the run started) and reaches the
    target: one that cannot must not turn its share into connection errors charged to the server,
    so it tells the master, which ends the run."""
    if runner.client_id not in options.llmload_worker_indexes:
        gevent.spawn(_leave_run_in_progress, environment, f"run {run.run_id}")
        return False
    run.address = _address_towards(options.master_host, options.master_port)
    unreachable = ((host, _unreachable(host, run.access)) for host in run.replicas.hosts)
    host, error = next(((host, error) for host, error in unreachable if error is not None), ("", None))
    if error is None:
        return True
    log.error("llmload: this worker (%s) cannot reach the target %s: %s", run.address, host, error)
    runner.send_message(messaging.UNREACHABLE_MESSAGE, {"target": host, "error": error, "address": run.address})
    return False


def _leave_run_in_progress(environment: Environment, which: str) -> None:
    """A worker that joined after the start has no share of the arrivals; it quits (exit code 0), so
    Locust gives the users it would hold back to the workers that have one."""
    while environment.runner is None:  # Locust is still building this worker's runner
        gevent.sleep(0.05)
    log.warning("llmload: this worker joined %s after it started: it has no share of its arrivals; it leaves", which)
    environment.runner.quit()


def _address_towards(host: str, port: int) -> str:
    """This machine's address on the route to `host` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def _require_reachable(host: str, access: Access) -> None:
    """An InputError when no connection to the target opens, or its TLS handshake fails: no request is
    sent to a host where nothing listens or that cannot be trusted (each would be charged to it as a failure)."""
    parsed = urllib.parse.urlsplit(host)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError(f"--host {host} is not a URL: give http://HOST:PORT (or https://)")
    if (error := _unreachable(host, access)) is not None:
        raise InputError(error if error.startswith("TLS") else f"nothing answers at {host}: {error}")


def _unreachable(url: str, access: Access) -> str | None:
    """Why a TCP connection to the target's host and port fails, or an https target's TLS handshake
    (a sentence of its own, starting "TLS"), or None when the connection opens."""
    parsed = urllib.parse.urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        connection = socket.create_connection((parsed.hostname or "", port), timeout=TARGET_PROBE_TIMEOUT_S)
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            return f"no answer in {TARGET_PROBE_TIMEOUT_S:g} s"
        reason = str(exc.strerror or exc)
        return reason[:1].lower() + reason[1:]  # "connection refused", as part of a sentence
    with connection:
        return _tls_refusal(connection, parsed, access) if parsed.scheme == "https" else None


def _tls_refusal(connection: socket.socket, url: urllib.parse.SplitResult, access: Access) -> str | None:
    """Why the target's TLS refuses this client, or None. A HEAD request follows the handshake: with TLS
    1.3 a missing client certificate is refused only then, by an alert or (asyncio's servers: vLLM's)
    a connection closed without a word."""
    try:
        with access.ssl_context().wrap_socket(connection, server_hostname=url.hostname) as tls:
            tls.sendall(f"HEAD / HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode())
            if not tls.recv(1):
                return (
                    f"TLS: {url.geturl()} closed the connection after the handshake without answering: it may require"
                    " a client certificate (--client-cert FILE, --client-key FILE)"
                )
    except TimeoutError:
        return None  # the handshake went through; a slow answer is not this check's business
    except OSError as exc:
        reason = tls_reason(exc) or str(exc)
        hint = " (--ca-cert FILE trusts the CA that signed it; --insecure verifies nothing)"
        return f"TLS handshake with {url.geturl()} failed: {reason}{hint if 'verify' in reason else ''}"
    return None


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
            _send_records(runner, run)


def _expire(environment: Environment, run: ProcessRun, now: float, *, stopping: bool = False) -> None:
    """Arrivals the run will never send become not_sent: after the plan's end, or at a stop."""
    assert run.dispatcher is not None
    if now < run.dispatcher.plan_end and not stopping:
        return
    for arrival in run.dispatcher.expire(now):
        session_id = arrival.session.session.id if arrival.session is not None else ""
        sink(environment, run, run.dispatcher.record(session_id, 0, arrival.at, None))


def _send_records(runner: WorkerRunner, run: ProcessRun) -> None:
    assert run.dispatcher is not None
    batch, run.outbox = run.outbox, []
    state = messaging.local_state(run.dispatcher, runner.user_count)
    message = messaging.worker_message(batch, state, run.cpu_max, run.dispatcher, run.address)
    runner.send_message(messaging.RECORDS_MESSAGE, message)


def _on_handover(environment: Environment, msg: Any, **_: Any) -> None:
    """The master hands this worker part of a lost worker's arrivals."""
    run = STATE.run
    if run is not None and run.dispatcher is not None and not run.finished:
        run.dispatcher.adopt(msg.data["positions"])
        log.info("llmload: took over %d arrivals of a lost worker", len(msg.data["positions"]))


def _on_worker_records(environment: Environment, msg: Any, **_: Any) -> None:
    run = STATE.run
    if run is None or run.recorder is None or run.finished or run.fleet_ledger is None:
        return
    ledger = run.fleet_ledger.heard(msg.node_id, msg.data, time.time() - run.clock.start_wall)
    if ledger is None:  # declared lost and back, or never a member: its share is already accounted for
        return
    records, sends = messaging.receive(run.workers, msg.node_id, msg.data)
    run.fleet_ledger.note_records(ledger, records)
    run.recorder.add(records)
    run.recorder.live.add_sends(sends, until=min(worker.sends_until for worker in run.workers.values()))


def _on_unreachable_target(environment: Environment, msg: Any, **_: Any) -> None:
    """A worker cannot reach the target: the run ends with exit code 2, none of its share charged to the server."""
    run, runner = STATE.run, environment.runner
    if run is None or run.fleet_ledger is None or runner is None or run.finished:
        return
    reason = f"cannot reach the target {msg.data['target']}: {msg.data['error']}"
    ledger = run.fleet_ledger.refuse(msg.node_id, reason, msg.data["address"])
    name = ledger.name if ledger is not None else f"worker {msg.node_id} ({msg.data['address']})"
    log.error("llmload: %s %s; ending the run (exit code 2): none of its share is charged to the server", name, reason)
    environment.process_exit_code = 2
    gevent.spawn(runner.stop)


def _watch_workers(environment: Environment, run: ProcessRun) -> None:
    """The master, each second: a worker Locust found missing (no heartbeat) is lost. Its records are
    written here (llmload.fleet); by default the others take over its arrivals, with --on-worker-loss
    stop the run ends with exit code 2."""
    runner, options = environment.runner, environment.parsed_options
    assert isinstance(runner, MasterRunner) and options is not None and run.fleet_ledger is not None
    while True:
        gevent.sleep(FLUSH_INTERVAL_S)
        if runner.state not in (STATE_SPAWNING, STATE_RUNNING):  # stopping: Locust lets go of its workers
            continue
        for ledger in [w for w in run.fleet_ledger.workers.values() if w.active]:
            client = runner.clients.get(ledger.node_id)
            if client is not None and client.state != STATE_MISSING:
                continue
            loss = run.fleet_ledger.lose(ledger.node_id, time.time() - run.clock.start_wall, options.on_worker_loss)
            run.workers.pop(ledger.node_id, None)
            assert run.recorder is not None
            run.recorder.add(loss.records)
            run.recorder.live.note(loss.line)
            log.warning("llmload: %s", loss.line)
            for node_id, positions in loss.handed_over.items():
                runner.send_message(messaging.HANDOVER_MESSAGE, {"positions": positions}, client_id=node_id)
            if options.on_worker_loss == "stop":
                environment.process_exit_code = 2
                gevent.spawn(runner.stop)


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
            _send_records(runner, run)
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
