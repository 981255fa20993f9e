"""A distributed run's coordination, wired to Locust's messages: the master waits for its workers,
gives each a share of the arrivals, hears their records and watches for a lost one (llmload.fleet);
a worker runs its share only if it was there at the start and reaches the target, streams its
records to the master, and takes over a lost worker's arrivals when the master hands them over."""

from __future__ import annotations

import argparse
import logging
import socket
import time
from dataclasses import asdict
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import STATE_MISSING, STATE_RUNNING, STATE_SPAWNING, MasterRunner, WorkerRunner

from llmload.fleet import Fleet
from llmload.locust import messaging
from llmload.locust.messaging import WorkerState
from llmload.locust.state import FLUSH_INTERVAL_S, STATE, ProcessRun
from llmload.server.reach import unreachable

log = logging.getLogger("llmload")

WORKERS_WAIT_S = 300.0  # a headless master's wait for --expect-workers, unless --expect-workers-max-wait says


def listen_as_worker(runner: WorkerRunner) -> None:
    """A worker hears its master hand over a lost worker's arrivals."""
    runner.register_message(messaging.HANDOVER_MESSAGE, _on_handover)


def listen_as_master(environment: Environment, runner: MasterRunner, options: argparse.Namespace) -> None:
    """The master hears its workers' records and a worker that cannot reach the target; headless, it
    stops waiting for workers that never connect."""
    runner.register_message(messaging.RECORDS_MESSAGE, _on_worker_records)
    runner.register_message(messaging.UNREACHABLE_MESSAGE, _on_unreachable_target)
    if options.headless:  # a worker that cannot reach the master must not hang it
        gevent.spawn(_wait_for_workers, environment, options.expect_workers_max_wait or WORKERS_WAIT_S)
        options.expect_workers_max_wait = 0  # llmload's wait, with its own line and exit code


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


def keep_fleet(environment: Environment, runner: MasterRunner, run: ProcessRun) -> None:
    """The master's ledger of the workers connected at the start, each given its index (sent to them
    with the spawn message), and the watch that finds a lost one."""
    options = environment.parsed_options
    assert options is not None
    indexes = {client.id: i for i, client in enumerate(runner.clients.all)}
    options.llmload_worker_indexes = indexes
    run.workers = {client_id: WorkerState() for client_id in indexes}
    plan = run.plan
    run.fleet_ledger = Fleet(plan.arrival_plan(), plan.stages, run.run_id, run.clock.start_wall, list(indexes))
    run.greenlets.append(gevent.spawn(_watch_workers, environment, run))


def leave_run_in_progress(environment: Environment, which: str) -> None:
    """A worker that joined after the start has no share of the arrivals; it quits (exit code 0), so
    Locust gives the users it would hold back to the workers that have one."""
    while environment.runner is None:  # Locust is still building this worker's runner
        gevent.sleep(0.05)
    log.warning("llmload: this worker joined %s after it started: it has no share of its arrivals; it leaves", which)
    environment.runner.quit()


def worker_may_run(
    environment: Environment, runner: WorkerRunner, options: argparse.Namespace, run: ProcessRun
) -> bool:
    """A worker runs its share if it has one (it was there when the run started) and reaches the
    target: one that cannot must not turn its share into connection errors charged to the server,
    so it tells the master, which ends the run."""
    if runner.client_id not in options.llmload_worker_indexes:
        gevent.spawn(leave_run_in_progress, environment, f"run {run.run_id}")
        return False
    run.address = _address_towards(options.master_host, options.master_port)
    refusals = ((host, unreachable(host, run.access)) for host in run.replicas.hosts)
    host, error = next(((host, error) for host, error in refusals if error is not None), ("", None))
    if error is None:
        return True
    log.error("llmload: this worker (%s) cannot reach the target %s: %s", run.address, host, error)
    runner.send_message(messaging.UNREACHABLE_MESSAGE, {"target": host, "error": error, "address": run.address})
    return False


def _address_towards(host: str, port: int) -> str:
    """This machine's address on the route to `host` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def send_records(runner: WorkerRunner, run: ProcessRun) -> None:
    """A worker's records since its last message, with its state, to the master."""
    assert run.dispatcher is not None
    batch, run.outbox = run.outbox, []
    state = messaging.local_state(run.dispatcher, runner.user_count)
    message = messaging.worker_message(batch, state, run.cpu_max, run.dispatcher, run.address)
    runner.send_message(messaging.RECORDS_MESSAGE, message)


def _on_handover(environment: Environment, msg: Any, **_: Any) -> None:
    """The master hands this worker part of a lost worker's arrivals (or, in a closed loop, its slots)."""
    run = STATE.run
    if run is not None and run.dispatcher is not None and not run.finished:
        positions, slots = msg.data["positions"], [(k, r, q) for k, r, q in msg.data["slots"]]
        run.dispatcher.adopt(positions, slots)
        taken = f"{len(positions)} arrivals" if positions else "conversation slots"
        log.info("llmload: took over %s of a lost worker", taken)


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
            for node_id, handover in loss.handed_over.items():
                runner.send_message(messaging.HANDOVER_MESSAGE, asdict(handover), client_id=node_id)
            if options.on_worker_loss == "stop":
                environment.process_exit_code = 2
                gevent.spawn(runner.stop)
