"""The reusable-prefix figure of `workload stats`: against an independent trie of blocks on the sample
workload (prompts rendered with ChatML, and as message text alone), and against shares worked out by
hand on an OpenAI log, a Mooncake trace and an Azure trace."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from llmload.cli import main
from llmload.workload.files import load_workload
from llmload.workload.prefix import PrefixBlocks, server_block_size
from llmload.workload.stats import request_table
from llmload.workload.tokens import GENERATION_PROMPT, MESSAGE_END, chatml_message, get_tokenizer
from tests.agentic import write_agentic_traces

SAMPLE = Path(__file__).resolve().parents[1] / "workloads" / "chat-multiturn.yaml"


def _stats(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["workload", "stats", *args, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _naive_reuse(path: Path, block_size: int, chatml: bool) -> tuple[int, int, int, int, dict[int, tuple[int, int]]]:
    """Every prompt as a flat token list, rendered whole from its messages (ChatML pieces and the
    generation prompt, or the texts alone; each reply as tokens unique to its request), its full
    blocks looked up in a trie of every block an earlier request cached: its prompt, then its reply
    but the last token. (prompt, reusable, history, shared, {turn: (prompt, reusable)})."""
    workload = load_workload(path)
    encode = get_tokenizer(workload.spec.tokenizer).encode
    requests = []  # (session, turn, flat prompt)
    for session in workload.sessions:
        for index in range(len(session.turns)):
            flat: list[object] = []
            for earlier, asked in enumerate(session.turns[: index + 1]):
                if earlier:
                    previous = session.turns[earlier - 1]
                    reply = [("reply", session.id, earlier - 1)] * (previous.output_tokens or previous.max_tokens or 0)
                    flat += [*encode(GENERATION_PROMPT), *reply, *encode(MESSAGE_END)] if chatml else reply
                for m in asked.messages:
                    flat += encode(chatml_message(m.role, m.content) if chatml else m.content)
            flat += encode(GENERATION_PROMPT) if chatml else []
            turn = session.turns[index]
            decoded = [("reply", session.id, index)] * max((turn.output_tokens or turn.max_tokens or 0) - 1, 0)
            requests.append((session.id, index, flat, decoded))
    arrivals = request_table(workload)["arrival_s"].tolist()
    order = sorted(range(len(requests)), key=lambda i: (arrivals[i], i))
    trie: dict[tuple[int, tuple[object, ...]], tuple[int, str]] = {}  # (parent node, block) -> (node, first session)
    totals = [0, 0, 0, 0]
    by_turn: dict[int, tuple[int, int]] = {}
    for i in order:
        session, turn, flat, decoded = requests[i]
        node, reusable, shared = 0, 0, 0
        for start in range(0, len(flat) - block_size + 1, block_size):
            edge = (node, tuple(flat[start : start + block_size]))
            if edge not in trie:
                break
            node, first = trie[edge]
            reusable += block_size
            shared += block_size if first != session else 0
        cached, node = flat + decoded, 0
        for start in range(0, len(cached) - block_size + 1, block_size):
            node = trie.setdefault((node, tuple(cached[start : start + block_size])), (len(trie) + 1, session))[0]
        for k, v in enumerate((len(flat), reusable, reusable - shared, shared)):
            totals[k] += v
        p, r = by_turn.get(turn + 1, (0, 0))
        by_turn[turn + 1] = (p + len(flat), r + reusable)
    return totals[0], totals[1], totals[2], totals[3], by_turn


@pytest.mark.parametrize("template", ["chatml", "none"])
@pytest.mark.parametrize("block_size", [16, 128])
def test_the_sample_workload_matches_an_independent_trie_of_blocks(
    block_size: int, template: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--block-size", str(block_size), "--chat-template", template)
    reuse = _stats(capsys, str(SAMPLE), *flags)["reusable_prefix"]
    assert isinstance(reuse, dict)
    assert reuse["chat_template"] == template
    prompt, reusable, history, shared, by_turn = _naive_reuse(SAMPLE, block_size, chatml=template == "chatml")
    assert (reuse["prompt_tokens"], reuse["reusable_tokens"]) == (prompt, reusable)
    assert (reuse["history_tokens"], reuse["shared_tokens"]) == (history, shared)
    assert reuse["share"] == pytest.approx(reusable / prompt)
    assert reuse["block_size"] == block_size and 0.2 < reuse["share"] < 1 and shared > 0 and history > 0
    assert {row["turn"]: row["share"] for row in reuse["by_turn"]} == pytest.approx(
        {turn: r / p for turn, (p, r) in by_turn.items()}
    )
    assert main(["workload", "stats", str(SAMPLE), *flags]) == 0
    text = capsys.readouterr().out
    assert f"Reusable prefix (an infinite prefix cache, {block_size}-token blocks" in text
    assert f"{100 * reusable / prompt:.1f}% of {prompt:,} prompt tokens" in text


def _chat(at: float, messages: list[tuple[str, str]], reply: str, reply_tokens: int) -> bytes:
    record = {
        "timestamp": at,
        "request": {"messages": [{"role": r, "content": c} for r, c in messages]},
        "response": {
            "choices": [{"message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": 99, "completion_tokens": reply_tokens},
        },
    }
    return orjson.dumps(record) + b"\n"


def test_an_openai_log_gives_the_shares_worked_out_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Message text alone, 4-token blocks. System S: 8 tokens; users A1 6, B1 5, A2 4; A1's reply 3 tokens.
    A1 = S+A1 (14 tokens, 3 blocks): nothing seen. B1 = S+B1 (13): S's 2 blocks, first sent by
    session A: 8 shared. A2 = S+A1+reply+A2 (21, 5 blocks): A1's 3 blocks and block 4 (A1's last 2
    tokens and the reply's first 2, which A1 cached as it decoded), 16 history; block 5 is new.
    Total 48 tokens, 24 reusable."""
    system, a1, b1, a2, reply = " hello" * 8, " apple" * 6, " banana" * 5, " cherry" * 4, " yes" * 3
    log = tmp_path / "chat.jsonl"
    log.write_bytes(
        _chat(1000.0, [("system", system), ("user", a1)], reply, 3)
        + _chat(1001.0, [("system", system), ("user", b1)], " no" * 2, 2)
        + _chat(1002.0, [("system", system), ("user", a1), ("assistant", reply), ("user", a2)], " ok", 1)
    )
    stats = _stats(capsys, str(log), "--block-size", "4", "--chat-template", "none")
    assert stats["sessions"] == 2
    reuse = stats["reusable_prefix"]
    assert isinstance(reuse, dict)
    assert (reuse["prompt_tokens"], reuse["reusable_tokens"], reuse["history_tokens"], reuse["shared_tokens"]) == (
        48,
        24,
        16,
        8,
    )
    assert [(row["turn"], row["requests"], row["share"]) for row in reuse["by_turn"]] == [
        (1, 2, pytest.approx(8 / 27)),
        (2, 1, pytest.approx(16 / 21)),
    ]


