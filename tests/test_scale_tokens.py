"""`--scale-tokens F`: a workload's lengths times F, its shared prefixes and growth per turn kept, so
that an agentic trace too long for a small model replays on the embedded target and on the real vLLM,
and the report says it was scaled."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from llmload.cli import main
from llmload.errors import InputError
from llmload.models import Session, Turn
from llmload.packaged import SAMPLE_WORKLOAD
from llmload.plan import PlanFlags, RunPlan
from llmload.sim.process import SimProcess
from llmload.workload.files import Workload, WorkloadError, load_workload
from llmload.workload.prefix import workload_prefix
from llmload.workload.scale import factor_for_max_prompt, scaled
from llmload.workload.stats import request_table
from llmload.workload.tokens import get_tokenizer
from tests.agentic import write_agentic_traces
from tests.locust_runs import run_locust, write_workload
from tests.vllm_harness import VllmServer


def _block_workload(directory: Path, tail_step: int = 4) -> Path:
    """40 sessions of three turns in 64-token blocks over a few shared openings, each turn ending in a
    partial block (of a multiple of `tail_step` tokens) with an id of its own."""
    rng = np.random.default_rng(3)
    sessions, next_id = [], 1000
    for number in range(40):
        ids = list(range(int(rng.integers(0, 3)) * 10, int(rng.integers(0, 3)) * 10 + 6))
        turns = []
        for _ in range(3):
            ids += range(next_id, next_id + int(rng.integers(1, 4)))
            next_id += 4
            tokens = 64 * len(ids) + tail_step * int(rng.integers(1, 64 // tail_step))
            turns.append(Turn(blocks=[*ids, next_id], prompt_tokens=tokens, output_tokens=int(rng.integers(8, 200))))
            next_id += 1
        sessions.append(Session(id=f"s{number}", turns=turns))
    return write_workload(directory, "blocks", sessions, block_size=64)


def test_blocks_keep_their_ids_and_shrink_so_the_reusable_share_is_unchanged(tmp_path: Path) -> None:
    original = load_workload(_block_workload(tmp_path))
    quarter = scaled(original, 0.25)
    assert quarter.spec.block_size == 16
    for before, after in zip(original.sessions, quarter.sessions, strict=True):
        for turn, small in zip(before.turns, after.turns, strict=True):
            assert small.blocks == turn.blocks
            full, tail = divmod(turn.prompt_tokens or 0, 64)
            assert small.prompt_tokens == 16 * full + tail // 4
            assert small.output_tokens == max(1, round((turn.output_tokens or 0) / 4))
    share, small_share = workload_prefix(original), workload_prefix(quarter)
    assert share.share is not None and share.share > 0.3
    assert small_share.share == pytest.approx(share.share, abs=1e-12)  # tails of 4k tokens: exactly
    assert small_share.prompt_tokens * 4 == share.prompt_tokens
    assert scaled(original, 1.0) is original


def test_a_factor_that_would_cut_a_block_is_refused_with_the_nearest_that_do_not(tmp_path: Path) -> None:
    original = load_workload(_block_workload(tmp_path))
    with pytest.raises(WorkloadError) as caught:
        scaled(original, 0.05)
    assert "blocks of 64 tokens 3.2 tokens long" in str(caught.value)
    assert "try 0.046875 (3 tokens) or 0.0625 (4)" in str(caught.value)
    with pytest.raises(InputError, match="--scale-tokens: Input should be greater than 0"):
        PlanFlags.checked(scale_tokens=0)
    with pytest.raises(InputError, match="--scale-tokens: Input should be less than or equal to 1"):
        PlanFlags.checked(scale_tokens=2)
    with pytest.raises(InputError, match=r"3\.2 tokens long"):
        RunPlan.build(PlanFlags(workload=str(original.path), target_qps=1, scale_tokens=0.05))


def test_messages_are_cut_to_the_factor_so_shared_text_stays_shared_and_history_grows_by_it() -> None:
    original = load_workload(SAMPLE_WORKLOAD)
    half = scaled(original, 0.5)
    tokenizer = get_tokenizer(original.spec.tokenizer)
    firsts = set()
    for before, after in zip(original.sessions, half.sessions, strict=True):
        for turn, small in zip(before.turns, after.turns, strict=True):
            for message, cut in zip(turn.messages, small.messages, strict=True):
                length = len(tokenizer.encode(message.content))
                assert message.content.startswith(cut.content[:-4])  # a prefix of it (a cut may split a character)
                assert abs(len(tokenizer.encode(cut.content)) - length / 2) <= 1.5, (message.content, cut.content)
            if turn.output_tokens is not None:
                assert small.output_tokens == max(1, round(turn.output_tokens / 2))
        firsts.add((before.turns[0].messages[0].content, after.turns[0].messages[0].content))
    # the same opening message is cut the same way in every session that sends it
    assert len({cut for _, cut in firsts}) == len({text for text, _ in firsts})
    # history: the scaled workload's whole prompts are about half the original's, turn by turn
    share, small_share = workload_prefix(original), workload_prefix(half)
    assert small_share.prompt_tokens == pytest.approx(share.prompt_tokens / 2, rel=0.1)
    assert share.share is not None and small_share.share == pytest.approx(share.share, abs=0.08)


def _longest_prompt(workload: Workload) -> int:
    return int(request_table(workload).prompt_tokens.max())


def test_a_target_longest_prompt_picks_the_largest_factor_that_keeps_blocks_whole(tmp_path: Path) -> None:
    blocks = load_workload(_block_workload(tmp_path))
    longest = _longest_prompt(blocks)
    for target in (longest // 2, longest // 3, 500, 64):
        factor = factor_for_max_prompt(blocks, target)
        assert (64 * factor).is_integer() and factor <= target / longest < factor + 1 / 64, (target, factor)
        assert _longest_prompt(scaled(blocks, factor)) <= target
    assert factor_for_max_prompt(blocks, longest) == 1.0
    with pytest.raises(WorkloadError, match=f"least it can be is {math.ceil(longest / 64):,} tokens"):
        factor_for_max_prompt(blocks, 10)
    # messages: cut to the factor, the longest whole prompt (history and all) at most the target
    sample = load_workload(SAMPLE_WORKLOAD)
    target = _longest_prompt(sample) // 3
    assert _longest_prompt(scaled(sample, factor_for_max_prompt(sample, target))) <= target
    # the plan records the factor it chose, which a report reloading the workload applies again
    plan = RunPlan.build(PlanFlags(workload=str(blocks.path), target_qps=1, scale_to_max_prompt=longest // 2))
    assert plan.flags.scale_tokens == factor_for_max_prompt(blocks, longest // 2) < 1
    with pytest.raises(InputError, match="give --scale-tokens or --scale-to-max-prompt, not both"):
        RunPlan.build(PlanFlags(workload=str(blocks.path), target_qps=1, scale_tokens=0.5, scale_to_max_prompt=99))


def _agents(tmp_path: Path, *build_flags: str) -> Path:
    """Agentic traces whose prompts (up to ~2,900 tokens) do not fit a 2,048-token context."""
    traces = write_agentic_traces(tmp_path / "traces", opening_blocks=30)
    out = tmp_path / "agents.yaml"
    assert main(["workload", "build", str(traces), "-o", str(out), *build_flags]) == 0
    assert _longest_prompt(load_workload(out)) > 2048

    return out


def _replay(host: str, workload: Path, reports: Path, *scale: str) -> tuple[object, object]:
    run = run_locust(
        host, workload, reports, "scaled", "--target-qps", "2", "--stages", "100", "--stage-duration", "10",
        "--warmup", "2", "--arrival", "constant", *scale, "--drain-timeout", "60", timeout=180,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.output[-3000:]
    return run, run.records


def test_a_trace_too_long_for_the_target_replays_scaled_and_the_report_says_so(tmp_path: Path) -> None:
    """The embedded engine with a 1,024-token context: scaled to a quarter of the longest prompt (which
    keeps 64-token blocks whole at 16 tokens: factor 0.25) every request fits, the engine's prefix cache
    hits what the ids share (at most the figure, close to it), and the report names the factor."""
    workload = _agents(tmp_path)
    quarter = math.ceil(_longest_prompt(load_workload(workload)) / 4)
    engine = ("--profile", "vllm-cpu-tiny", "--block-size", "16", "--max-model-len", "1024")
    with SimProcess(*engine, "--enable-prompt-tokens-details") as sim:
        run, records = _replay(sim.url, workload, tmp_path / "reports", "--scale-to-max-prompt", str(quarter))
    ok = records[records.status == "ok"]
    assert len(ok) == len(records) > 10 and ok.session_id.str.contains("/agent_001").any()
    planned = {(s.id, i): t.prompt_tokens for s in scaled(load_workload(workload), 0.25).sessions for i, t in
               enumerate(s.turns)}  # fmt: skip
    sent = [planned[(row.session_id.split("~")[0], row.turn)] for row in ok.itertuples()]
    # as long as the scaled trace says, under the workload's tokenizer; the engine counts its own chat
    # template's tokens on top, the same number for every request
    assert len(set(ok.prompt_tokens.to_numpy() - np.array(sent))) == 1, (ok.prompt_tokens.tolist(), sent)
    assert ok.prompt_tokens.max() <= 1024 < 4 * ok.prompt_tokens.max()
    assert (ok.output_tokens == 2).all()  # 6 recorded, scaled to 1.5 → 2
    summary = run.summary
    assert summary["run"]["token_scale"] == 0.25 and run.manifest["flags"]["scale_tokens"] == 0.25
    assert run.manifest["flags"]["scale_to_max_prompt"] == quarter
    reuse, hit = summary["server"]["workload_prefix"], summary["server"]["prefix_cache_hit_rate"]
    print(f"server {hit:.4f}, ceiling {reuse['share']:.4f}")
    assert reuse["block_size"] == 16 and reuse["share"] > 0.8
    assert reuse["share"] - 0.08 <= hit <= reuse["share"], (hit, reuse["share"])
    # conversation by conversation (an agent with its subagent, each replay its own): what the prompts
    # could hit beside what the server's usage says it did
    could, did = reuse["by_conversation"], summary["cached_share_by_conversation"]
    assert could["conversations"] == did["conversations"] >= 3 and did["median"] <= could["max"]
    report = (run.run_dir / "report.md").read_text()
    assert "with every length ×0.25 (--scale-tokens)" in report
    assert f"By conversation, the prompts sent could hit min {could['min']:.1%}" in report
    assert f"By conversation, the server's usage says min {did['min']:.1%}" in report


@pytest.mark.vllm
def test_the_same_trace_scaled_replays_on_the_real_vllm(
    vllm_server: VllmServer, vllm_tiny_model: Path, tmp_path: Path
) -> None:
    """The shared vLLM (max_model_len 2,048) with the trace built under the model's own tokenizer:
    scaled by 0.5 every request is served, each prompt as long as the scaled trace says."""
    workload = _agents(tmp_path, "--tokenizer", f"hf:{vllm_tiny_model}")
    run, records = _replay(vllm_server.url, workload, tmp_path / "reports", "--scale-tokens", "0.5")
    assert (records.status == "ok").all() and len(records) > 10, records.error_category.value_counts()
    planned = {(s.id, i): t.prompt_tokens for s in scaled(load_workload(workload), 0.5).sessions for i, t in
               enumerate(s.turns)}  # fmt: skip
    sent = np.array([planned[(row.session_id.split("~")[0], row.turn)] for row in records.itertuples()])
    assert records.usage_from_server.all()
    assert np.abs(records.prompt_tokens.to_numpy() - sent).max() <= 2, (records.prompt_tokens.tolist(), sent)
    assert 1024 < records.prompt_tokens.max() <= 2048
    # the trace's share is in its scaled 32-token blocks; vLLM's CPU cache holds 128-token ones, and never a
    # prompt's last token: what those could hit, the server hit (usage), to within a point (measured: equal)
    hit, reuse = run.summary["server"]["prefix_cache_hit_rate"], run.summary["server"]["workload_prefix"]
    ok = records[records.stage != "warm-up"]
    from_usage = ok.cached_tokens.sum() / ok.prompt_tokens.sum()
    print(
        f"server {hit:.4f} (usage {from_usage:.4f}), ceiling {reuse['share']:.4f}, its blocks {reuse['server_share']}"
    )
    assert reuse["block_size"] == 32 and reuse["server_block_size"] == 128
    assert 0.3 < hit <= reuse["server_share"] < reuse["share"]
    assert from_usage == pytest.approx(reuse["server_share"], abs=0.01)
    assert reuse["server_share"] - hit < 0.05
