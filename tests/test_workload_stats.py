"""Workload statistics: equal to an independent pandas computation on the real Azure trace, the same
from a log and from the workload built from it, rendered, plotted and printed as JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmload.cli import main
from llmload.models import Message, Session, Turn, WorkloadSpec
from llmload.workload import load_workload, save_workload
from llmload.workload.build import BuildOptions, build_workload, source_table
from llmload.workload.distributions import Fixed
from llmload.workload.stats import TABLE_COLUMNS, render_stats, request_table, workload_stats
from llmload.workload.tokens import get_tokenizer
from tests.agentic import write_compacting_traces

AZURE = Path(__file__).resolve().parents[1] / "data" / "azure_llm_inference_conv_2023.csv"
LOGS = Path(__file__).parent / "data" / "logs"
QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}


def run_cli(*argv: str) -> int:
    return main(["workload", *argv])


@pytest.fixture(scope="module")
def azure_stats() -> dict[str, object]:
    return workload_stats(source_table([AZURE]).table).model_dump()


def test_azure_trace_stats_equal_pandas(azure_stats: dict[str, object]) -> None:
    trace = pd.read_csv(AZURE)
    stats = azure_stats
    for key, series in (
        ("prompt_tokens", trace["ContextTokens"]),
        ("output_tokens", trace["GeneratedTokens"]),
        ("total_tokens", trace["ContextTokens"] + trace["GeneratedTokens"]),
    ):
        got = stats[key]
        assert isinstance(got, dict)
        for name, q in QUANTILES.items():
            assert got[name] == series.quantile(q, interpolation="linear"), (key, name)
        assert got["max"] == series.max() and got["count"] == len(trace)
    arrivals = pd.to_datetime(trace["TIMESTAMP"])
    gaps = arrivals.diff().dt.total_seconds().dropna()
    inter = stats["inter_arrival_s"]
    assert isinstance(inter, dict)
    for name in ("p50", "p99"):
        assert inter[name] == pytest.approx(gaps.quantile(QUANTILES[name], interpolation="linear"), abs=1e-6)
    span = (arrivals.iloc[-1] - arrivals.iloc[0]).total_seconds()
    assert stats["duration_s"] == pytest.approx(span, abs=1e-6)
    assert stats["requests_per_s"] == pytest.approx(1 / gaps.mean(), rel=1e-9)
    assert stats["requests"] == stats["sessions"] == len(trace) == 19_366
    turns = stats["turns_per_session"]
    assert isinstance(turns, dict) and turns["p99"] == turns["max"] == 1
    prompt_p99 = trace["ContextTokens"].quantile(0.99, interpolation="linear")
    output_p99 = trace["GeneratedTokens"].quantile(0.99, interpolation="linear")
    assert stats["max_tokens"] == math.ceil(output_p99)  # no max_tokens in the trace: P99 of the output
    assert stats["recommended_max_model_len"] == math.ceil((prompt_p99 + math.ceil(output_p99)) / 16) * 16
    assert stats["recommended_max_model_len"] == 4752
    by_turn = stats["prompt_tokens_by_turn"]
    assert isinstance(by_turn, list) and len(by_turn) == 1
    assert by_turn[0]["prompt_tokens_p99"] == prompt_p99


def test_max_tokens_override_and_rounding() -> None:
    table = source_table([LOGS / "azure-conv-head.csv"]).table
    stats = workload_stats(table, max_tokens=1000)
    p99 = float(np.percentile([374, 396, 879, 91, 91, 381], 99))
    assert stats.max_tokens == 1000 and stats.max_tokens_configured
    assert stats.recommended_max_model_len == math.ceil((p99 + 1000) / 16) * 16 == 1856
    assert "rounded up to a multiple of 16" in render_stats(stats)


def test_built_workload_has_the_stats_of_its_source(tmp_path: Path) -> None:
    """Agentic traces record each request's API time: the think time leaves it out, the arrivals and the
    request rate keep it, from the trace and from its build alike (before, the trace's arrivals were its
    think times summed, a request rate 6% high, and its build's think times the recorded gaps, 1 s long)."""
    agentic = write_compacting_traces(tmp_path / "traces")
    for source in (*(LOGS / name for name in ("openai.jsonl", "sharegpt.json", "vllm-0.32-debug.log")),
                   LOGS / "mooncake.jsonl", agentic):  # fmt: skip
        out = tmp_path / f"{source.stem}.yaml"
        options = BuildOptions(output_tokens=Fixed(kind="fixed", value=7))  # sharegpt.json ends unanswered
        result = build_workload([source], out, options, progress=None)
        log = source_table([source], options)
        name = source.name
        reuse = log.reusable_prefix  # the same log's figure: here the request tables are compared
        from_source = workload_stats(log.table, think_times=log.think_times, reusable_prefix=reuse)
        from_file = workload_stats(
            request_table(load_workload(out)), think_times=log.think_times, reusable_prefix=reuse
        )
        assert result.stats == from_source == from_file, name
        assert load_workload(out).spec.stats == result.stats.model_dump(mode="json")
    think = result.stats.think_time_s
    assert think.count == 192 and think.max is not None and think.max <= 28  # each gap (at most 29 s) less 1 s


def test_history_growth_and_session_shape() -> None:
    table = source_table([LOGS / "openai.jsonl"]).table
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert table.dtypes.astype(str).tolist() == ["str", "int64", "float64", "float64", "int64", "float64", "float64"]
    stats = workload_stats(table)
    count = get_tokenizer().count
    third_session_second_turn = sum(count(t) for t in (SYSTEM_PROMPT, "hi", "Hi, what can I do for you?"))
    third_session_second_turn += count("Cancel my plan.")
    first_prompts = [25, 18, count(SYSTEM_PROMPT) + count("hi")]
    second_prompts = [40, third_session_second_turn]
    third_prompts = [40 + count("It ships tomorrow.") + count("Thanks!")]
    growth = [(r.turn, r.requests, r.prompt_tokens_p50, r.prompt_tokens_p99) for r in stats.prompt_tokens_by_turn]
    assert growth == [
        (turn, len(values), float(np.percentile(values, 50)), float(np.percentile(values, 99)))
        for turn, values in ((1, first_prompts), (2, second_prompts), (3, third_prompts))
    ]
    assert (stats.turns_per_session.p50, stats.turns_per_session.max) == (2.0, 3.0)
    assert stats.output_tokens.count == 4  # the last turns' outputs are unknown
    assert stats.requests_per_s == pytest.approx(0.5)
    assert stats.inter_arrival_s.p50 == pytest.approx(float(np.percentile([2, 3.5, 0.5, 3, 1], 50)))


SYSTEM_PROMPT = "You are the support assistant of an online shop. Be short and polite."


def test_request_table_estimates_missing_prompt_lengths(tmp_path: Path) -> None:
    count = get_tokenizer().count
    spec = WorkloadSpec(version=1, name="hand", sessions="hand.sessions.jsonl")
    session = Session(
        id="s",
        offset_s=3.0,
        turns=[
            Turn(messages=[Message(role="user", content="Where is my order?")], output_tokens=50),
            Turn(messages=[Message(role="user", content="Thanks!")], max_tokens=20, think_time_s=2.5),
        ],
    )
    table = request_table(load_workload(save_workload(spec, [session], tmp_path / "hand.yaml")))
    first = count("Where is my order?")
    assert table["prompt_tokens"].tolist() == [first, first + 50 + count("Thanks!")]
    assert table["arrival_s"].tolist() == [3.0, 5.5]
    assert table["max_tokens"].isna().tolist() == [True, False]


def test_stats_cli_json_plot_and_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "chat.yaml"
    build_workload([LOGS / "openai.jsonl"], out, BuildOptions(), progress=None)
    plot = tmp_path / "plots" / "chat.png"
    assert run_cli("stats", str(out), "--json", "--plot", str(plot)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == load_workload(out).spec.stats
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run_cli("stats", str(LOGS / "openai.jsonl"), "--max-tokens", "100") == 0
    text = capsys.readouterr().out
    assert "| prompt tokens |" in text and "max_tokens 100 (given)" in text
    assert run_cli("stats", str(LOGS / "openai-bad.jsonl")) == 2
    assert f"{LOGS / 'openai-bad.jsonl'}:2: not valid JSON" in capsys.readouterr().err
    assert run_cli("stats", str(LOGS / "openai-bad.jsonl"), "--skip-bad", "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["requests"] == 2 and "skipped bad 5 line(s)" in captured.err