def test_mooncake_hash_ids_are_the_blocks_and_only_match_with_their_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """512-token blocks whatever --block-size says; a partial last block never counts; id 2 first in
    line 4 does not match line 1's id 2, which followed id 1."""
    lines = [(0, 1100, [1, 2, 3]), (1000, 1536, [1, 2, 4]), (2000, 600, [5, 2]), (3000, 512, [2])]
    log = tmp_path / "mooncake.jsonl"
    log.write_bytes(
        b"".join(
            orjson.dumps({"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": h}) + b"\n"
            for t, n, h in lines
        )
    )
    reuse = _stats(capsys, str(log), "--block-size", "16")["reusable_prefix"]
    assert isinstance(reuse, dict)
    assert reuse["block_size"] == 512 and "hash_ids" in reuse["basis"]
    assert (reuse["prompt_tokens"], reuse["reusable_tokens"], reuse["shared_tokens"]) == (3748, 1024, 1024)


def test_a_log_of_lengths_only_has_no_figure_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "azure.csv"
    rows = ("TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.68,374,44", "2023-11-16 18:15:50.99,396,9")
    log.write_text("\n".join(rows) + "\n")
    stats = _stats(capsys, str(log))
    assert stats["reusable_prefix"] is None
    assert stats["reusable_prefix_absent"] == "the log carries no text or hashes"
    assert main(["workload", "stats", str(log)]) == 0
    assert "Reusable prefix: none (the log carries no text or hashes)." in capsys.readouterr().out


def test_a_built_trace_keeps_its_ids_and_its_figure_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Mooncake-style trace of 400 lines, each continuing one of 40 conversations (so ids recur at
    the same prefix) or opening a new one: the workload built from it holds the ids, and its reusable
    prefix is the trace's, token for token."""
    rng = np.random.default_rng(3)
    conversations: list[list[int]] = []
    lines, next_id = [], 0
    for k in range(400):
        if conversations and rng.random() < 0.7:
            ids = conversations[int(rng.integers(len(conversations)))]
        else:
            ids = []
            conversations.append(ids)
        grown = int(rng.integers(1, 4))
        ids += range(next_id, next_id + grown)
        next_id += grown
        length = 512 * (len(ids) - 1) + int(rng.integers(1, 513))
        lines.append({"timestamp": 100 * k, "input_length": length, "output_length": 9, "hash_ids": list(ids)})
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    assert main(["workload", "build", str(trace), "-o", str(tmp_path / "built.yaml")]) == 0
    capsys.readouterr()
    built = load_workload(tmp_path / "built.yaml")
    assert [s.turns[0].blocks for s in built.sessions] == [line["hash_ids"] for line in lines]
    from_trace = _stats(capsys, str(trace))["reusable_prefix"]
    from_built = _stats(capsys, str(tmp_path / "built.yaml"))["reusable_prefix"]
    assert isinstance(from_trace, dict) and from_trace["share"] > 0.3
    assert from_built == from_trace


