"""Prefix-cache figures: the judged window's hit rate from the server's counters, the share of prompt
tokens served from cache by turn, the alert level, `compare`, and the live figure.

The simulator in engine mode keeps a real block-level prefix cache (16-token blocks here, so a
short multi-turn workload hits it) and counts hits and queries as vLLM does; the real vLLM's side
is in tests/test_vllm_e2e.py.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import orjson
import pytest

from llmload.cli import main
from llmload.client import ChatClient
from llmload.conclude import conclude, judge
from llmload.gates.compare import Thresholds, compare_runs, load_run
from llmload.gates.criteria import SoakCriteria
from llmload.live import LiveStats
from llmload.locust.views import tab_rows
from llmload.models import Session, Stage, Turn
from llmload.observe.observer import ServerSample
from llmload.sim.process import SimProcess
from llmload.workload.cache_bust import marked, play_marker
from llmload.workload.files import load_workload, save_workload
from llmload.workload.synth import PrefixPool, SynthOptions, synthesize_workload
from llmload.workload.tokens import GENERATION_PROMPT, MESSAGE_END, chatml_message, get_tokenizer
from tests.agentic import write_agentic_traces
from tests.locust_runs import LocustRun, run_locust, small_workload, write_workload

ENGINE = ("--profile", "vllm-cpu-tiny", "--block-size", "16", "--enable-prompt-tokens-details")


def _run(host: str, workload: Path, reports: Path, run_id: str, *extra: str) -> LocustRun:
    run = run_locust(
        host, workload, reports, run_id, "--target-qps", "6", "--stages", "100", "--stage-duration", "12",
        "--warmup", "4", "--arrival", "constant", *extra,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.output[-3000:]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LocustRun]:
    """The same multi-turn workload with prefix caching on (judged by a strict hit-rate alert) and off."""
    directory = tmp_path_factory.mktemp("prefix")
    workload = small_workload(directory, max_turns=5, think_s=0.2, output_median=24)
    criteria = directory / "criteria.yaml"
    criteria.write_text("alerts:\n  levels: {prefix_cache_hit_rate: 0.99}\n  actions: {prefix_cache_hit_rate: fail}\n")
    return _at_once(
        directory / "reports",
        {
            "on": (ENGINE, workload, ("--verdict", "--criteria", str(criteria))),
            # a KV cache of 40 blocks: running requests evict what earlier turns cached
            "small": (
                (*ENGINE, "--kv-cache-memory-bytes", str(40 * 16 * 1024), "--max-model-len", "608"),
                workload,
                (),
            ),
        },
    )


def _at_once(reports: Path, plans: dict[str, tuple[tuple[str, ...], Path, tuple[str, ...]]]) -> dict[str, LocustRun]:
    """Each run `name: (simulator flags, workload, run flags)` against a simulator of its own, all at
    once (each mostly waits for its 16 s plan), so no run's cache or queue is another's."""
    with ExitStack() as stack, ThreadPoolExecutor(len(plans)) as pool:
        sims = {name: stack.enter_context(SimProcess(*flags)) for name, (flags, _, _) in plans.items()}
        futures = {
            name: pool.submit(_run, sims[name].url, workload, reports, name, *extra)
            for name, (_, workload, extra) in plans.items()
        }
        return {name: future.result() for name, future in futures.items()}


def test_the_hit_rate_of_the_judged_window_matches_the_requests_usage(runs: dict[str, LocustRun]) -> None:
    """The server's counters (hits / queries over the judged stages) against the requests' own usage
    (cached / prompt tokens of the requests the judged stages sent): two independent tallies."""
    run = runs["on"]
    server = run.summary["server"]
    records = run.records
    judged = records[(records.stage != "warm-up") & (records.status == "ok")]
    from_usage = judged.cached_tokens.sum() / judged.prompt_tokens.sum()
    assert 0.2 < server["prefix_cache_hit_rate"] < 1
    assert server["prefix_cache_hit_rate"] == pytest.approx(from_usage, abs=0.08)
    assert server["prefix_cache_queries"] == pytest.approx(judged.prompt_tokens.sum(), rel=0.15)


def test_the_share_from_cache_rises_with_turn_depth(runs: dict[str, LocustRun]) -> None:
    shares = [turn["cached_share"] for turn in runs["on"].summary["turns"]]
    assert len(shares) >= 4 and None not in shares
    assert shares[0] < shares[1] < shares[-1]  # each turn resends the history the last one cached
    assert shares[-1] > 0.5
    report = (runs["on"].run_dir / "report.md").read_text()
    assert "Prefix-cache hit rate" in report and "| from cache |" in report
    assert "Prompt tokens from the prefix cache, by turn" in (runs["on"].run_dir / "report.html").read_text()


def test_the_hit_rate_alert_is_off_by_default_and_fires_below_its_level(runs: dict[str, LocustRun]) -> None:
    verdict = runs["on"].summary["verdict"]
    line = next(r for r in verdict["reasons"] if "prefix-cache hit-rate alert" in r)
    assert line.startswith("FAIL") and "< level 0.99 (fail)" in line and not verdict["passed"]
    default = conclude(runs["small"].run_dir, SoakCriteria()).verdict
    assert default is not None and "SKIP prefix-cache hit-rate alert: off (no level set)" in default.reasons


def test_the_hit_rate_gate_fails_a_cache_that_loses_what_the_prompts_offer(runs: dict[str, LocustRun]) -> None:
    """--max-prefix-cache-gap: the hit rate (from the requests' cached_tokens) against what the prompts
    sent could hit. The ample cache is within 10 points of it; 40 blocks, evicting, are not."""
    gate = SoakCriteria(max_prefix_cache_gap=0.10)
    checks = {name: judge(runs[name].run_dir, gate).checks for name in ("on", "small")}
    (ample,), (evicting,) = ([c for c in checks[n] if c.kind == "prefix_cache"] for n in ("on", "small"))
    print(ample.detail, evicting.detail, sep="\n")
    assert ample.status == "pass" and "by the requests' usage (cached_tokens)" in ample.detail
    assert evicting.status == "fail" and "limit 10" in evicting.detail
    (off,) = [c for c in judge(runs["on"].run_dir, SoakCriteria()).checks if c.kind == "prefix_cache"]
    assert off.status == "skip" and "--max-prefix-cache-gap" in off.detail


def test_compare_shows_the_hit_rate_and_calls_its_loss_a_regression(
    runs: dict[str, LocustRun], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["compare", str(runs["on"].run_dir), str(runs["small"].run_dir)])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("prefix-cache hit rate"))
    assert rc == 1 and "REGRESSION" in line
    comparison = compare_runs(load_run(runs["on"].run_dir), load_run(runs["small"].run_dir), Thresholds())
    (hit,) = [row for row in comparison.rows if row.metric == "prefix-cache hit rate"]
    assert hit.regressed and hit.baseline is not None and hit.current is not None
    assert hit.baseline - hit.current > 0.1


def _naive_reusable_share(run: LocustRun, block: int = 16) -> float:
    """The reusable share computed the slow, obvious way: each sent prompt laid out flat as ChatML
    renders it (each message's piece, each reply's assistant message with tokens of its own, then
    the generation prompt), in send order; a block is reusable when an earlier request held the same
    tokens up to its end, in its prompt or its reply but the last token. Counted over the judged stages' requests.
    A --cache-bust run's session `id~k` opens with play k's marker (`id`: play 0)."""
    workload = load_workload(run.manifest["workload"])
    encode = get_tokenizer(workload.spec.tokenizer).encode
    busted = run.manifest["flags"]["cache_bust"]
    sessions = {s.id: s for s in workload.sessions}

    def text_of(session_id: str) -> list[list[int]]:
        base, _, play = session_id.partition("~")
        session = sessions[base]
        if busted:
            session = marked(session, play_marker(run.manifest["run_id"], int(play or 0)))
        return [[t for m in turn.messages for t in encode(chatml_message(m.role, m.content))] for turn in session.turns]

    records = run.records
    turns = {name: text_of(name) for name in records.session_id.unique()}
    sent = records[records.status != "not_sent"].sort_values("sent_at", kind="stable")
    replies = {(r.session_id, r.turn): int(np.nan_to_num(r.output_tokens)) for r in sent.itertuples()}
    seen: set[tuple[object, ...]] = set()
    reusable = prompt_tokens = 0
    for r in sent.itertuples():
        prompt: list[object] = []
        for turn in range(r.turn + 1):
            if turn:
                reply = [(r.session_id, turn - 1, i) for i in range(replies.get((r.session_id, turn - 1), 0))]
                prompt += [*encode(GENERATION_PROMPT), *reply, *encode(MESSAGE_END)]
            prompt += turns[r.session_id][turn]
        prompt += encode(GENERATION_PROMPT)
        prefixes = [tuple(prompt[: block * (i + 1)]) for i in range(len(prompt) // block)]
        hits = next((i for i, p in enumerate(prefixes) if p not in seen), len(prefixes))
        cached = prompt + [(r.session_id, r.turn, i) for i in range(replies[r.session_id, r.turn] - 1)]
        seen.update(tuple(cached[: block * (i + 1)]) for i in range(len(cached) // block))
        if r.stage != "warm-up":
            reusable, prompt_tokens = reusable + block * hits, prompt_tokens + len(prompt)
    return reusable / prompt_tokens


def test_the_report_puts_what_the_workload_could_hit_beside_what_the_server_hit(runs: dict[str, LocustRun]) -> None:
    """The reusable share of what the judged stages sent, beside the server's hit rate: the same figure
    computed naively agrees, and the server, whose prompts are ChatML as the figure's are, hits no
    more than it, with an ample cache or one too small for the workload's sessions."""
    on, small = runs["on"].summary["server"], runs["small"].summary["server"]
    reuse = on["workload_prefix"]
    assert reuse["block_size"] == 16 and reuse["share"] == pytest.approx(_naive_reusable_share(runs["on"]), abs=1e-12)
    assert reuse["chat_template"] == "chatml"
    assert reuse["share"] == pytest.approx(reuse["history_share"] + reuse["shared_share"])
    print(f"ample cache: server {on['prefix_cache_hit_rate']:.4f}, ceiling {reuse['share']:.4f}")
    print(f"small cache: server {small['prefix_cache_hit_rate']:.4f}, ceiling {small['workload_prefix']['share']:.4f}")
    assert on["prefix_cache_hit_rate"] <= reuse["share"]
    assert small["prefix_cache_hit_rate"] < small["workload_prefix"]["share"]
    report = (runs["small"].run_dir / "report.md").read_text()
    assert f"the workload could hit {100 * small['workload_prefix']['share']:.1f}% (ChatML template, block 16" in report
    assert f"the server hit {100 * small['prefix_cache_hit_rate']:.1f}%" in report
    assert "the workload could hit" in (runs["on"].run_dir / "report.html").read_text()


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LocustRun]:
    """Four two-turn sessions sharing one system prompt, played about nine times each, with and
    without --cache-bust, against the engine's ample prefix cache."""
    directory = tmp_path_factory.mktemp("replays")
    options = SynthOptions(sessions=4, seed=5, max_turns=2, shared_prefixes=[PrefixPool(count=1, tokens=60)])
    spec, sessions = synthesize_workload("four", options)
    workload = save_workload(spec, sessions, directory / "four.yaml")
    return _at_once(
        directory / "reports", {"again": (ENGINE, workload, ()), "busted": (ENGINE, workload, ("--cache-bust",))}
    )


