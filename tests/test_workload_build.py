"""`llmload workload build`: every log format, session grouping, token counts, synthesis, redaction, bad input.

Fixtures are in tests/data/logs (README there says where each comes from); the vLLM 0.32 excerpt
is a real server's log. Every built workload is read back with the strict loader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmload.cli import main
from llmload.errors import InputError
from llmload.models import SessionLinks, Turn, conversations
from llmload.workload import Workload, load_workload
from llmload.workload.blocks import BlockText
from llmload.workload.build import BuildError, BuildOptions, build_workload
from llmload.workload.formats import Issue, LogRequest, common, detect_format, read_log
from llmload.workload.prefix import workload_prefix
from llmload.workload.tokens import get_tokenizer
from tests.wire_server import QuietHandler, serve

LOGS = Path(__file__).parent / "data" / "logs"
TINY = f"hf:{LOGS / 'tiny-tokenizer'}"
DRAWN = 7  # the output length given to requests whose log has none (--output-tokens 7)
FILL = {"output_tokens": {"kind": "fixed", "value": DRAWN}}
SYSTEM = "You are the support assistant of an online shop. Be short and polite."
count = get_tokenizer("cl100k_base").count


def build(tmp_path: Path, source: str | Path, **options: object) -> Workload:
    out = tmp_path / f"{Path(source).stem}.yaml"
    build_workload([LOGS / source], out, BuildOptions.model_validate(options), progress=None)
    return load_workload(out)


def contents(workload: Workload) -> list[list[list[str]]]:
    """Each session's turns as their messages' contents."""
    return [[[m.content for m in t.messages] for t in s.turns] for s in workload.sessions]


def run_cli(*argv: str) -> int:
    return main(["workload", *argv])


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("openai.jsonl", "openai-jsonl"),
        ("openai-bare.jsonl", "openai-jsonl"),
        ("sharegpt.json", "sharegpt"),
        ("sharegpt-bad.jsonl", "sharegpt"),
        ("vllm-0.32-debug.log", "vllm-log"),
        ("vllm-0.6-info.log", "vllm-log"),
        ("azure-conv-head.csv", "azure-trace"),
        ("mooncake.jsonl", "mooncake"),
        ("messages.jsonl", "messages-jsonl"),
        ("sharegpt-lines.jsonl", "sharegpt"),
        ("openai-batch-input.jsonl", "openai-batch"),
        ("openai-batch-output.jsonl", "openai-batch"),
        ("litellm.jsonl", "litellm"),
        ("langfuse-observations.json", "langfuse"),
        ("helicone.jsonl", "helicone"),
        ("otel-genai.jsonl", "otel-genai"),
        ("otel-sdk-spans.jsonl", "otel-genai"),
        ("otel-console-spans.txt", "otel-genai"),
        ("langfuse-api-page.json", "langfuse"),
        ("helicone-export.csv", "helicone"),
    ],
)
def test_format_is_detected_from_the_first_lines(name: str, fmt: str) -> None:
    assert detect_format(LOGS / name) == fmt


def test_a_first_line_of_10_mb_is_detected_and_built(tmp_path: Path) -> None:
    """One long prompt on the first line: detection reads the whole line, not a fixed-size head."""
    long_prompt = "lorem ipsum dolor " * 600_000  # ~10.8 MB of text
    log = tmp_path / "long.jsonl"
    with log.open("w") as out:
        out.write(json.dumps({"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 8}) + "\n")
        out.write(json.dumps({"messages": [{"role": "user", "content": "short"}], "max_tokens": 8}) + "\n")
    assert log.stat().st_size > 10 * 2**20
    assert detect_format(log) == "openai-jsonl"
    workload = build(tmp_path, log)
    assert [len(s.turns) for s in workload.sessions] == [1, 1]
    assert workload.sessions[0].turns[0].prompt_tokens == count(long_prompt)


def test_openai_log_groups_sessions_by_message_prefix(tmp_path: Path) -> None:
    workload = build(tmp_path, "openai.jsonl")
    assert contents(workload) == [
        [[SYSTEM, "Where is my order?"], ["Order 1234."], ["Thanks!"]],
        [[SYSTEM, "hi"]],
        # same first request as the session above, told apart by the logged reply
        [[SYSTEM, "hi"], ["Cancel my plan."]],
    ]
    first, second, third = workload.sessions
    assert [s.offset_s for s in workload.sessions] == [0.0, 2.0, 6.0]
    assert [t.think_time_s for t in first.turns] == [0.0, 5.5, 4.5]
    assert [t.think_time_s for t in third.turns] == [0.0, 3.0]
    # usage wins; without it, history + the previous reply + the new message, counted
    assert [t.prompt_tokens for t in first.turns] == [25, 40, 40 + count("It ships tomorrow.") + count("Thanks!")]
    assert [t.output_tokens for t in first.turns] == [5, 5, None]
    assert [t.max_tokens for t in first.turns] == [200, 200, 200]
    assert second.turns[0].output_tokens == 7
    assert third.turns[0].output_tokens == count("Hi, what can I do for you?")
    assert third.turns[1].prompt_tokens == (
        count(SYSTEM) + count("hi") + count("Hi, what can I do for you?") + count("Cancel my plan.")
    )
    spec = workload.spec
    assert spec.target_qps == pytest.approx(0.5)  # 6 requests in 10 s: 1 / mean inter-arrival
    assert spec.tokenizer == "cl100k_base"
    assert spec.source is not None and spec.source.format == "openai-jsonl"
    assert spec.source.files == [str(LOGS / "openai.jsonl")] and spec.source.built_at is not None
    assert spec.stats is not None and spec.stats["requests"] == 6 and spec.stats["sessions"] == 3
    # the log gives no response times: turns keep their recorded times, and stats say what think times hold
    assert [t.at_s for t in first.turns] == [None, 5.5, 10.0]
    assert "includes the previous reply's duration" in spec.stats["think_times"]


def test_response_times_are_taken_out_of_think_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A logged response end (latency_ms or response_timestamp) separates think time from the reply."""

    def line(at: float, messages: list[dict[str, str]], reply: str, **end: float) -> bytes:
        response = {"choices": [{"message": {"role": "assistant", "content": reply}}]}
        record = {"timestamp": at, "request": {"messages": messages}, "response": response, **end}
        return json.dumps(record).encode() + b"\n"

    first = [{"role": "user", "content": "Where is my order?"}]
    second = [*first, {"role": "assistant", "content": "It ships."}, {"role": "user", "content": "When?"}]
    third = [*second, {"role": "assistant", "content": "Monday."}, {"role": "user", "content": "Thanks"}]
    log = tmp_path / "timed.jsonl"
    log.write_bytes(
        line(1000.0, first, "It ships.", latency_ms=1500)
        + line(1010.0, second, "Monday.", response_timestamp=1012.5)
        + line(1020.0, third, "Bye.")
    )
    out = tmp_path / "timed.yaml"
    build_workload([log], out)
    (session,) = load_workload(out).sessions
    assert [t.think_time_s for t in session.turns] == [0.0, 8.5, 7.5]  # 10 - 1.5 and 10 - 2.5
    assert [t.at_s for t in session.turns] == [None, 10.0, 20.0]
    assert run_cli("stats", str(out)) == 0
    assert "Think times: measured from the end of the previous reply (2 follow-up turns" in capsys.readouterr().out


