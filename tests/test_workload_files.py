"""Workload file v1: strict loading with the file, line and key named; exact synthetic lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmload.workload import WorkloadError, load_workload, save_workload
from llmload.workload.synth import SynthOptions, TextSynthesizer, synthesize_workload
from llmload.workload.tokens import get_tokenizer

REPO = Path(__file__).resolve().parents[1]


def test_shipped_workload_is_multi_turn_with_growing_history() -> None:
    workload = load_workload(REPO / "workloads" / "chat-multiturn.yaml")
    turns = [len(s.turns) for s in workload.sessions]
    assert min(turns) == 1 and max(turns) == 8
    assert workload.spec.tokenizer == "cl100k_base"
    long_session = next(s for s in workload.sessions if len(s.turns) >= 4)
    prompts = [t.prompt_tokens for t in long_session.turns]
    assert prompts == sorted(prompts) and prompts[-1] > prompts[0]
    assert all(t.think_time_s > 0 for t in long_session.turns[1:])


def test_synthetic_text_has_the_exact_token_count() -> None:
    tokenizer = get_tokenizer("cl100k_base")
    synth = TextSynthesizer(tokenizer, seed=5)
    for n in (1, 2, 17, 256, 3000):
        assert tokenizer.count(synth.text(n)) == n


def test_round_trip(tmp_path: Path) -> None:
    spec, sessions = synthesize_workload("rt", SynthOptions(sessions=5, seed=1))
    path = save_workload(spec, sessions, tmp_path / "rt.yaml")
    loaded = load_workload(path)
    assert loaded.sessions == sessions and loaded.spec.name == "rt"


def test_misspelt_key_names_the_key_and_file(tmp_path: Path) -> None:
    spec, sessions = synthesize_workload("typo", SynthOptions(sessions=2))
    path = save_workload(spec, sessions, tmp_path / "typo.yaml")
    path.write_text(path.read_text().replace("target_qps", "taget_qps") + "taget_qps: 3\n")
    line = path.read_text().splitlines().index("taget_qps: 3") + 1
    with pytest.raises(WorkloadError, match=rf"typo\.yaml:{line}: taget_qps: unknown key; did you mean target_qps\?"):
        load_workload(path)


def test_bad_session_line_names_file_and_line(tmp_path: Path) -> None:
    spec, sessions = synthesize_workload("bad", SynthOptions(sessions=3))
    path = save_workload(spec, sessions, tmp_path / "bad.yaml")
    jsonl = tmp_path / "bad.sessions.jsonl"
    lines = jsonl.read_text().splitlines()
    lines[1] = lines[1].replace('"turns"', '"tunrs"')
    jsonl.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match=r"bad\.sessions\.jsonl:2: .*tunrs: unknown key"):
        load_workload(path)
    jsonl.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(WorkloadError, match=r"bad\.sessions\.jsonl:2: not valid JSON"):
        load_workload(path)


def test_runs_of_block_ids_are_read_as_the_ids_they_stand_for(tmp_path: Path) -> None:
    """A sessions file may give consecutive ids as [first, count]: read, they are the ids spelt out, and
    written again they are the same runs (an agent's turn of thousands of ids is a few items)."""
    (tmp_path / "s.yaml").write_text("version: 1\nname: s\nsessions: s.sessions.jsonl\nblock_size: 64\n")
    turn = '{"blocks": [[7, 4], 2, 3, [100, 3]], "prompt_tokens": 576, "output_tokens": 5}'
    (tmp_path / "s.sessions.jsonl").write_text(f'{{"id": "a", "turns": [{turn}]}}\n')
    (session,) = load_workload(tmp_path / "s.yaml").sessions
    assert session.turns[0].blocks == [7, 8, 9, 10, 2, 3, 100, 101, 102]
    assert session.model_dump(mode="json")["turns"][0]["blocks"] == [[7, 4], 2, 3, [100, 3]]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"nope\.yaml: cannot read"):
        load_workload(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("yaml_extra", "turn", "message"),
    [
        (
            "",
            '{"blocks": [1], "prompt_tokens": 100, "output_tokens": 5}',
            "s.sessions.jsonl:2: turn 1 gives its prompt as blocks, and the workload's YAML names no block_size",
        ),
        (
            "block_size: 64\n",
            '{"blocks": [1], "prompt_tokens": 200, "output_tokens": 5}',
            "s.sessions.jsonl:2: turn 1 has 1 blocks for prompt_tokens 200 (4 of 64 tokens, the last may be partial)",
        ),
        (
            "block_size: 64\n",
            '{"blocks": [1], "output_tokens": 5}',
            "s.sessions.jsonl:2: turns.0: a turn of blocks needs prompt_tokens",
        ),
        ("", '{"output_tokens": 5}', "s.sessions.jsonl:2: turns.0: a turn has messages or blocks"),
        (
            "block_size: 64\n",
            '{"blocks": [[1, 2, 3]], "prompt_tokens": 192, "output_tokens": 5}',
            "s.sessions.jsonl:2: turns.0.blocks: a block is an id >= 0 or a run [first id, count >= 1], got [1, 2, 3]",
        ),
    ],
)
def test_a_turn_of_blocks_is_checked_against_the_spec_with_its_line(
    tmp_path: Path, yaml_extra: str, turn: str, message: str
) -> None:
    (tmp_path / "s.yaml").write_text(f"version: 1\nname: s\nsessions: s.sessions.jsonl\n{yaml_extra}")
    good = '{"id": "a", "turns": [{"messages": [{"role": "user", "content": "hi"}], "output_tokens": 5}]}'
    (tmp_path / "s.sessions.jsonl").write_text(f'{good}\n{{"id": "b", "turns": [{turn}]}}\n')
    with pytest.raises(WorkloadError) as caught:
        load_workload(tmp_path / "s.yaml")
    assert message in str(caught.value)
