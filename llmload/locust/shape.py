"""The load shape: enough users for the open-loop plan, and the end of the run once every record is in."""

from __future__ import annotations

import logging
import math
import time

import gevent
from locust import LoadTestShape
from locust.runners import STATE_SPAWNING, MasterRunner

from llmload.locust.messaging import WorkerState
from llmload.locust.state import STATE

log = logging.getLogger("llmload")
TICK_S = 1.0  # how often Locust asks the shape (its shape worker)
END_POLL_S = 0.05  # how often the end of the run is looked for near it


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
        plan, run = STATE.plan, STATE.run
        if plan is None or STATE.refused:
            return None
        if run is None or run.recorder is None or run.finished:  # before this start's test_start
            self._users = plan.initial_users()
            return self._users, self.spawn_rate
        plan_end, asked = run.plan_end, time.time()
        while True:
            now = time.time()
            fleet = run.fleet(self.runner.user_count) if self.runner else WorkerState()
            if now >= plan_end and fleet.done:
                run.plan_done = True
                return None
            if now >= plan_end + plan.flags.drain_s + 10:
                log.warning("llmload: workers did not report done within the drain time; stopping")
                run.plan_done = True
                return None
            # Locust asks once a second; from a second before the plan's end this tick looks again every
            # END_POLL_S until the next, so the run ends with its last record, not up to a second later
            if now < plan_end - TICK_S or now + END_POLL_S >= asked + TICK_S:
                break
            gevent.sleep(END_POLL_S)
        spawning = self.runner is not None and self.runner.state == STATE_SPAWNING
        idle = fleet.users - fleet.busy
        if not spawning and now < plan_end and (fleet.backlog > 0 or idle < max(2, 0.1 * self._users)):
            grown = min(plan.flags.max_users, math.ceil(self._users * 1.5) + fleet.backlog)
            if grown > self._users:
                log.info(
                    "llmload: %d of %d users busy, %d arrivals waiting: %d users",
                    fleet.busy, fleet.users, fleet.backlog, grown,
                )  # fmt: skip
                self._users = grown
        return self._users, self.spawn_rate