def test_bare_request_bodies_group_without_replies_or_times(tmp_path: Path) -> None:
    workload = build(tmp_path, "openai-bare.jsonl", **FILL)
    assert contents(workload) == [
        # two identical first requests: continuations go to the longest-waiting session first
        [["hi"], ["Weather?"], ["sunny, 21C"]],
        [["hi"], ["News?"]],
        [["Translate: bonjour"]],  # text parts joined
    ]
    first, second, _ = workload.sessions
    assert [m.role for m in first.turns[2].messages] == ["tool"]
    # the reply is known from the next request's assistant message; a null reply is empty, and with no
    # max_tokens either the length is drawn
    assert [t.output_tokens for t in first.turns] == [count("Hello"), None, DRAWN]
    assert [t.max_tokens for t in first.turns] == [16, 32, None]
    assert second.turns[0].output_tokens == count("Hey")
    assert [t.prompt_tokens for t in first.turns] == [1, 1 + 1 + count("Weather?"), 4 + 0 + count("sunny, 21C")]
    assert workload.sessions[2].turns[0].max_tokens == 8  # max_completion_tokens
    assert all(s.offset_s is None for s in workload.sessions) and workload.spec.target_qps is None


def test_sharegpt_conversations_become_sessions(tmp_path: Path) -> None:
    workload = build(tmp_path, "sharegpt.json", **FILL)
    assert contents(workload) == [
        [["Hi"], ["Tell me a joke."]],
        [["Be brief.", "2+2?"]],
        [["Welcome!", "Hi"], ["Anything else?", "No"]],  # a second reply joins the next request
        [["unanswered question"]],
    ]
    joke = workload.sessions[0].turns
    assert [t.output_tokens for t in joke] == [
        count("Hello! How can I help you today?"),
        count("Why did the cache miss? It was out of line."),
    ]
    assert joke[1].prompt_tokens == count("Hi") + count("Hello! How can I help you today?") + count("Tell me a joke.")
    assert workload.sessions[3].turns[0].output_tokens == DRAWN  # unanswered: drawn
    assert [session.id for session in workload.sessions] == ["a", "b", "c", "d"]  # the log's own ids, kept
    assert workload.spec.source is not None and workload.spec.source.generator is not None
    assert workload.spec.source.generator["output_tokens_drawn"] == 1


def test_a_repeated_sharegpt_id_is_kept_and_told_apart(tmp_path: Path) -> None:
    """ShareGPT ids are not always unique: the second `x` becomes `x#2`, and a conversation without one is
    named after the workload."""
    log = tmp_path / "ids.json"
    chat = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    log.write_text(json.dumps([{"id": "x", "conversations": chat}, {"id": "x", "conversations": chat},
                               {"conversations": chat}]))  # fmt: skip
    out = tmp_path / "ids.yaml"
    assert run_cli("build", str(log), "-o", str(out)) == 0
    assert [session.id for session in load_workload(out).sessions] == ["x", "x#2", "ids-000002"]