def test_cache_bust_keeps_replays_of_a_session_from_warming_each_other(replays: dict[str, LocustRun]) -> None:
    """Replayed plainly, a play's prompts are the last play's text and the server serves them from its
    cache; busted, each play opens with its own marker and only what one play shares is reused (the
    system prompt between its sessions, the history between turns). The report's ceiling follows,
    counted naively as the test above counts it. Busted, the server hits no more than it; replayed
    plainly it hits more, as the simulator's replies are the same words whatever was asked, while the
    figure counts a reply as the request's own: one more way replays warm each other."""
    again, busted = replays["again"], replays["busted"]
    assert again.manifest["flags"]["cache_bust"] is False and busted.manifest["flags"]["cache_bust"] is True
    plays = busted.records.session_id.str.partition("~")[2].replace("", "0").astype(int)
    assert plays.max() >= 5  # the workload was replayed over and over
    ceilings = {}
    for name, run in replays.items():
        server = run.summary["server"]
        ceilings[name] = server["workload_prefix"]["share"]
        assert ceilings[name] == pytest.approx(_naive_reusable_share(run), abs=1e-12)
        print(f"{name}: server {server['prefix_cache_hit_rate']:.4f}, ceiling {ceilings[name]:.4f}")
    hit = {name: run.summary["server"]["prefix_cache_hit_rate"] for name, run in replays.items()}
    assert hit["busted"] <= ceilings["busted"]
    assert ceilings["again"] > 0.7 and 0.1 < ceilings["busted"] < ceilings["again"] - 0.2
    assert hit["busted"] < hit["again"] - 0.2


