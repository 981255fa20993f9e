"""This process's part of a run, and the state the event handlers of `process` and `distributed`
share: one place both import, so neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass, field

import gevent

from llmload.access import Access
from llmload.fleet import Fleet
from llmload.gates.criteria import SoakCriteria
from llmload.locust import messaging
from llmload.locust.messaging import WorkerState
from llmload.model_mix import ModelMix
from llmload.models import RequestRecord
from llmload.observe.host import StealMeter
from llmload.plan import RunPlan
from llmload.recorder import RunRecorder
from llmload.replay import Dispatcher
from llmload.replicas import Replicas
from llmload.schedule import RunClock
from llmload.server.request import RequestShape

FLUSH_INTERVAL_S = 1.0  # how often records are shipped, arrivals expired and the master looks for lost workers


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