def test_a_log_without_replies_is_refused_unless_output_lengths_are_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Single-turn ShareGPT holding only the human turns: replayed as is, every request would run to
    max_model_len. Without --output-tokens nothing is written; with it, each length is drawn and said so."""
    log = tmp_path / "asked.json"
    log.write_text(
        json.dumps([{"id": f"q{i}", "conversations": [{"from": "human", "value": f"q {i}"}]} for i in range(4)])
    )
    out = tmp_path / "asked.yaml"
    assert run_cli("build", str(log), "-o", str(out)) == 2
    err = capsys.readouterr().err
    assert f"4 of 4 requests in {log} have no output length" in err and "give --output-tokens DISTRIBUTION" in err
    assert not out.exists() and not list(tmp_path.glob("*.jsonl"))
    assert run_cli("build", str(log), "-o", str(out), "--output-tokens", "uniform:low=10,high=20") == 0
    assert (
        "output lengths of 4 of 4 requests drawn from --output-tokens uniform:low=10,high=20" in capsys.readouterr().err
    )
    turns = [t for s in load_workload(out).sessions for t in s.turns]
    assert all(t.output_tokens is not None and 10 <= t.output_tokens <= 20 for t in turns)
    assert [session.id for session in load_workload(out).sessions] == ["q0", "q1", "q2", "q3"]
    assert run_cli("stats", str(log)) == 0
    printed = capsys.readouterr().out
    assert "Recommended max_model_len: none: no request says how long its reply may be" in printed
    assert "Output lengths: 4 of 4 requests have no reply, output_tokens or max_tokens" in printed


def test_sharegpt_array_is_streamed_across_read_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = [(r.where, r.messages, r.reply) for r in read_log(LOGS / "sharegpt.json")[1]]
    monkeypatch.setattr(common, "_CHUNK_CHARS", 7)
    assert [(r.where, r.messages, r.reply) for r in read_log(LOGS / "sharegpt.json")[1]] == whole
    assert [w for w, _, _ in whole] == [f"{LOGS / 'sharegpt.json'}:{n}" for n in (2, 2, 23, 40, 40, 69)]


def test_json_arrays_one_after_another_are_streamed_across_read_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ShareGPT array a line: every line's conversations, at their lines, however the reads cut them."""
    whole = [(r.where, r.messages, r.reply) for r in read_log(LOGS / "sharegpt-lines.jsonl")[1]]
    monkeypatch.setattr(common, "_CHUNK_CHARS", 5)
    assert [(r.where, r.messages, r.reply) for r in read_log(LOGS / "sharegpt-lines.jsonl")[1]] == whole
    assert [w for w, _, _ in whole] == [f"{LOGS / 'sharegpt-lines.jsonl'}:{n}" for n in (1, 1, 2)]


def test_a_json_array_cut_short_is_a_bad_line_not_an_end(tmp_path: Path) -> None:
    """An export cut off mid-array (a full disk, a killed exporter) is refused where it ends."""
    log = tmp_path / "cut.json"
    log.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}])[:-1] + "\n")
    assert [(i.where, i.reason) for i in read_log(log)[1] if isinstance(i, Issue)] == [
        (f"{log}:2", "not valid JSON: the file ends inside a JSON array")
    ]


def test_message_arrays_read_as_sharegpt_report_every_line(tmp_path: Path) -> None:
    """`--format sharegpt` on a JSONL of message arrays: each message is a bad conversation, on every line;
    no line after the first is dropped."""
    with pytest.raises(BuildError) as caught:
        build(tmp_path, "messages.jsonl", format="sharegpt")
    where = [i.where for i in caught.value.issues]
    assert where == [f"{LOGS / 'messages.jsonl'}:{n}" for n in (1, 1, 1, 2, 2, 2)]
    assert {i.kind for i in caught.value.issues} == {"bad conversation"}


def test_a_langfuse_trace_export_names_its_ignored_observations(tmp_path: Path) -> None:
    workload = build(tmp_path, "langfuse-observations.json")
    assert contents(workload) == [[["Be brief.", "Hi"]], [["2+2?"]]]
    assert [t.output_tokens for s in workload.sessions for t in s.turns] == [3, 1]  # the logged counts, not "Hello!"'s


def test_indented_spans_one_after_another_are_read_at_their_lines_across_read_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's ConsoleSpanExporter prints each span indented: every span, at its first line, however the reads cut."""
    log = LOGS / "otel-console-spans.txt"
    whole = [(r.where, r.messages, r.timestamp) for r in read_log(log)[1] if isinstance(r, LogRequest)]
    monkeypatch.setattr(common, "_CHUNK_CHARS", 9)
    assert [(r.where, r.messages, r.timestamp) for r in read_log(log)[1] if isinstance(r, LogRequest)] == whole
    assert [w for w, _, _ in whole] == [f"{log}:1", f"{log}:37"]


def test_a_saved_api_page_names_each_record_at_its_own_line(tmp_path: Path) -> None:
    """A Langfuse API page ({data, meta}, indented): a bad observation is named at the line it starts on."""
    page = json.loads((LOGS / "langfuse-api-page.json").read_text())
    page["data"][2]["usageDetails"] = {"input": -1}
    log = tmp_path / "page.json"
    log.write_text(json.dumps(page, indent=2) + "\n")
    parsed = list(read_log(log)[1])
    assert [(p.where, p.fatal) for p in parsed if isinstance(p, Issue)] == [(f"{log}:56", False), (f"{log}:74", True)]
    assert [p.where for p in parsed if isinstance(p, LogRequest)] == [f"{log}:3"]


def test_an_indented_json_value_cut_short_is_a_bad_line(tmp_path: Path) -> None:
    log = tmp_path / "cut.json"
    log.write_text((LOGS / "otel-console-spans.txt").read_text()[:-40])
    assert [(i.where, i.kind) for i in read_log(log)[1] if isinstance(i, Issue)] == [(f"{log}:37", "not valid JSON")]