def _block_ids_workload(directory: Path) -> Path:
    """150 single-turn requests given as 64-token block ids, each continuing one of a few conversations
    and ending in a partial block of its own, as a trace's hash ids do (a block's id hashes its content,
    so a partial block is never a later prompt's full one)."""
    rng = np.random.default_rng(8)
    conversations: list[list[int]] = []
    sessions, next_id = [], 0
    for k in range(150):
        if conversations and rng.random() < 0.75:
            ids = conversations[int(rng.integers(len(conversations)))]
        else:
            ids = []
            conversations.append(ids)
        if len(ids) > 8:
            del ids[2:]  # a conversation cut back to its system prompt and first question
        grown = int(rng.integers(0, 3))  # full blocks since its last request, then a partial one of its own
        ids += range(next_id, next_id + grown)
        tail = next_id + grown
        next_id += grown + 1
        tokens = 64 * len(ids) + int(rng.integers(8, 64))
        turn = Turn(blocks=[*ids, tail], prompt_tokens=tokens, output_tokens=4)
        sessions.append(Session(id=f"r{k}", turns=[turn]))
    return write_workload(directory, "blocks", sessions, block_size=64)


@pytest.fixture(scope="module")
def id_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LocustRun]:
    """Workloads given as block ids, each against an engine of its own, at once: `blocks` (see
    _block_ids_workload), `agents`, three small agentic traces built by `llmload workload build`, and the
    same traces replayed as traced with think times only (`agents-traced`), and as a closed loop of two
    conversations in flight (`agents-closed`)."""
    directory = tmp_path_factory.mktemp("ids")
    traces = write_agentic_traces(directory / "traces")
    agents = directory / "agents.yaml"
    assert main(["workload", "build", str(traces), "-o", str(agents)]) == 0
    traced = ("--arrival", "trace", "--use-think-time-only", "--model", "llmload-sim")
    return _at_once(
        directory / "reports",
        {"blocks": (ENGINE, _block_ids_workload(directory), ()), "agents": (ENGINE, agents, ()),
         "agents-traced": (ENGINE, agents, traced),
         "agents-closed": (ENGINE, agents, (*traced, "--sessions-in-flight", "2"))},
    )  # fmt: skip


