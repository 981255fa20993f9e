"""The replay engine without Locust: history, plan, shortfall and records, on a loopback server."""

from __future__ import annotations

import time
from typing import Any

import gevent
import pytest

from llmload.client import ChatClient
from llmload.models import Message, RequestRecord, Session, Turn
from llmload.run import Dispatcher, RunClock, SessionReplayer
from llmload.schedule import ArrivalSchedule, build_stages
from llmload.workload.tokens import get_tokenizer
from tests.wire_server import canned_server, chat_stream


def _reply(body: dict[str, Any]) -> tuple[int, bytes, bool]:
    """Answers with the number of messages it got, so every reply is distinct and checkable."""
    return 200, chat_stream([f"reply-to-{len(body['messages'])}", " done"]), True


def _session(turns: int) -> Session:
    return Session(
        id="s",
        turns=[Turn(messages=[Message(role="user", content=f"question {k}")], output_tokens=2) for k in range(turns)],
    )


def _dispatcher(sessions: list[Session], qps: float, seconds: float, **kw: Any) -> Dispatcher:
    schedule = ArrivalSchedule(build_stages(qps, (100,), seconds), "constant")
    return Dispatcher(schedule, sessions, RunClock.now(), run_id="t", **kw)


@pytest.mark.parametrize(("keep", "expected_lengths"), [(None, [1, 3, 5]), (1, [1, 3, 3])])
def test_replay_sends_accumulated_history(keep: int | None, expected_lengths: list[int]) -> None:
    records: list[RequestRecord] = []
    with canned_server(_reply) as (url, received):
        dispatcher = _dispatcher([_session(3)], qps=1.0, seconds=1.0)
        client = ChatClient(url)
        replayer = SessionReplayer(
            client, dispatcher, records.append, model="m", tokenizer=get_tokenizer(), history_turns=keep
        )
        arrival = dispatcher.claim()
        assert arrival is not None
        replayer.replay(arrival)
        client.close()
    assert [len(b["messages"]) for b in received] == expected_lengths
    last = received[-1]["messages"]
    assert last[-1] == {"role": "user", "content": "question 2"}
    # the assistant turns are the replies the server actually sent
    assert last[-2] == {"role": "assistant", "content": f"reply-to-{expected_lengths[1]} done"}
    assert received[0]["max_tokens"] == received[0]["min_tokens"] == 2 and received[0]["ignore_eos"] is True
    assert received[0]["stream_options"] == {"include_usage": True}
    assert [r.turn for r in records] == [0, 1, 2] and all(r.status == "ok" for r in records)


def test_too_few_users_show_as_schedule_delay_and_backlog() -> None:
    """One user for arrivals every 100 ms, each taking ~300 ms: the rest wait, and it is measured."""

    def slow(_: dict[str, Any]) -> tuple[int, bytes, bool]:
        time.sleep(0.3)
        return 200, chat_stream(["x"]), True

    records: list[RequestRecord] = []
    with canned_server(slow) as (url, _):
        dispatcher = _dispatcher([_session(1)], qps=10.0, seconds=1.0)
        client = ChatClient(url)
        replayer = SessionReplayer(client, dispatcher, records.append, model="m", tokenizer=get_tokenizer())
        backlog_seen = 0

        def user() -> None:
            while (arrival := dispatcher.claim()) is not None:
                replayer.replay(arrival)

        worker = gevent.spawn(user)
        while not worker.dead:
            backlog_seen = max(backlog_seen, dispatcher.backlog(time.perf_counter()))
            gevent.sleep(0.05)
        client.close()
    delays = [r.schedule_delay_ms or 0 for r in records]
    assert len(records) == dispatcher.planned == 10
    assert backlog_seen >= 3
    assert delays[0] < 50 and delays[-1] > 1000  # the tenth waited for nine slow requests
    assert dispatcher.done


def test_expire_turns_unclaimed_due_arrivals_into_not_sent() -> None:
    dispatcher = _dispatcher([_session(1)], qps=100.0, seconds=0.1)
    first = dispatcher.claim()
    assert first is not None
    expired = dispatcher.expire(time.perf_counter() + 1.0)
    assert len(expired) == dispatcher.planned - 1
    assert dispatcher.claim() is None and dispatcher.done
    record = dispatcher.record(expired[0], 0, expired[0].at, None)
    assert record.status == "not_sent" and record.sent_at is None and record.stage == "100%"


def test_cycled_sessions_get_unique_ids() -> None:
    dispatcher = _dispatcher([_session(1), _session(1).model_copy(update={"id": "t"})], qps=50.0, seconds=0.1)
    ids = [a.session_id for a in iter(dispatcher.claim, None)]
    assert ids == ["s", "t", "s~1", "t~1", "s~2"]