def test_a_bad_indented_json_value_is_named_and_the_values_after_it_are_read(tmp_path: Path) -> None:
    """Nothing after a malformed span is dropped: the read goes on at the next object."""
    text = (LOGS / "otel-console-spans.txt").read_text()
    first, second = text[: text.index("\n{") + 1], text[text.index("\n{") + 1 :]
    log = tmp_path / "spans.txt"
    log.write_text(first.replace('"name": "openai.chat",', '"name": "openai.chat"', 1) + second)
    parsed = list(read_log(log, "otel-genai")[1])
    assert [(p.where, p.kind) for p in parsed if isinstance(p, Issue)] == [(f"{log}:1", "not valid JSON")]
    assert [p.where for p in parsed if isinstance(p, LogRequest)] == [f"{log}:37"]


def test_a_helicone_csv_row_of_more_cells_than_its_header_is_a_bad_line(tmp_path: Path) -> None:
    log = tmp_path / "output.csv"
    lines = (LOGS / "helicone-export.csv").read_text().splitlines()
    log.write_text("\n".join([lines[0], lines[1] + ',"extra"', lines[2]]) + "\n")
    parsed = list(read_log(log)[1])
    assert [(p.where, p.kind) for p in parsed if isinstance(p, Issue)] == [(f"{log}:2", "bad row")]
    assert [p.where for p in parsed if isinstance(p, LogRequest)] == [f"{log}:3"]


def test_content_parts_of_every_kind_a_log_holds_are_text_or_refused_by_name() -> None:
    """Text parts are joined; Anthropic tool_use/thinking blocks give no text, a tool_result its output; an
    image is refused, naming the message."""
    messages = [
        {"role": "user", "content": ["plain ", {"type": "text", "text": "text"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "tool_use", "id": "t"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text",
                                                                                             "text": "42"}]}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
    ]  # fmt: skip
    assert [m["content"] for m in common.chat_messages(messages)] == ["plain text", "", "42", "No."]
    with pytest.raises(common.BadLine, match=r"messages\[0\] has a 'image' part"):
        common.chat_messages([{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}])


def test_an_otel_line_of_spans_reports_a_bad_span_and_reads_the_others(tmp_path: Path) -> None:
    """One OTLP/JSON line holds many spans: a bad one is named, the line's others are still read."""
    record = json.loads((LOGS / "otel-genai.jsonl").read_text())
    spans = record["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["attributes"] = [a for a in spans[0]["attributes"] if a["key"] != "gen_ai.input.messages"]
    spans[0]["attributes"] = [a for a in spans[0]["attributes"] if a["key"] != "gen_ai.usage.input_tokens"]
    log = tmp_path / "spans.jsonl"
    log.write_text(json.dumps(record) + "\n")
    parsed = list(read_log(log)[1])
    assert [(p.where, p.reason) for p in parsed if isinstance(p, Issue) and p.fatal] == [
        (
            f"{log}:1",
            "no prompt: the span has neither prompt messages nor gen_ai.usage.input_tokens (span 0 of the line)",
        )
    ]
    assert [p.messages for p in parsed if isinstance(p, LogRequest)] == [[{"role": "user", "content": "And Rome?"}]]


def test_vllm_032_debug_log_in_its_real_format(tmp_path: Path) -> None:
    out = tmp_path / "v.yaml"
    result = build_workload([LOGS / "vllm-0.32-debug.log"], out, progress=None)
    workload = load_workload(out)
    # the logged JSON bodies give the real messages, so the two chat turns form one session
    assert contents(workload) == [
        [["You are a helpful assistant.", "Where is my order 1234?"], ["It has not arrived yet."]],
        [['Say "hi" it\'s me\nnew line']],
        [["Once upon a time"]],  # /v1/completions: the raw prompt
    ]
    chat = workload.sessions[0].turns
    assert [t.prompt_tokens for t in chat] == [40, 75]  # len(prompt_token_ids): the server's count
    assert [t.max_tokens for t in chat] == [8, 6]
    assert chat[1].output_tokens == 6  # ignore_eos=True: the output was max_tokens long
    assert chat[1].think_time_s == 1.0 and [s.offset_s for s in workload.sessions] == [0.0, 1.0, 1.0]
    assert result.log.ignored == {"not a generation request (no sampling params)": 2}  # the /tokenize calls


def test_a_cut_json_body_falls_back_to_the_templated_prompt_and_says_so(tmp_path: Path) -> None:
    cut = tmp_path / "cut.log"
    lines = (LOGS / "vllm-0.32-debug.log").read_text().splitlines(keepends=True)
    first_body = next(n for n, line in enumerate(lines) if "JSON body" in line)
    lines[first_body] = lines[first_body][:200] + "\n"  # as --max-log-len 200 would
    cut.write_text("".join(lines))
    result = build_workload([cut], tmp_path / "cut.yaml", progress=None)
    assert result.log.ignored["templated prompt used"] == 1
    first = load_workload(tmp_path / "cut.yaml").sessions[0].turns
    assert [m.content for m in first[0].messages] == [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Where is my order 1234?<|im_end|>\n<|im_start|>assistant\n"
    ]
    assert len(first) == 1 and first[0].prompt_tokens == 40


def test_hf_tokenizer_with_chat_template_counts_as_vllm_does() -> None:
    tokenizer = get_tokenizer(TINY)
    assert tokenizer.templated
    # vLLM 0.32 logged these prompts' token ids for the tiny model (vllm-0.32-debug.log)
    chat = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Where is my order 1234?"},
    ]
    assert tokenizer.count_chat(chat) == 40
    second = [
        *chat,
        {"role": "assistant", "content": "est\ufffd reSt mor"},
        {"role": "user", "content": "It has not arrived yet."},
    ]
    assert tokenizer.count_chat(second) == 75
    assert tokenizer.count("Where is my order 1234?") == 12  # /tokenize of the bare prompt, no special tokens