def test_a_workload_of_block_ids_is_served_from_cache_as_its_ids_say(id_runs: dict[str, LocustRun]) -> None:
    """The block-id requests sent as the text each id always gives: the engine's own prefix cache hits
    what the ids share: at most the figure the report computes from the ids (which counts a prefix cached
    from its first request's send; the engine, once its prefill is done), and close to it."""
    run = id_runs["blocks"]
    assert run.records.session_id.str.contains("~").sum() == 0  # no request sent twice
    server = run.summary["server"]
    reuse = server["workload_prefix"]
    assert reuse["block_size"] == 64 and "block ids" in reuse["basis"]
    print(f"server {server['prefix_cache_hit_rate']:.4f}, ceiling {reuse['share']:.4f}")
    assert reuse["share"] > 0.3
    assert reuse["share"] - 0.08 <= server["prefix_cache_hit_rate"] <= reuse["share"]  # measured 0.515 of 0.560


def test_agentic_traces_are_replayed_with_their_subagents_and_served_as_their_ids_say(
    id_runs: dict[str, LocustRun],
) -> None:
    """Three small agentic traces (kv-cache-tester's format), each a main agent whose prompt grows by a
    tool result a turn and a subagent that opens with the parent's first blocks: built, their agents and
    subagents are sessions replayed side by side, and the engine's prefix cache hits what the ids
    share, at most the figure of what the run sent and close to it."""
    run = id_runs["agents"]
    assert len(load_workload(run.manifest["workload"]).sessions) == 6
    sent = run.records[run.records.status == "ok"]
    assert sent.session_id.str.contains("/agent_001").any() and sent.session_id.str.startswith("t0").any()
    server = run.summary["server"]
    reuse = server["workload_prefix"]
    print(f"server {server['prefix_cache_hit_rate']:.4f}, ceiling {reuse['share']:.4f}")
    assert reuse["block_size"] == 64 and reuse["share"] > 0.5
    assert reuse["share"] - 0.08 <= server["prefix_cache_hit_rate"] <= reuse["share"]


