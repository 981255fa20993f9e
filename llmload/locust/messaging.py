"""Distributed runs: each worker ships its records and its state to the master once a second
(Locust's custom messages), with what it has in flight; the master sums the fleet's state for the
shape, hands a lost worker's arrivals to the others, and hears from a worker that cannot reach the
target."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from llmload.models import RequestRecord
from llmload.replay import Dispatcher

RECORDS_MESSAGE = "llmload_records"
HANDOVER_MESSAGE = "llmload_handover"  # master -> worker: fleet.Handover, the positions or slots it now takes too
UNREACHABLE_MESSAGE = "llmload_unreachable"  # worker -> master: {"target": url, "error": why}


@dataclass
class WorkerState:
    """Users, requests in flight, arrivals waiting for a user, plan done; the most CPU seen."""

    users: int = 0
    busy: int = 0
    backlog: int = 0
    done: bool = False
    cpu_max: float = 0.0
    sends_until: float = 0.0  # run offset up to which its sends have reached the master


def local_state(dispatcher: Dispatcher, users: int) -> WorkerState:
    return WorkerState(users, dispatcher.busy, dispatcher.backlog(time.perf_counter()), dispatcher.done)


def fleet(states: list[WorkerState]) -> WorkerState:
    """Every worker's state summed (done when all are)."""
    return WorkerState(
        sum(s.users for s in states),
        sum(s.busy for s in states),
        sum(s.backlog for s in states),
        bool(states) and all(s.done for s in states),
    )


def worker_message(
    records: list[RequestRecord],
    state: WorkerState,
    cpu_max: float,
    dispatcher: Dispatcher,
    address: str,
) -> dict[str, Any]:
    """What a worker sends each second: its records, its state, when its requests left, how many it
    sent and which are in flight (what the master records as lost if this worker dies)."""
    sends = dispatcher.take_sends()
    clock = dispatcher.clock
    in_flight = [
        [-1 if f.seq is None else f.seq, clock.offset(f.scheduled), clock.offset(f.sent), f.session_id, f.turn]
        for f in dispatcher.in_flight.values()
    ]
    return {
        "address": address,
        "sent_total": dispatcher.sent_total,
        "in_flight": in_flight,
        "records": [r.model_dump() for r in records],
        "sends": sends[0],
        "sends_until": sends[1],
        "users": state.users,
        "busy": state.busy,
        "backlog": state.backlog,
        "done": state.done,
        "cpu": cpu_max,
    }


def receive(
    workers: dict[str, WorkerState], node_id: str, data: dict[str, Any]
) -> tuple[list[RequestRecord], list[float]]:
    """The master's side: the worker's state noted, its records and sends returned."""
    state = workers.setdefault(node_id, WorkerState())
    state.users, state.busy, state.backlog, state.done = data["users"], data["busy"], data["backlog"], data["done"]
    state.cpu_max = max(state.cpu_max, data["cpu"])
    state.sends_until = data["sends_until"]
    # dumped from RequestRecords by our own workers: rebuilt without validating them again
    return [RequestRecord.model_construct(**row) for row in data["records"]], data["sends"]