def test_templated_tokenizer_counts_the_whole_history(tmp_path: Path) -> None:
    workload = build(tmp_path, "openai-bare.jsonl", tokenizer=TINY, **FILL)
    assert workload.spec.tokenizer == TINY
    tokenizer = get_tokenizer(TINY)
    second = workload.sessions[0].turns[1]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
    assert second.prompt_tokens == tokenizer.count_chat([*history, {"role": "user", "content": "Weather?"}])


def test_info_level_vllm_log_names_the_missing_prompts(tmp_path: Path) -> None:
    info = tmp_path / "info.log"
    lines = (LOGS / "vllm-0.32-debug.log").read_text().splitlines(keepends=True)
    info.write_text("".join(line for line in lines if " DEBUG " not in line))  # as at the default log level
    with pytest.raises(BuildError) as caught:
        build_workload([info], tmp_path / "info.yaml", progress=None)
    generating = [
        n
        for n, line in enumerate(info.read_text().splitlines(), 1)
        if "Received request" in line and "params: None" not in line
    ]
    assert len(generating) == 4
    assert [i.where for i in caught.value.issues] == [f"{info}:{n}" for n in generating]
    assert all("VLLM_LOGGING_LEVEL=DEBUG" in i.reason for i in caught.value.issues)
    assert not list(tmp_path.glob("info*.jsonl")) and not (tmp_path / "info.yaml").exists()