def test_an_agents_turn_after_its_subagent_waits_for_it_in_a_traced_replay(id_runs: dict[str, LocustRun]) -> None:
    """With think times only (1.5 s: each recorded 2 s gap less its 0.5 s answer), each agent runs ahead of
    its recorded clock, and so does its subagent: it starts right after the reply that spawned it (turn 2's,
    recorded 0 s before it), not at its recorded 4.5 s. Its second request follows 2.5 s after its first
    reply, so the agent's request after its entry (turn 3), due 1.5 s after turn 2's reply, goes out when the
    subagent's last reply is back, not when due. Every request asks for the run's one --model, whichever
    model of the trace it used (the subagent's was another)."""
    run = id_runs["agents-traced"]
    records = run.records
    assert run.returncode == 0 and (records.status == "ok").all(), run.output[-3000:]
    assert (records.model == "llmload-sim").all()
    joins = 0
    for play in records[~records.session_id.str.contains("/")].session_id.unique():
        agent = records[records.session_id == play].set_index("turn")
        name, _, replay = play.partition("~")
        subagent = records[records.session_id == f"{name}/agent_001" + (f"~{replay}" if replay else "")]
        if 3 not in agent.index or subagent.turn.max() != 1:
            continue  # the plan ended first
        joined, due = subagent.finished_at.max(), agent.finished_at[2] + 1.5
        assert subagent.sent_at.min() - agent.finished_at[2] < 0.3, (play, agent, subagent)  # spawned by turn 2
        assert joined <= agent.sent_at[3] <= joined + 0.5, (play, agent, subagent)
        assert joined > due + 0.5, (play, agent, subagent)  # the join held it, not its think time
        assert agent.schedule_delay_ms[3] < 100  # the trace's wait, not the load generator's lateness
        joins += 1
    assert joins >= 3


