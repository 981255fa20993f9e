"""The replay engine without Locust: request-rate plans, sessions, trace times and records, on a loopback server."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gevent
import pytest

from llmload.client import ChatClient
from llmload.errors import InputError
from llmload.model_mix import ModelMix
from llmload.models import Message, RequestRecord, Session, Turn
from llmload.plan import PlanFlags, RunPlan
from llmload.replay import (
    ConversationDispatcher,
    Dispatcher,
    LiveSession,
    RequestDispatcher,
    TraceDispatcher,
    TurnSender,
    WorkerShare,
)
from llmload.schedule import ArrivalSchedule, RunClock, TraceClock, build_stages, conversation_stages
from llmload.server.kinds import kind
from llmload.server.request import RequestShape
from llmload.workload.blocks import BlockText
from llmload.workload.files import load_workload
from llmload.workload.pacing import paced
from llmload.workload.tokens import get_tokenizer
from tests.locust_runs import small_workload, write_workload
from tests.wire_server import canned_server, chat_stream


def _reply(body: dict[str, Any]) -> tuple[int, bytes, bool]:
    """Answers with the number of messages it got, so every reply is distinct and checkable."""
    return 200, chat_stream([f"reply-to-{len(body['messages'])}", " done"]), True


def _session(turns: int, *, think_s: float = 0.0, name: str = "s", offset_s: float | None = None) -> Session:
    return Session(
        id=name,
        offset_s=offset_s,
        turns=[
            Turn(messages=[Message(role="user", content=f"question {k}")], output_tokens=2, think_time_s=think_s)
            for k in range(turns)
        ],
    )


def _dispatcher(sessions: list[Session], qps: float, seconds: float, **kw: Any) -> RequestDispatcher:
    schedule = ArrivalSchedule(build_stages(qps, (100,), seconds), "constant")
    return RequestDispatcher(schedule, sessions, RunClock.now(), WorkerShare("t", **kw))


def _play_all(dispatcher: Dispatcher, url: str, users: int = 1, **kw: Any) -> list[RequestRecord]:
    """`users` greenlets, each with its own connection, claim arrivals in order until the plan is over, as
    Locust users do."""
    records: list[RequestRecord] = []
    shape = RequestShape(kind("vllm"))

    def user() -> None:
        client = ChatClient(url)
        sender = TurnSender(
            {url: client}, dispatcher, records.append, models=ModelMix.single("m"), shape=shape,
            tokenizer=get_tokenizer(), **kw,
        )  # fmt: skip
        while (arrival := dispatcher.claim()) is not None:
            sender.play(arrival)
        client.close()

    gevent.joinall([gevent.spawn(user) for _ in range(users)], raise_error=True)
    return records


@pytest.mark.parametrize(("keep", "expected_lengths"), [(None, [1, 3, 5]), (1, [1, 3, 3])])
def test_a_due_session_takes_the_next_arrival_with_its_real_history(
    keep: int | None, expected_lengths: list[int]
) -> None:
    with canned_server(_reply) as (url, received):
        records = _play_all(_dispatcher([_session(3)], qps=3.0, seconds=1.0), url, history_turns=keep)
    assert [len(b["messages"]) for b in received] == expected_lengths
    last = received[-1]["messages"]
    assert last[-1] == {"role": "user", "content": "question 2"}
    # the assistant turns are the replies the server actually sent
    assert last[-2] == {"role": "assistant", "content": f"reply-to-{expected_lengths[1]} done"}
    assert received[0]["max_tokens"] == received[0]["min_tokens"] == 2 and received[0]["ignore_eos"] is True
    assert received[0]["stream_options"] == {"include_usage": True}
    assert [(r.session_id, r.turn) for r in records] == [("s", 0), ("s", 1), ("s", 2)]
    assert all(r.status == "ok" for r in records)


def test_every_arrival_is_sent_whatever_the_think_times() -> None:
    """Think times of 30 s cannot slow the plan: arrivals open new sessions while none is due."""
    sessions = [_session(4, think_s=30.0, name=f"s{k}") for k in range(3)]
    with canned_server(_reply) as (url, _):
        dispatcher = _dispatcher(sessions, qps=20.0, seconds=0.5)
        records = _play_all(dispatcher, url, users=3)
    assert len(records) == dispatcher.planned == 10 and all(r.status == "ok" for r in records)
    assert {r.turn for r in records} == {0}  # no session was due: think time is a minimum
    # every opened session is a distinct one, cycled with unique ids
    assert sorted(r.session_id for r in records)[:4] == ["s0", "s0~1", "s0~2", "s0~3"]
    assert len({r.session_id for r in records}) == 10
    assert dispatcher.waiting_sessions == 10  # all of them wait to go on


def test_a_session_waits_out_its_think_time_then_takes_an_arrival() -> None:
    with canned_server(_reply) as (url, _):
        dispatcher = _dispatcher([_session(2, think_s=0.3)], qps=10.0, seconds=1.0)
        records = _play_all(dispatcher, url)
    by_session: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r)
    follow_ups = [(turns[0], turns[1]) for turns in by_session.values() if len(turns) == 2]
    assert follow_ups, [(r.session_id, r.turn) for r in records]
    for first, second in follow_ups:
        assert second.turn == 1
        assert second.sent_at is not None and first.finished_at is not None
        assert second.sent_at - first.finished_at >= 0.3  # think time is a minimum
    assert len(records) == 10  # and the rate held


def test_worker_shares_open_disjoint_sessions() -> None:
    sessions = [_session(1, name=f"s{k}") for k in range(3)]
    schedule = ArrivalSchedule(build_stages(20.0, (100,), 1.0), "constant")
    clock = RunClock.now()
    opened = []
    for worker in (0, 1):
        d = RequestDispatcher(schedule, sessions, clock, WorkerShare("t", index=worker, count=2))
        opened.append([d.session_for(0.0).session.id for _ in range(d.planned)])
    assert opened[0] == ["s0", "s2", "s1~1", "s0~2", "s2~2", "s1~3", "s0~4", "s2~4", "s1~5", "s0~6"]
    assert not set(opened[0]) & set(opened[1])


def test_a_first_session_starts_the_replay_further_into_the_workload() -> None:
    """Two workers from session 4 of 5: the workload cycles from there, still disjoint between them."""
    sessions = [_session(1, name=f"s{k}") for k in range(5)]
    schedule = ArrivalSchedule(build_stages(6.0, (100,), 1.0), "constant")
    opened = []
    for worker in (0, 1):
        d = RequestDispatcher(schedule, sessions, RunClock.now(), WorkerShare("t", index=worker, count=2), 4)
        opened.append([d.session_for(0.0).session.id for _ in range(d.planned)])
    assert opened == [["s4", "s1~1", "s3~1"], ["s0~1", "s2~1", "s4~1"]]


def test_a_negative_first_session_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--first-session: Input should be greater than or equal to 0"):
        RunPlan.build(PlanFlags.checked(workload=str(small_workload(tmp_path)), target_qps=1, first_session=-1))


def test_sessions_in_flight_take_a_trace_and_plan_no_rate(tmp_path: Path) -> None:
    """A closed loop keeps a trace's conversations: refused in a rate mode; in trace mode each stage keeps its
    percent of N conversations (at least one), asks for no rate and plans no arrival."""
    workload = str(small_workload(tmp_path))
    with pytest.raises(InputError, match="--sessions-in-flight applies to --arrival trace only"):
        RunPlan.build(PlanFlags.checked(workload=workload, target_qps=1, sessions_in_flight=4))
    plan = RunPlan.build(
        PlanFlags.checked(workload=workload, arrival="trace", sessions_in_flight=4, stages="10,50,150", warmup_s=0)
    )
    assert [(s.qps, s.sessions) for s in plan.stages] == [(0.0, 1), (0.0, 2), (0.0, 6)]
    assert plan.target_qps == 0 and plan.planned() == 0 and plan.closed_loop
    # what a distributed run's master splits among its workers: the trace's session starts, and none here
    trace = RunPlan.build(PlanFlags.checked(workload=workload, arrival="trace", stages="10,50,150", warmup_s=0))
    assert len(trace.arrival_plan().offsets) == trace.planned() > 0 and len(plan.arrival_plan().offsets) == 0


def test_too_few_users_show_as_schedule_delay_and_backlog() -> None:
    """One user for arrivals every 100 ms, each taking ~300 ms: the rest wait, and it is measured."""

    def slow(_: dict[str, Any]) -> tuple[int, bytes, bool]:
        time.sleep(0.3)
        return 200, chat_stream(["x"]), True

    with canned_server(slow) as (url, _):
        dispatcher = _dispatcher([_session(1)], qps=10.0, seconds=1.0)
        backlog_seen = 0
        worker = gevent.spawn(_play_all, dispatcher, url)
        while not worker.dead:
            backlog_seen = max(backlog_seen, dispatcher.backlog(time.perf_counter()))
            gevent.sleep(0.05)
        records = worker.get()
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
    record = dispatcher.record("", 0, expired[0].at, None)
    assert record.status == "not_sent" and record.sent_at is None and record.stage == "100%"


@pytest.mark.parametrize("time_scale", [1.0, 2.0])
def test_trace_replay_sends_at_the_recorded_times(time_scale: float) -> None:
    """Sessions at their offsets, a follow-up at its recorded time, all divided by the time scale."""
    sessions = [_session(1, name=f"s{k}", offset_s=0.2 * k) for k in range(4)]
    sessions[1] = sessions[1].model_copy(
        update={
            "turns": [
                *sessions[1].turns,
                Turn(messages=[Message(role="user", content="again")], output_tokens=2, at_s=0.5),
            ]
        }
    )
    stages = build_stages(1.0, (100,), 0.8 / time_scale)  # one pass: the trace repeats at 0.6 + 0.2 s
    with canned_server(_reply) as (url, _):
        dispatcher = TraceDispatcher(TraceClock(stages, time_scale), sessions, RunClock.now(), WorkerShare("t"))
        records = _play_all(dispatcher, url, users=4)
    start = dispatcher.clock.start_wall
    sent = sorted((r.session_id, r.turn, (r.sent_at or 0) - start) for r in records)
    expected = [("s0", 0, 0.0), ("s1", 0, 0.2), ("s1", 1, 0.7), ("s2", 0, 0.4), ("s3", 0, 0.6)]
    assert [(s, t) for s, t, _ in sent] == [(s, t) for s, t, _ in expected]
    for (_, _, actual), (_, _, recorded) in zip(sent, expected, strict=True):
        assert actual == pytest.approx(recorded / time_scale, abs=0.05)


def test_a_trace_turn_due_before_its_reply_waits_as_schedule_delay() -> None:
    def slow(_: dict[str, Any]) -> tuple[int, bytes, bool]:
        time.sleep(0.3)
        return 200, chat_stream(["x"]), True

    session = _session(1, offset_s=0.0)
    session = session.model_copy(
        update={
            "turns": [*session.turns, Turn(messages=[Message(role="user", content="again")], output_tokens=2, at_s=0.1)]
        }
    )
    with canned_server(slow) as (url, _):
        dispatcher = TraceDispatcher(
            TraceClock(build_stages(1.0, (100,), 1.0)), [session], RunClock.now(), WorkerShare("t")
        )
        records = _play_all(dispatcher, url)
    assert [r.turn for r in records] == [0, 1]
    assert records[1].schedule_delay_ms == pytest.approx(200, abs=60)  # due at 0.1 s, reply at ~0.3 s


def test_think_time_only_sends_a_trace_turn_after_the_reply_not_at_its_recorded_time(tmp_path: Path) -> None:
    """A turn recorded 2 s after the first (an answer the recorded server took 1.8 s over) with a think
    time of 0.2 s: as recorded it goes out at 2 s; with --use-think-time-only 0.2 s after this server's
    reply; --max-think-time 0.05 caps that think time. The plan applies both where it loads the workload."""
    session = _session(1, offset_s=0.0)
    again = Turn(messages=[Message(role="user", content="again")], output_tokens=2, at_s=2.0, think_time_s=0.2)
    session = session.model_copy(update={"turns": [*session.turns, again]})
    path = write_workload(tmp_path, "trace", [session])
    gaps = {}
    for name, flags in {
        "recorded": {}, "think": {"think_time_only": True}, "capped": {"think_time_only": True, "max_think_s": 0.05},
    }.items():  # fmt: skip
        plan = RunPlan.build(
            PlanFlags(workload=str(path), arrival="trace", stages="100", stage_duration_s=3, warmup_s=0, **flags)
        )
        assert isinstance(plan.arrivals, TraceClock)
        with canned_server(_reply) as (url, _):
            dispatcher = TraceDispatcher(plan.arrivals, plan.workload.sessions, RunClock.now(), WorkerShare("t"))
            first, second = sorted(
                (r for r in _play_all(dispatcher, url) if r.session_id == session.id), key=lambda r: r.turn
            )
        gaps[name] = (second.sent_at or 0) - (first.finished_at or 0)
        if name == "recorded":
            assert (second.sent_at or 0) - dispatcher.clock.start_wall == pytest.approx(2.0, abs=0.05)
    assert gaps["recorded"] > 1.5, gaps
    assert gaps["think"] == pytest.approx(0.2, abs=0.05) and gaps["capped"] == pytest.approx(0.05, abs=0.04), gaps
    with pytest.raises(InputError, match="--use-think-time-only applies to --arrival trace only"):
        RunPlan.build(PlanFlags(workload=str(path), target_qps=1, think_time_only=True))


def test_think_time_only_brings_a_subagents_arrival_to_its_agents(tmp_path: Path) -> None:
    """With think times only, a subagent starts its first think time after the reply that spawns it, so it
    arrives with the agent whose turn spawns it, not at its recorded offset; as recorded, it keeps its own."""
    spawning = Turn(messages=[Message(role="user", content="a 0")], output_tokens=2, spawns=["a/sub"])
    sessions = [
        _agent("b", [(None, [])], offset_s=2.0),
        _agent("a/sub", [(None, [])], offset_s=4.0, parent="a"),
        Session(id="a", offset_s=1.0, turns=[spawning]),
    ]
    workload = load_workload(write_workload(tmp_path, "agents", sessions))
    paced_offsets = [s.offset_s for s in paced(workload, think_time_only=True, max_think_s=None).sessions]
    capped_offsets = [s.offset_s for s in paced(workload, think_time_only=False, max_think_s=1.0).sessions]
    assert (paced_offsets, capped_offsets) == ([2.0, 1.0, 1.0], [2.0, 4.0, 1.0])


def test_a_trace_repeats_with_unique_ids_when_the_plan_is_longer() -> None:
    sessions = [_session(1, name=f"s{k}", offset_s=float(k)) for k in range(2)]  # period 2 s
    trace = TraceClock(build_stages(1.0, (100,), 5.0))
    dispatcher = TraceDispatcher(trace, sessions, RunClock.now(), WorkerShare("t"))
    arrivals = list(iter(dispatcher.claim, None))
    assert [a.session.session.id for a in arrivals if a.session] == ["s0", "s1", "s0~1", "s1~1", "s0~2"]


def test_cache_bust_opens_each_play_with_its_own_marker_and_one_play_shares_it() -> None:
    """Two sessions played three times: with --cache-bust a session's plays differ from their first
    character, while the sessions of one play open alike; plainly, every play is the same text."""
    sessions = [_session(2, name="a"), _session(2, name="b")]

    def openings(**kw: Any) -> dict[str, str]:
        dispatcher = _dispatcher(sessions, qps=1.0, seconds=1.0, **kw)
        played = [dispatcher.session_for(0.0).session for _ in range(6)]
        assert [p.id for p in played] == ["a", "b", "a~1", "b~1", "a~2", "b~2"]
        assert all(p.turns[1:] == sessions[0].turns[1:] for p in played)  # later turns carry it in history
        return {p.id: p.turns[0].messages[0].content for p in played}

    plain, busted = openings(), openings(cache_bust=True)
    assert set(plain.values()) == {"question 0"}
    assert len(set(busted.values())) == 3 and all(text.endswith("question 0") for text in busted.values())
    assert busted["a"] == busted["b"] and busted["a~2"] == busted["b~2"] == "[t play 2]\nquestion 0"


def test_a_turn_of_blocks_sends_its_ids_text_as_its_whole_prompt() -> None:
    """Two sessions of two block turns each (a trace's ids cover the whole prompt): every request is
    one user message, the history is not added again, the first 512 tokens of a and b are the same
    text (id 7) and the rest differ."""

    def turn(ids: list[int], tokens: int) -> Turn:
        return Turn(blocks=ids, prompt_tokens=tokens, output_tokens=2)

    sessions = [
        Session(id="a", turns=[turn([7, 1], 700), turn([7, 1, 2], 1200)]),
        Session(id="b", turns=[turn([7, 3], 900), turn([7, 3, 4], 1400)]),
    ]
    text = BlockText(get_tokenizer(), 512)
    with canned_server(_reply) as (url, bodies):
        records = _play_all(_dispatcher(sessions, qps=8.0, seconds=0.5), url, block_text=text)
    assert [r.status for r in records] == ["ok"] * 4
    assert all(len(body["messages"]) == 1 and body["messages"][0]["role"] == "user" for body in bodies)
    tokenizer = get_tokenizer()
    sent = {
        (r.session_id, r.turn): tokenizer.encode(b["messages"][0]["content"])
        for r, b in zip(records, bodies, strict=True)
    }
    chat = lambda tokens: tokenizer.count_chat([{"role": "user", "content": tokenizer.decode(tokens)}])  # noqa: E731
    assert [chat(sent[key]) for key in (("a", 0), ("a", 1), ("b", 0), ("b", 1))] == [700, 1200, 900, 1400]
    assert sent["a", 0][:512] == sent["b", 0][:512] and sent["a", 0][512:600] != sent["b", 0][512:600]
    assert sent["a", 1][: len(sent["a", 0])] == sent["a", 0]  # turn 2's ids extend turn 1's


def test_cache_bust_renames_a_plays_block_ids_alike_for_its_sessions() -> None:
    sessions = [
        Session(id=name, turns=[Turn(blocks=[7, k], prompt_tokens=1024, output_tokens=2)])
        for k, name in enumerate("ab")
    ]
    dispatcher = _dispatcher(sessions, qps=1.0, seconds=1.0, cache_bust=True)
    played = [dispatcher.session_for(0.0).session.turns[0].blocks for _ in range(4)]
    assert played[0] is not None and played[2] is not None
    assert played[0][0] == played[1][0] != played[2][0] == played[3][0]  # id 7, renamed per play
    assert len({ids[1] for ids in played if ids}) == 4


def _agent(
    name: str, turns: list[tuple[float | None, list[str]]], *, offset_s: float, parent: str | None = None
) -> Session:
    """A trace session whose k-th turn is sent at its recorded time (`at_s`) and joins the named subagents."""
    return Session(
        id=name,
        offset_s=offset_s,
        parent=parent,
        turns=[
            Turn(messages=[Message(role="user", content=f"{name} {k}")], output_tokens=2, at_s=at, waits_for=joins)
            for k, (at, joins) in enumerate(turns)
        ],
    )


def test_an_agents_turn_that_joins_its_subagent_waits_for_it_and_a_background_one_runs_on() -> None:
    """The agent's second turn is due 0.2 s in, but joins a subagent (started at 0.1 s) whose two turns take
    0.3 s each: it goes out when the subagent's last reply is back, not before, and with no schedule delay (the
    join is the trace's, not the load generator's lateness). A subagent it does not join (one after its last
    turn in the trace, in the background) runs on beside it, as long as it takes."""

    def slow_for_subagents(body: dict[str, Any]) -> tuple[int, bytes, bool]:
        if "/" in body["messages"][0]["content"].split()[0]:
            time.sleep(0.3)
        return 200, chat_stream(["x"]), True

    sessions = [
        _agent("a", [(None, []), (0.2, ["a/sub"])], offset_s=0.0),
        _agent("a/sub", [(None, []), (0.0, [])], offset_s=0.1, parent="a"),
        _agent("a/background", [(None, []), (0.0, []), (0.0, [])], offset_s=0.3, parent="a"),
        _agent("later", [(None, [])], offset_s=3.0),  # past the plan's end: the trace plays once
    ]
    with canned_server(slow_for_subagents) as (url, _):
        dispatcher = TraceDispatcher(
            TraceClock(build_stages(1.0, (100,), 1.2)), sessions, RunClock.now(), WorkerShare("t")
        )
        records = {(r.session_id, r.turn): r for r in _play_all(dispatcher, url, users=3)}
    start = dispatcher.clock.start_wall
    assert sorted(records) == [("a", 0), ("a", 1), ("a/background", 0), ("a/background", 1), ("a/background", 2),
                               ("a/sub", 0), ("a/sub", 1)]  # fmt: skip
    joined = records["a/sub", 1].finished_at or 0
    assert joined - start > 0.6  # two 0.3 s replies after 0.1 s: long after the agent's turn was due
    assert joined <= (records["a", 1].sent_at or 0) <= joined + 0.05
    assert records["a", 1].schedule_delay_ms < 50
    assert (records["a/background", 2].finished_at or 0) - joined > 0.4  # not waited for


class _Noted(TraceDispatcher):
    """A trace dispatcher that notes what its starts and joins answered, by session: when a session may go
    on, or None when it never will (what a replay's records cannot show apart from lateness)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.noted: list[tuple[str, str, float | None]] = []

    def start(self, live: LiveSession, at: float) -> float | None:
        begun = super().start(live, at)
        self.noted.append(("start", live.session.id, begun))
        return begun

    def join(self, live: LiveSession, subagents: Sequence[str]) -> float | None:
        joined = super().join(live, subagents)
        self.noted.append(("join", live.session.id, joined))
        return joined


def test_a_join_the_plan_ends_before_sends_nothing_and_holds_nobody() -> None:
    """A subagent still running at the plan's end: the agent's turn that joins it is never scheduled; the join
    answers None (the plan ended first) rather than hold the agent's user until the subagent's end."""

    def slow(_: dict[str, Any]) -> tuple[int, bytes, bool]:
        time.sleep(0.4)
        return 200, chat_stream(["x"]), True

    sessions = [
        _agent("a", [(None, []), (0.1, ["a/sub"])], offset_s=0.0),
        _agent("a/sub", [(None, []), (0.0, []), (0.0, [])], offset_s=0.0, parent="a"),
        _agent("later", [(None, [])], offset_s=1.0),  # past the plan's end: the trace plays once
    ]
    with canned_server(slow) as (url, _):
        dispatcher = _Noted(
            TraceClock(build_stages(1.0, (100,), 0.5)), sessions, RunClock.now(), WorkerShare("t", drain_s=2.0)
        )
        records = _play_all(dispatcher, url, users=2)
    assert sorted((r.session_id, r.turn) for r in records) == [("a", 0), ("a/sub", 0), ("a/sub", 1), ("a/sub", 2)]
    assert [answer for answer in dispatcher.noted if answer[0] == "join"] == [("join", "a", None)]
    assert dispatcher.done and dispatcher.busy == 0 and not dispatcher.in_flight


def test_workers_split_a_trace_by_conversation_with_each_subagent_beside_its_agent() -> None:
    sessions = [
        _agent(name, [(None, [])], offset_s=0.1 * k, parent=name.rpartition("/")[0] or None)
        for k, name in enumerate(["a", "a/x", "b", "b/y", "b/y/z", "c", "orphan/q"])
    ]
    trace = TraceClock(build_stages(1.0, (100,), 0.7))
    owners = {}
    for index in range(2):
        dispatcher = TraceDispatcher(trace, sessions, RunClock.now(), WorkerShare("t", index=index, count=2))
        owners[index] = [a.session.session.id for a in iter(dispatcher.claim, None) if a.session]
    assert owners == {0: ["a", "a/x", "c"], 1: ["b", "b/y", "b/y/z", "orphan/q"]}


def test_a_subagent_starts_its_think_time_after_the_reply_that_spawns_it_and_never_if_that_fails() -> None:
    """Think times only: the agent's first reply takes 0.3 s and spawns a subagent whose first think time is
    0.2 s, so it starts 0.5 s in, not at its arrival (its agent's, 0 s); the agent's next turn joins it. An
    agent whose spawning turn fails never starts its subagent: its start answers None, and nobody is held."""

    def reply(body: dict[str, Any]) -> tuple[int, bytes, bool]:
        words = body["messages"][-1]["content"].split()
        if words[0] == "broken":
            return 500, b'{"error": {"message": "boom"}}', False
        time.sleep(0.3 if words[0] == "a" and words[1] == "0" else 0.0)
        return 200, chat_stream(["x"]), True

    def sessions(agent: str) -> list[Session]:
        first = Turn(messages=[Message(role="user", content=f"{agent} 0")], output_tokens=2, spawns=[f"{agent}/sub"])
        then = Turn(messages=[Message(role="user", content=f"{agent} 1")], output_tokens=2, waits_for=[f"{agent}/sub"])
        sub = _agent(f"{agent}/sub", [(None, []), (None, [])], offset_s=0.0, parent=agent)
        sub = sub.model_copy(update={"turns": [sub.turns[0].model_copy(update={"think_time_s": 0.2}), sub.turns[1]]})
        later = _agent("later", [(None, [])], offset_s=5.0)  # past the plan's end: the trace plays once
        return [Session(id=agent, offset_s=0.0, turns=[first, then]), sub, later]

    with canned_server(reply) as (url, _):
        dispatcher = TraceDispatcher(
            TraceClock(build_stages(1.0, (100,), 1.5)), sessions("a"), RunClock.now(), WorkerShare("t")
        )
        records = {(r.session_id, r.turn): r for r in _play_all(dispatcher, url, users=2)}
        broken = _Noted(
            TraceClock(build_stages(1.0, (100,), 0.5)), sessions("broken"), RunClock.now(), WorkerShare("t")
        )
        failed = _play_all(broken, url, users=2)
    spawned = records["a", 0].finished_at or 0
    assert (records["a/sub", 0].sent_at or 0) - spawned == pytest.approx(0.2, abs=0.05)
    assert (records["a", 1].sent_at or 0) >= (records["a/sub", 1].finished_at or 0)
    assert [(r.session_id, r.status) for r in failed] == [("broken", "failed")]
    assert ("start", "broken/sub", None) in broken.noted and broken.done and broken.busy == 0


def _closed_loop(sessions: list[Session], in_flight: int, seconds: float) -> ConversationDispatcher:
    stages = conversation_stages(build_stages(1.0, (100,), seconds), in_flight)
    return ConversationDispatcher(TraceClock(stages), sessions, RunClock.now(), WorkerShare("t"))


def _play_closed_loop(dispatcher: ConversationDispatcher, url: str, users: int = 4) -> list[RequestRecord]:
    """Users as Locust's: each claims until the plan is over, idle while every slot is taken."""
    records: list[RequestRecord] = []

    def user() -> None:
        client = ChatClient(url)
        sender = TurnSender(
            {url: client}, dispatcher, records.append, models=ModelMix.single("m"),
            shape=RequestShape(kind("vllm")), tokenizer=get_tokenizer(),
        )  # fmt: skip
        while not dispatcher.done:
            arrival = dispatcher.claim()
            if arrival is None:
                gevent.sleep(0.01)
            else:
                sender.play(arrival)
        client.close()

    gevent.joinall([gevent.spawn(user) for _ in range(users)], raise_error=True)
    return records


def test_sessions_in_flight_keep_n_conversations_open_recycling_the_trace() -> None:
    """--sessions-in-flight 2 over a trace of two conversations (an agent that spawns and joins a subagent,
    and a lone agent), every reply 0.1 s: two conversations are in flight at every moment of the plan and
    never three, each replaced by the next as it ends (the trace recycled with unique ids), the subagent
    spawned by its agent's reply and joined by its next turn in every play."""

    def reply(_: dict[str, Any]) -> tuple[int, bytes, bool]:
        time.sleep(0.1)
        return 200, chat_stream(["x"]), True

    def turn(text: str, **kw: Any) -> Turn:
        return Turn(messages=[Message(role="user", content=text)], output_tokens=2, think_time_s=0.05, **kw)

    sessions = [
        Session(id="a", turns=[turn("a 0", spawns=["a/sub"]), turn("a 1", waits_for=["a/sub"])]),
        Session(id="a/sub", parent="a", turns=[turn("sub 0")]),
        Session(id="b", turns=[turn("b 0"), turn("b 1")]),
    ]
    dispatcher = _closed_loop(sessions, 2, 1.6)
    with canned_server(reply) as (url, _):
        records = _play_closed_loop(dispatcher, url)
    assert all(r.status == "ok" for r in records)
    plays: dict[str, list[RequestRecord]] = {}
    for r in records:
        plays.setdefault(r.session_id.replace("/sub", ""), []).append(r)
    assert len(records) == len({(r.session_id, r.turn) for r in records})  # no play's id used twice
    assert {"a", "b", "a~1", "b~1"} <= set(plays)  # recycled in the trace's order
    spans = [(min(r.sent_at or 0 for r in rs), max(r.finished_at or 0 for r in rs)) for rs in plays.values()]
    first, plan_end = min(begin for begin, _ in spans), dispatcher.clock.wall(dispatcher.plan_end)
    samples = [first + 0.01 * k for k in range(1, int((plan_end - first) / 0.01))]
    in_flight = [sum(begin <= t <= end for begin, end in spans) for t in samples]
    assert max(in_flight) == 2 and sum(n == 2 for n in in_flight) >= 0.9 * len(samples)
    for play, rs in plays.items():
        by_turn = {(r.session_id, r.turn): r for r in rs}
        if play.startswith("a") and len(by_turn) == 3:  # the agent, its subagent, its joining turn
            sub = next(r for r in rs if "/sub" in r.session_id)
            first, joined = by_turn[play, 0], by_turn[play, 1]
            assert (sub.sent_at or 0) >= (first.finished_at or 0) + 0.04  # spawned by the reply, its think later
            assert (joined.sent_at or 0) >= (sub.finished_at or 0)  # the join waits for it


def test_a_closed_loop_worker_keeps_the_slots_it_takes_over_from_a_lost_one() -> None:
    """Worker 0 of 2 with five conversations in flight keeps slots 0, 2 and 4; handed worker 1's (slots 1
    and 3), it opens two more, in its own numbering (ids no other worker uses), and then waits."""
    sessions = [
        Session(id=f"c{i}", turns=[Turn(messages=[Message(role="user", content="q")], output_tokens=1)])
        for i in range(9)
    ]
    stages = conversation_stages(build_stages(1.0, (100,), 60), 5)
    mine = ConversationDispatcher(TraceClock(stages), sessions, RunClock.now(), WorkerShare("t", index=0, count=2))

    def opened() -> list[str]:
        claimed = []
        while (arrival := mine.claim()) is not None:
            assert arrival.session is not None
            claimed.append(arrival.session.session.id)
        return claimed

    assert opened() == ["c0", "c2", "c4"]
    mine.adopt([], [(1, 0, 1)])
    assert opened() == ["c6", "c8"]


def test_a_failed_conversation_frees_its_slot_a_second_later() -> None:
    """A server that refuses everything, two conversations in flight for 1.5 s: each slot opens a conversation,
    which fails at once, rests a second, and opens one more: four requests, not a tight loop of failures."""
    with canned_server(lambda _: (500, b'{"error": {"message": "down"}}', False)) as (url, _):
        records = _play_closed_loop(_closed_loop([_session(2, name="a"), _session(2, name="b")], 2, 1.5), url)
    assert sorted((r.session_id, r.status) for r in records) == [
        ("a", "failed"), ("a~1", "failed"), ("b", "failed"), ("b~1", "failed")
    ]  # fmt: skip