def test_old_vllm_format_templated_prompt_is_one_user_message(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as caught:
        build(tmp_path, "vllm-0.6-info.log")
    assert [(i.where, i.kind) for i in caught.value.issues] == [
        (f"{LOGS / 'vllm-0.6-info.log'}:7", "unreadable vLLM request line")
    ]
    workload = build(tmp_path, "vllm-0.6-info.log", skip_bad=True)
    story, brief, no_ids = (s.turns[0] for s in workload.sessions)
    assert story.messages[0].role == "user"
    assert (
        story.messages[0].content == "<|im_start|>user\nTell me a story about a fox.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert brief.messages[0].content.endswith("It's \"quoted\" and it's fine<|im_end|>\n<|im_start|>assistant\n")
    assert (story.prompt_tokens, story.max_tokens, story.output_tokens) == (21, 256, None)
    assert (brief.prompt_tokens, brief.max_tokens, brief.output_tokens) == (41, 64, 64)
    assert no_ids.prompt_tokens == count("no ids here")  # prompt_token_ids: None → counted
    assert [s.offset_s for s in workload.sessions] == [0.0, 2.25, 4.0]  # ANSI colours and .250 ms parsed


def test_azure_trace_lengths_are_exact_and_forced(tmp_path: Path) -> None:
    workload = build(tmp_path, "azure-conv-head.csv")
    rows = [line.split(",") for line in (LOGS / "azure-conv-head.csv").read_text().splitlines()[1:]]
    assert [len(s.turns) for s in workload.sessions] == [1] * len(rows)
    for session, (_, context, generated) in zip(workload.sessions, rows, strict=True):
        (turn,) = session.turns
        assert (turn.prompt_tokens, turn.output_tokens) == (int(context), int(generated))
        assert count(turn.messages[0].content) == int(context)
    texts = [s.turns[0].messages[0].content for s in workload.sessions]
    assert len(set(texts)) == len(texts)
    assert workload.sessions[1].offset_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)


def test_length_only_prompt_leaves_room_for_the_chat_template(tmp_path: Path) -> None:
    workload = build(tmp_path, "azure-conv-head.csv", tokenizer=TINY)
    tokenizer = get_tokenizer(TINY)
    for session in workload.sessions:
        (turn,) = session.turns
        assert tokenizer.count_chat([m.model_dump() for m in turn.messages]) == turn.prompt_tokens


def test_mooncake_hash_ids_become_blocks_whose_text_shares_exactly_their_prefix(tmp_path: Path) -> None:
    """The trace's ids are kept as ids (the file stays the trace's size); sent, each id is the same
    512 tokens of text, so lines that share ids share exactly that prefix, and each chat prompt is as
    long as the trace says."""
    workload = build(tmp_path, "mooncake.jsonl")
    assert workload.spec.block_size == 512
    assert [s.turns[0].blocks for s in workload.sessions] == [[1, 2, 3], [1, 2, 4], [5], [1, 6]]
    assert [s.turns[0].output_tokens for s in workload.sessions] == [20, 10, 5, 7]
    assert [s.offset_s for s in workload.sessions] == [0.0, 0.5, 1.5, 2.0]
    text = BlockText.of(workload.spec)
    assert text is not None
    tokenizer = get_tokenizer("cl100k_base")
    sent = [text.messages(s.turns[0]) for s in workload.sessions]
    assert [tokenizer.count_chat([m.model_dump() for m in messages]) for messages in sent] == [
        s.turns[0].prompt_tokens for s in workload.sessions
    ]
    tokens = [tokenizer.encode(messages[0].content) for messages in sent]

    def shared(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    assert shared(tokens[0], tokens[1]) == 1024  # hash ids [1, 2] in common
    assert shared(tokens[0], tokens[3]) == 512  # [1]
    assert shared(tokens[0], tokens[2]) < 16  # nothing in common


def test_a_block_id_that_comes_back_after_many_others_gets_its_text_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's text is a function of its id, not of what a cache still holds: here the cache keeps
    2 texts, and id 1 returns after 4 others (the real conversation trace has 182,790 ids; a text cache
    of 16,384 once turned its 37.3% reusable into 27.0%)."""
    monkeypatch.setattr("llmload.workload.blocks._CACHED_BLOCKS", 2)
    text = BlockText(get_tokenizer("cl100k_base"), 512)
    turns = [Turn(blocks=ids, prompt_tokens=1024, output_tokens=5) for ids in ([1, 2], [3, 4], [5, 6], [1, 7])]
    first, *_, last = (text.messages(turn)[0].content for turn in turns)
    encode = get_tokenizer("cl100k_base").encode
    assert encode(first)[:512] == encode(last)[:512] and encode(first)[512:900] != encode(last)[512:900]
    fresh = BlockText(get_tokenizer("cl100k_base"), 512)  # another process, another order
    assert fresh.messages(turns[3])[0].content == last


def test_redact_keeps_structure_lengths_and_shared_text(tmp_path: Path) -> None:
    plain = build(tmp_path, "openai.jsonl")
    redacted_path = tmp_path / "redacted.yaml"
    build_workload([LOGS / "openai.jsonl"], redacted_path, BuildOptions(redact=True), progress=None)
    redacted = load_workload(redacted_path)
    sessions_file = (tmp_path / "redacted.sessions.jsonl").read_text()
    for session in plain.sessions:
        for turn in session.turns:
            for message in turn.messages:
                assert json.dumps(message.content) not in sessions_file
    for original, hidden in zip(plain.sessions, redacted.sessions, strict=True):
        for a, b in zip(original.turns, hidden.turns, strict=True):
            assert [m.role for m in a.messages] == [m.role for m in b.messages]
            assert [count(m.content) for m in a.messages] == [count(m.content) for m in b.messages]
            for field in ("prompt_tokens", "output_tokens", "max_tokens", "think_time_s"):
                assert getattr(a, field) == getattr(b, field)
    systems = {s.turns[0].messages[0].content for s in redacted.sessions}
    assert len(systems) == 1  # the same system prompt stays the same text: prefix caching as in the source
    assert redacted.spec.source is not None and redacted.spec.source.generator == {
        "redacted": True,
        "skipped_lines": {},
        "session_gap_s": 600.0,
    }


def test_a_long_pause_ends_the_session_and_history_moves_to_the_next(tmp_path: Path) -> None:
    workload = build(tmp_path, "openai.jsonl", session_gap_s=4.0)
    assert contents(workload) == [
        [[SYSTEM, "Where is my order?"]],
        [[SYSTEM, "hi"]],
        [[SYSTEM, "Where is my order?", "Which order number?", "Order 1234."]],
        [[SYSTEM, "hi"], ["Cancel my plan."]],
        [[SYSTEM, "Where is my order?", "Which order number?", "Order 1234.", "It ships tomorrow.", "Thanks!"]],
    ]
    assert workload.sessions[2].turns[0].prompt_tokens == 40


def test_bad_lines_are_reported_with_file_and_line_and_nothing_is_written(tmp_path: Path) -> None:
    source = LOGS / "openai-bad.jsonl"
    with pytest.raises(BuildError) as caught:
        build(tmp_path, "openai-bad.jsonl")
    assert [(i.where, i.kind) for i in caught.value.issues] == [
        (f"{source}:2", "not valid JSON"),
        (f"{source}:3", "no messages"),
        (f"{source}:4", "unsupported role"),
        (f"{source}:7", "unsupported content"),
        (f"{source}:8", "out of range"),
    ]
    assert list(tmp_path.iterdir()) == []
    workload = build(tmp_path, "openai-bad.jsonl", skip_bad=True, **FILL)
    assert contents(workload) == [[["fine"]], [["also fine"]]]
    assert workload.spec.source is not None and workload.spec.source.generator is not None
    assert workload.spec.source.generator["skipped_lines"] == {
        "not valid JSON": 1,
        "no messages": 1,
        "unsupported role": 1,
        "unsupported content": 1,
        "out of range": 1,
    }


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("sharegpt-bad.jsonl", [(2, "unsupported speaker"), (3, "no user message"), (4, "bad conversation")]),
        ("mooncake-bad.jsonl", [(2, "bad hash_ids"), (3, "bad timestamp")]),
        ("azure-bad.csv", [(3, "bad value"), (4, "short row"), (5, "bad value"), (6, "bad value")]),
    ],
)
def test_every_format_reports_bad_lines(tmp_path: Path, name: str, expected: list[tuple[int, str]]) -> None:
    with pytest.raises(BuildError) as caught:
        build(tmp_path, name)
    assert [(i.where, i.kind) for i in caught.value.issues] == [(f"{LOGS / name}:{n}", k) for n, k in expected]


def test_cli_exit_codes_and_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "w.yaml"
    assert run_cli("build", str(LOGS / "openai-bad.jsonl"), "-o", str(out)) == 2
    err = capsys.readouterr().err
    assert f"{LOGS / 'openai-bad.jsonl'}:4: unsupported role: messages[0] has role 'bot'" in err
    assert "5 bad line(s) in the sources; nothing written" in err and not out.exists()
    skip = ("--skip-bad", "--output-tokens", "fixed:7")
    assert run_cli("build", str(LOGS / "openai-bad.jsonl"), "-o", str(out), *skip) == 0
    captured = capsys.readouterr()
    assert "skipped bad 5 line(s): " in captured.err and "not valid JSON: 1" in captured.err
    assert f"wrote {out} (2 sessions, 2 requests" in captured.out and "Recommended max_model_len" in captured.out
    assert run_cli("build", str(tmp_path / "missing.jsonl"), "-o", str(out)) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_cli("build", str(tmp_path / "empty"), "-o", str(out)) == 2
    assert f"{tmp_path / 'empty'}: a directory with no *.json file to read" in capsys.readouterr().err
    assert run_cli("build", str(LOGS / "openai.jsonl"), "-o", str(out), "--tokenizer", "hf:/nowhere") == 2
    assert "/nowhere not found (give a tokenizer.json or a directory holding one)" in capsys.readouterr().err
    mixed = [str(LOGS / "openai.jsonl"), str(LOGS / "mooncake.jsonl")]
    assert run_cli("build", *mixed, "-o", str(out)) == 2
    assert "different formats" in capsys.readouterr().err


def test_unknown_text_is_not_a_format(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("dear diary\n")
    with pytest.raises(InputError, match="cannot tell the log format; use --format"):
        detect_format(notes)


# --------------------------------------------------------------------------- server: tokenizer


class _TokenizeHandler(QuietHandler):
    """vLLM's /v1/models and /tokenize shapes (as captured from vLLM 0.32), backed by the tiny tokenizer."""

    def do_GET(self) -> None:
        self._reply({"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/tokenize" and body["model"] == "tiny-llama"
        tokenizer = get_tokenizer(TINY)
        n = tokenizer.count_chat(body["messages"]) if "messages" in body else tokenizer.count(body["prompt"])
        self._reply({"count": n, "max_model_len": 2048, "tokens": list(range(n)), "token_strs": None})

    def _reply(self, payload: object) -> None:
        self.answer(200, json.dumps(payload).encode(), "application/json")


@pytest.fixture
def tokenize_server() -> Iterator[str]:
    with serve(_TokenizeHandler) as url:
        yield url


def test_server_tokenizer_counts_chats_with_the_server(tmp_path: Path, tokenize_server: str) -> None:
    workload = build(tmp_path, "vllm-0.6-info.log", tokenizer=f"server:{tokenize_server}", skip_bad=True)
    assert workload.spec.tokenizer == f"server:{tokenize_server}"
    no_ids = workload.sessions[2].turns[0]
    assert no_ids.prompt_tokens == get_tokenizer(TINY).count_chat([{"role": "user", "content": "no ids here"}])


@pytest.mark.vllm
def test_server_tokenizer_matches_vllm(vllm_server: object) -> None:
    url = vllm_server.url  # type: ignore[attr-defined]
    server, local = get_tokenizer(f"server:{url}"), get_tokenizer(TINY)
    chats = [
        [{"role": "user", "content": "Where is my order 1234?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": 'It\'s "quoted"\nand long ' * 20}],
    ]
    assert [server.count_chat(c) for c in chats] == [local.count_chat(c) for c in chats]
    assert server.count("the model server queue") == local.count("the model server queue")


def _weka_trace(name: str, requests: list[dict[str, object]], scope: str = "local") -> dict[str, object]:
    return {"id": name, "models": ["m"], "block_size": 64, "hash_id_scope": scope, "requests": requests}


def _weka_request(t: float, ids: list[int], tokens: int, think: float = 0.0, model: str = "opus") -> dict[str, object]:
    return {"t": t, "type": "n", "in": tokens, "out": 20, "hash_ids": ids, "api_time": 2.0, "think_time": think,
            "model": model}  # fmt: skip


def test_weka_traces_build_main_agents_and_subagents_as_block_sessions(tmp_path: Path) -> None:
    """Two traces of a directory, both counting their local ids from 1: each main agent is a session
    and its subagent one of its own from the entry's time, spawned by the parent's request before it and
    joined by its next (one after the parent's last request, in the background, is joined by none); ids
    are the trace's own (a's 1 is not b's); think times are the gaps less the recorded API time; each request keeps its
    model's rank in its trace (the main agent's first, then by first use); the figure is a plain recount
    of leading ids an earlier request (by time) already sent under the same trace."""
    sub = {"t": 9.0, "type": "subagent", "agent_id": "agent_001", "requests": [
        _weka_request(0.0, [1, 2, 7], 200, model="haiku"),
        _weka_request(4.0, [1, 2, 7, 8], 260, think=2.0, model="sonnet")]}  # fmt: skip
    late = {"t": 31.0, "type": "subagent", "agent_id": "agent_002", "requests": [_weka_request(0.0, [1, 11], 128)]}
    traces = tmp_path / "traces"
    traces.mkdir()
    a = [_weka_request(0.0, [1, 2], 150), _weka_request(5.0, [1, 2, 3], 200, think=3.0), sub,
         _weka_request(30.0, [1, 2, 3, 4, 5], 330, think=1.0), late]  # fmt: skip
    b = [
        _weka_request(0.0, [1, 2, 3], 192, model="haiku"),
        {**_weka_request(3.0, [1, 9, 10], 200, think=1.0), "out": 0},
    ]
    (traces / "a.json").write_bytes(orjson.dumps(_weka_trace("a", a)))
    (traces / "b.json").write_bytes(orjson.dumps(_weka_trace("b", b)))
    workload = build(tmp_path, traces)
    assert workload.spec.block_size == 64 and workload.spec.source is not None
    assert workload.spec.source.format == "weka"
    by_id = {s.id: s for s in workload.sessions}
    assert sorted(by_id) == ["a", "a/agent_001", "a/agent_002", "b"]
    assert by_id["a/agent_001"].offset_s == 9.0 and by_id["b"].offset_s == 0.0
    assert [s.parent for s in by_id.values()] == [None, "a", "a", None]
    assert [t.waits_for for t in by_id["a"].turns] == [[], [], ["a/agent_001"]]  # agent_002: in the background
    assert [t.model_rank for s in by_id.values() for t in s.turns] == [0, 0, 0, 1, 2, 0, 0, 1]
    assert [t.think_time_s for t in by_id["a"].turns] == [0.0, 3.0, 23.0]
    # a subagent's first think time is from the reply that spawned it (a's at 5 s, back at 7 s)
    assert [t.think_time_s for t in by_id["a/agent_001"].turns] == [2.0, 2.0]
    assert [t.spawns for t in by_id["a"].turns] == [[], ["a/agent_001"], ["a/agent_002"]]
    assert [t.output_tokens for t in by_id["b"].turns] == [20, 1]  # cut off with no answer: its prefill
    first_a, first_b = by_id["a"].turns[0].blocks, by_id["b"].turns[0].blocks
    assert first_a is not None and first_b is not None and first_a[0] != first_b[0]
    assert [len(t.blocks or []) for s in workload.sessions for t in s.turns] == [2, 3, 5, 3, 4, 2, 3, 3]
    # the file gives a run of consecutive ids as [first, count]: a's last turn, ids 1-5, is one item
    lines = (tmp_path / workload.spec.sessions).read_bytes().splitlines()
    written = {line["id"]: line for line in map(orjson.loads, lines)}
    assert written["a"]["turns"][2]["blocks"] == [[by_id["a"].turns[2].blocks[0], 5]]
    # the recount: requests by time, a block reusable when an earlier one held the same leading ids
    sent = [("a", 0.0, [1, 2], 150), ("b", 0.0, [1, 2, 3], 192), ("b", 3.0, [1, 9, 10], 200),
            ("a", 5.0, [1, 2, 3], 200), ("a", 9.0, [1, 2, 7], 200), ("a", 13.0, [1, 2, 7, 8], 260),
            ("a", 30.0, [1, 2, 3, 4, 5], 330), ("a", 31.0, [1, 11], 128)]  # fmt: skip
    seen: set[tuple[object, ...]] = set()
    reusable = 0
    for trace, _, ids, tokens in sent:
        prefixes = [(trace, *ids[: k + 1]) for k in range(min(len(ids), tokens // 64))]
        reusable += 64 * next((k for k, p in enumerate(prefixes) if p not in seen), len(prefixes))
        seen.update(prefixes)
    reuse = workload_prefix(workload)
    assert reuse.block_size == 64 and reuse.prompt_tokens == sum(t for *_, t in sent)
    assert reuse.reusable_tokens == reusable == 64 * (0 + 0 + 1 + 2 + 2 + 3 + 3 + 1)


def test_a_gap_that_splits_an_agent_links_each_subagent_to_the_part_that_spawns_it(tmp_path: Path) -> None:
    """--session-gap 100: the agent's request at 500 s starts a part of its own (`a#2`), and so does its
    request at 900 s (`a#3`), after a subagent whose own 300 s gap split it too. The subagent spawned after the
    first gap is `a#2`'s (its parent, so a distributed run plays it on `a#2`'s worker), and the request that
    joins it waits for its last part."""
    sub = {"t": 9.0, "type": "subagent", "agent_id": "agent_001", "requests": [
        _weka_request(0.0, [1, 7], 150), _weka_request(4.0, [1, 7, 8], 200)]}  # fmt: skip
    late = {"t": 505.0, "type": "subagent", "agent_id": "agent_002", "requests": [
        _weka_request(0.0, [1, 9], 150), _weka_request(300.0, [1, 9, 10], 200)]}  # fmt: skip
    a = [_weka_request(0.0, [1], 100), _weka_request(5.0, [1, 2], 150), sub, _weka_request(30.0, [1, 2, 3], 200),
         _weka_request(500.0, [1, 2, 3, 4], 260), late, _weka_request(900.0, [1, 2, 3, 4, 5], 330)]  # fmt: skip
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "a.json").write_bytes(orjson.dumps(_weka_trace("a", a)))
    sessions = build(tmp_path, traces, session_gap_s=100.0).sessions
    assert [s.id for s in sessions] == ["a", "a/agent_001", "a#2", "a/agent_002", "a/agent_002#2", "a#3"]
    assert [s.parent for s in sessions] == [None, "a", None, "a#2", "a#2", None]
    assert [[t.spawns for t in s.turns] for s in sessions if s.parent is None] == [
        [[], ["a/agent_001"], []],
        [["a/agent_002"]],
        [[]],
    ]
    assert [[t.waits_for for t in s.turns] for s in sessions if s.parent is None] == [
        [[], [], ["a/agent_001"]],
        [[]],
        [["a/agent_002#2"]],
    ]
    assert conversations(sessions, SessionLinks.of(sessions).by_id).tolist() == [0, 0, 1, 1, 1, 2]


@pytest.mark.parametrize(
    ("trace", "reason"),
    [
        ({"id": "x", "block_size": 32, "requests": []}, "block_size 32: llmload reads traces of 64-token blocks"),
        (
            _weka_trace("x", [_weka_request(0.0, [1], 200)]),
            "bad.json.requests[0].hash_ids: 1 blocks for in 200 (64 tokens per block)",
        ),
        (_weka_trace("x", [_weka_request(0.0, [1], 64)], scope="team"), "bad hash_id_scope 'team'"),
    ],
)
def test_a_bad_weka_trace_is_refused_naming_the_file_and_request(
    tmp_path: Path, trace: dict[str, object], reason: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(orjson.dumps(trace))
    with pytest.raises(BuildError) as caught:
        build_workload([path], tmp_path / "out.yaml", BuildOptions(format="weka"), progress=None)
    assert reason in str(caught.value) and str(path) in str(caught.value)
