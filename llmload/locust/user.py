"""The Locust user: a request slot that claims the next planned arrival and plays it (llmload.replay)."""

from __future__ import annotations

import gevent
from locust import User, task
from locust.runners import STATE_CLEANUP, STATE_STOPPED, STATE_STOPPING

from llmload.client import ChatClient
from llmload.locust.process import sink
from llmload.locust.state import FLUSH_INTERVAL_S, STATE
from llmload.replay import TurnSender
from llmload.workload.tokens import get_tokenizer


class ChatUser(User):
    """One request slot: claims the next planned arrival and plays it (one request, or in trace
    mode one session with its think times)."""

    def on_start(self) -> None:
        run = STATE.run
        self._dispatcher = run.dispatcher if run is not None else None
        if run is None or run.dispatcher is None:  # a worker with no share (joined late, or the target unreachable)
            return
        plan = run.plan
        limits = plan.flags.limits
        self._clients = {host: ChatClient(host, access=run.access, limits=limits) for host in run.replicas.hosts}
        self._sender = TurnSender(
            self._clients,
            run.dispatcher,
            lambda record: sink(self.environment, run, record),
            models=run.models,
            shape=run.shape,
            tokenizer=get_tokenizer(plan.workload.spec.tokenizer),
            history_turns=plan.history_turns,
            session_header=run.session_header,
            cancel=plan.cancel,
            block_text=plan.block_text,
        )

    @task
    def replay_next_session(self) -> None:
        arrival = self._dispatcher.claim() if self._dispatcher is not None else None
        if arrival is None:
            gevent.sleep(FLUSH_INTERVAL_S)  # plan over: idle until the shape ends the run
            return
        self._sender.play(arrival)

    def stop(self, force: bool = False) -> bool:
        """Locust also stops users to move them between workers (a worker joined mid-run): such a user
        first finishes what it holds, the arrival it claimed or the request in flight, so nothing the
        plan scheduled is cut or dropped. Only the run's own stop cuts requests (`cancelled`)."""
        runner = self.environment.runner
        stopping = runner is None or runner.state in (STATE_CLEANUP, STATE_STOPPING, STATE_STOPPED)
        return bool(super().stop(force=force and stopping))

    def on_stop(self) -> None:
        if self._dispatcher is not None:
            for client in self._clients.values():
                client.close()