def test_each_agentic_conversations_share_equals_an_independent_recount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight agentic traces, each a main agent and a subagent opening with its parent's first blocks:
    `workload stats` of the traces and of the workload built from them give each conversation's share
    (the agent with its subagent) spread as kv-cache-tester publishes its corpus's, and a naive recount,
    trace by trace (a block matches where its whole prefix was sent before; full blocks only), equals it.
    So do the split into history (a block its own session sent before: the agent's, or the subagent's) and
    shared (one the other sent first), and the share by turn index."""
    traces = write_agentic_traces(tmp_path / "traces", traces=8, opening_blocks=5, seed=11)
    shares, split, by_turn = [], Counter[str](), Counter[tuple[int, str]]()
    for path in sorted(traces.glob("*.json")):
        trace = orjson.loads(path.read_bytes())
        requests = []
        for entry in trace["requests"]:
            subagent = entry.get("type") == "subagent"
            for request in entry["requests"] if subagent else [entry]:
                at = entry["t"] + request["t"] if subagent else entry["t"]
                requests.append((at, entry["agent_id"] if subagent else "main", request))
        first_sent_by: dict[tuple[int, ...], str] = {}
        turns = Counter[str]()
        prompt = reusable = 0
        for _, session, request in sorted(requests, key=lambda row: row[0]):
            full = request["hash_ids"][: request["in"] // 64]
            prefixes = [tuple(full[: k + 1]) for k in range(len(full))]
            matched = prefixes[: next((k for k, p in enumerate(prefixes) if p not in first_sent_by), len(prefixes))]
            reusable += 64 * len(matched)
            prompt += request["in"]
            for prefix in matched:
                split["history" if first_sent_by[prefix] == session else "shared"] += 64
            by_turn[turns[session], "prompt"] += request["in"]
            by_turn[turns[session], "reusable"] += 64 * len(matched)
            by_turn[turns[session], "requests"] += 1
            turns[session] += 1
            for prefix in prefixes:
                first_sent_by.setdefault(prefix, session)
        shares.append(reusable / prompt)
    low, p25, median, p75, high = np.percentile(shares, [0, 25, 50, 75, 100])
    expected = {"conversations": 8, "min": low, "p25": p25, "median": median, "p75": p75, "max": high}
    expected["mean"] = float(np.mean(shares))
    from_traces = _stats(capsys, str(traces))["reusable_prefix"]
    assert main(["workload", "build", str(traces), "-o", str(tmp_path / "agents.yaml")]) == 0
    capsys.readouterr()
    from_built = _stats(capsys, str(tmp_path / "agents.yaml"))["reusable_prefix"]
    for figure in (from_traces, from_built):
        assert isinstance(figure, dict)
        assert figure["by_conversation"] == pytest.approx(expected, abs=1e-12), (figure["by_conversation"], expected)
        assert (figure["history_tokens"], figure["shared_tokens"]) == (split["history"], split["shared"])
        assert split["history"] > split["shared"] > 0
        counted = sorted({turn for turn, _ in by_turn})
        assert [(row["turn"], row["requests"]) for row in figure["by_turn"]] == [
            (turn + 1, by_turn[turn, "requests"]) for turn in counted
        ]
        assert [row["share"] for row in figure["by_turn"]] == pytest.approx(
            [by_turn[turn, "reusable"] / by_turn[turn, "prompt"] for turn in counted], abs=1e-12
        )
    assert main(["workload", "stats", str(tmp_path / "agents.yaml")]) == 0
    assert f"By conversation: min {low:.1%}, P25 {p25:.1%}" in capsys.readouterr().out


def test_the_servers_block_is_read_from_its_hits_and_bounds_what_it_could_hit() -> None:
    """A server's cached tokens are whole blocks of its own: their common divisor over enough hits is its
    block. In those blocks, short of each prompt's last token (recomputed to start decoding), a request
    reuses less than the figure's finer blocks say: 5 reusable 32-token blocks are one 128-token block,
    a whole cached prompt of 256 tokens only one more than that."""
    assert server_block_size(np.array([128, 256, 0, np.nan] + [384] * 18 + [1280])) == 128
    assert server_block_size(np.array([128] * 19)) is None  # too few hits to tell 128 from a multiple of it
    blocks = PrefixBlocks.from_hash_ids(32)
    blocks.add_hashed_session([(0, np.arange(8), 256), (1, np.arange(8), 256)], [0.0, 1.0], 0)
    blocks.add_hashed_session([(0, np.r_[np.arange(5), 90, 91], 224)], [2.0], 1)
    figure = blocks.result(server_block=128)
    assert (figure.reusable_tokens, figure.prompt_tokens) == (256 + 160, 736)
    assert figure.server_block_size == 128 and figure.server_share == pytest.approx((128 + 128) / 736)
    assert blocks.result().server_share is None
    # the verdict and report.md judge a hit rate against the server's blocks where known, else the figure's
    assert (
        figure.ceiling == (figure.server_share, 128, True) and figure.ceiling.blocks == "the server's 128-token blocks"
    )
    finer = blocks.result().ceiling
    assert finer == (figure.share, 32, False) and finer.blocks == "32-token blocks"