def test_sessions_in_flight_keep_two_conversations_open_recycling_the_traces(id_runs: dict[str, LocustRun]) -> None:
    """--sessions-in-flight 2 over the three traces: two conversations (an agent with its subagent) are in
    flight at every moment until the last ones stop for the plan's end, never three; the third opens when one
    ends and the traces are recycled (`t0~1`) with the subagent still spawned and joined; a conversation the
    plan's end cuts keeps its slot; the run asks for no rate and its report says it was a closed loop."""
    run = id_runs["agents-closed"]
    records = run.records
    assert run.returncode == 0 and (records.status == "ok").all(), run.output[-3000:]
    assert [(s["qps"], s["sessions"]) for s in run.manifest["stages"]] == [(0.0, 2), (0.0, 2)]
    assert run.summary["run"]["sessions_in_flight"] == 2 and run.summary["run"]["target_qps"] == 0
    assert "a closed loop of 2 trace conversations in flight" in (run.run_dir / "report.md").read_text()
    assert "closed loop · achieved" in run.output and "target 0.00" not in run.output  # the live figures
    conversation = records.session_id.str.replace("/agent_001", "", regex=False)
    spans = records.groupby(conversation).agg(begin=("sent_at", "min"), end=("finished_at", "max"))
    assert {"t0", "t1", "t2", "t0~1"} <= set(spans.index)
    plan_end = run.manifest["started_at"] + sum(s["duration_s"] for s in run.manifest["stages"])
    samples = np.arange(spans.begin.min() + 0.05, plan_end - 2.0, 0.05)
    in_flight = np.array([((spans.begin <= t) & (t <= spans.end)).sum() for t in samples])
    print(f"two in flight {(in_flight == 2).mean():.1%} of the plan; conversations {list(spans.index)}")
    assert in_flight.max() == 2 and (in_flight == 2).mean() > 0.9, in_flight
    agents = records[~records.session_id.str.contains("/")].groupby("session_id").turn.count()
    assert (agents < 6).sum() <= 2  # only the two the plan's end cut: no burst of first turns before it
    for play in spans.index:
        name, _, replay = play.partition("~")
        agent = records[records.session_id == play].set_index("turn")
        subagent = records[records.session_id == f"{name}/agent_001" + (f"~{replay}" if replay else "")]
        if 3 in agent.index:  # the agent's turn after its subagent's entry: spawned it, then joined it
            assert subagent.sent_at.min() >= agent.finished_at[2]
            assert agent.sent_at[3] >= subagent.finished_at.max()


def test_the_live_hit_rate_counts_from_the_runs_start() -> None:
    live = LiveStats([Stage(name="100%", percent=100, qps=1, start_s=0, duration_s=10)], np.zeros(0), 0)

    def sample(hits: float, queries: float) -> ServerSample:
        return ServerSample(t=0, health=200, prefix_cache_hits_total=hits, prefix_cache_queries_total=queries)

    live.see_server(sample(9_000, 10_000))  # since the server started: 90%, not this run's
    assert live.prefix_cache_hit_rate() is None
    live.see_server(sample(9_300, 11_000))
    assert live.prefix_cache_hit_rate() == pytest.approx(0.3)
    assert "30% since the run started" in json.dumps(tab_rows(live))
    live.see_server(sample(50, 100))  # the server restarted: its counters begin again
    assert live.prefix_cache_hit_rate() == pytest.approx(0.5)


def test_a_run_asked_to_reset_the_prefix_cache_starts_from_an_empty_one(tmp_path: Path) -> None:
    """vLLM's POST /reset_prefix_cache on the engine: a prompt served twice hits the cache the second time,
    not after a reset; a run with --reset-prefix-cache empties it before its first request (a prompt cached
    before the run misses after it) and run.json says how."""
    prompt = get_tokenizer("cl100k_base").decode(list(range(1000, 1300)))
    body = orjson.dumps({"model": "llmload-sim", "messages": [{"role": "user", "content": prompt}],
                         "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}})  # fmt: skip
    with SimProcess(*ENGINE) as sim:
        client = ChatClient(sim.url)
        cached = [client.stream_chat(body).cached_tokens for _ in range(2)]
        with urllib.request.urlopen(urllib.request.Request(sim.url + "/reset_prefix_cache", method="POST")) as answer:
            assert orjson.loads(answer.read()) == {"success": True}
        cached.append(client.stream_chat(body).cached_tokens)
        cached.append(client.stream_chat(body).cached_tokens)
        run = run_locust(
            sim.url, small_workload(tmp_path), tmp_path / "reports", "reset", "--target-qps", "4", "--stages", "100",
            "--stage-duration", "3", "--warmup", "0", "--arrival", "constant", "--reset-prefix-cache",
        )  # fmt: skip
        cached.append(client.stream_chat(body).cached_tokens)
        client.close()
    assert cached[0] == cached[2] == cached[4] == 0 and cached[1] == cached[3] >= 256, cached
    assert run.returncode == 0, run.output[-3000:]
    assert run.manifest["prefix_cache_reset"] == {"reset": True, "how": "POST /reset_prefix_cache"}
