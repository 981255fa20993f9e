"""Request logs: `llmload workload build LOG -o OUT` detects each log's format (or refuses it naming the
file and line), reads every line as what it is, and keeps what the log tells: the text, the token
counts, the limits and the times.

Each `given` is a small log in the shape the program named in `source` writes (the JSON is compact
where the writer writes it so, indented where it indents). `expect`: `exit` (default 0); `refusal`, a
fragment of stderr, `{log}` standing for the log's path (nothing is written then); `file`, the log's
name (default log.jsonl); `args`, more flags; `format`, the format the workload says it came from;
`turns`, each session's number of turns; `first`, the contents of the first turn's messages;
`prompt_tokens`, `output_tokens`, `max_tokens`, each session's turns' values; `offsets`, each
session's arrival offset (None everywhere: the log has no times, and stats say so); `think`, each
session's think times; `ignored`, a fragment of stderr's count of lines ignored.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from llmload.cli import main
from llmload.workload import load_workload
from tests.conformance import Case

KIND = "request-log"

_NO_TIMES = "Arrivals: the source has no timestamps."


def _lines(*records: Any) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _chat(*texts: str) -> list[dict[str, str]]:
    """Alternating user and assistant messages, the user first."""
    return [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(texts)]


def _sharegpt(label: str, *texts: str) -> dict[str, Any]:
    return {"id": label, "conversations": [{"from": ("human", "gpt")[i % 2], "value": t} for i, t in enumerate(texts)]}


def _completion(reply: str, prompt: int, output: int, created: int = 1732874400) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": created,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output},
    }


def _litellm(start: float, messages: list[dict[str, str]], reply: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{start}",
        "trace_id": "trace-1",
        "call_type": "acompletion",
        "stream": False,
        "response_cost": 2.5e-05,
        "status": "success",
        "custom_llm_provider": "openai",
        "total_tokens": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "startTime": start,
        "endTime": start + 1.5,
        "completionStartTime": start + 1.5,
        "response_time": 1.5,
        "model": "gpt-4o",
        "model_id": None,
        "model_group": "gpt-4o",
        "api_base": "https://api.openai.com/v1",
        "metadata": {"user_api_key_hash": None, "spend_logs_metadata": None, "requester_ip_address": None},
        "cache_hit": None,
        "cache_key": None,
        "saved_cache_cost": 0.0,
        "request_tags": [],
        "end_user": None,
        "messages": messages,
        "response": {"choices": [{"message": {"role": "assistant", "content": reply}}], "object": "chat.completion"},
        "model_parameters": {"max_tokens": 64, "temperature": 0.2},
        "hidden_params": {"model_id": None, "cache_key": None, "api_base": None, "response_cost": None},
        "error_str": None,
        **fields,
    }


def _observation(kind: str, start: str, end: str, **fields: Any) -> dict[str, Any]:
    """A Langfuse UI export's observation row (camelCase)."""
    return {
        "id": f"obs-{start}",
        "traceId": "trace-1",
        "projectId": "proj-1",
        "type": kind,
        "name": "chat" if kind == "GENERATION" else "retrieve",
        "startTime": start,
        "endTime": end,
        "completionStartTime": None,
        "level": "DEFAULT",
        "statusMessage": None,
        "parentObservationId": None,
        "version": None,
        "metadata": {},
        "promptTokens": 0,
        "completionTokens": 0,
        "totalTokens": 0,
        **fields,
    }


def _helicone(created: str, answered: str, body: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    return {
        "response_id": f"resp-{created}",
        "response_created_at": answered,
        "response_status": 200,
        "response_model": "gpt-4o-2024-08-06",
        "request_id": f"req-{created}",
        "request_created_at": created,
        "request_path": "https://api.openai.com/v1/chat/completions",
        "request_user_id": None,
        "request_properties": {},
        "provider": "OPENAI",
        "model": "gpt-4o",
        "delay_ms": 840,
        "time_to_first_token": None,
        "cost": 0.0001,
        **({"request_body": body} if body is not None else {}),
        **fields,
    }


def _attribute(key: str, value: Any) -> dict[str, Any]:
    """An OTLP/JSON attribute (64-bit integers as strings)."""
    encoded = {"intValue": str(value)} if isinstance(value, int) else {"stringValue": value}
    return {"key": key, "value": encoded}


def _otlp_span(name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": f"{start_ns % 10**16:016x}",
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": [_attribute(k, v) for k, v in attributes.items()],
        "status": {},
    }


def _parts(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


_T0_NS = 1_732_874_400_000_000_000
_CHAT_SPAN = {
    "gen_ai.operation.name": "chat",
    "gen_ai.system": "openai",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.request.max_tokens": 200,
    "gen_ai.usage.input_tokens": 31,
    "gen_ai.usage.output_tokens": 12,
    "gen_ai.input.messages": json.dumps([_parts("user", "Weather in Paris?")]),
    "gen_ai.output.messages": json.dumps([{**_parts("assistant", "Sunny, 21 °C."), "finish_reason": "stop"}]),
}

_BATCH_INPUT = [
    {
        "custom_id": f"request-{n}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": question}],
            "max_tokens": 100 * n,
        },
    }
    for n, question in ((1, "Hello world!"), (2, "Name three rivers."))
]

CASES: list[Case] = [
    Case(
        "jsonl-of-message-arrays-every-line-read",
        "issue 55: eval tools' JSONL of message arrays (one conversation a line, OpenAI chat messages)",
        _lines(
            _chat("Hello", "Hi! How can I help you?", "Write me a poem"),
            _chat("What is the capital of France?", "Paris.", "Tell me more about it."),
        ),
        {
            "args": ("--output-tokens", "fixed:7"),
            "format": "messages-jsonl",
            "turns": [2, 2],
            "first": ["Hello"],
            "offsets": [None, None],
        },
    ),
    Case(
        "jsonl-of-message-arrays-object-line-refused-at-its-line",
        "issue 55: a line of another shape in a JSONL of message arrays is a bad line, named",
        _lines(_chat("Hello", "Hi!"), {"role": "user", "content": "stray"}),
        {"exit": 2, "refusal": "{log}:2: not a JSON array: a dict"},
    ),
    Case(
        "jsonl-of-sharegpt-arrays-every-line-read",
        "issue 55: ShareGPT conversations written one array of one conversation a line (FastChat ShareGPT shape)",
        _lines([_sharegpt("a", "Hi", "Hello!", "Bye", "Bye!")], [_sharegpt("b", "2+2?", "4")]),
        {"format": "sharegpt", "turns": [2, 1], "ids": ["a", "b"], "first": ["Hi"]},
    ),
    Case(
        "sharegpt-array-then-an-object-refused-at-line-2",
        "issue 55: nothing after a JSON array is dropped: it is refused where it starts",
        json.dumps([_sharegpt("a", "Hi", "Hello!")]) + "\n" + json.dumps(_sharegpt("b", "2+2?", "4")) + "\n",
        {"exit": 2, "refusal": "{log}:2: data after the end of the JSON array"},
    ),
    Case(
        "messages-object-lines-are-openai-jsonl",
        'OpenAI chat fine-tuning/eval JSONL ({"messages": [...]}): a request body a line',
        _lines({"messages": _chat("Hi")}, {"messages": _chat("Hi", "Hello!", "Bye")}),
        {"args": ("--output-tokens", "fixed:7"), "format": "openai-jsonl", "turns": [2], "offsets": [None]},
    ),
    Case(
        "openai-batch-input-prompts-and-limits-no-times",
        "platform.openai.com/docs/api-reference/batch/request-input (custom_id, method, url, body)",
        _lines(
            *_BATCH_INPUT,
            {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "x"}},
        ),
        {
            "format": "openai-batch",
            "turns": [1, 1],
            "max_tokens": [[100], [200]],
            "first": ["You are helpful.", "Hello world!"],
            "offsets": [None, None],
            "ignored": "ignored 1 line(s): not a chat request: 1",
        },
    ),
    Case(
        "openai-batch-output-usage-and-created-times",
        "platform.openai.com/docs/api-reference/batch/request-output (response.status_code, response.body)",
        _lines(
            *(
                {
                    "id": f"batch_req_{n}",
                    "custom_id": f"request-{n}",
                    "response": {"status_code": 200, "request_id": f"req_{n}", "body": _completion(r, p, o, c)},
                    "error": None,
                }
                for n, (r, p, o, c) in enumerate([("Hi!", 22, 3, 1732874400), ("Nile.", 25, 9, 1732874405)])
            ),
            {
                "id": "batch_req_9",
                "custom_id": "request-9",
                "response": None,
                "error": {"code": "batch_expired", "message": "This request could not be executed before the end."},
            },
        ),
        {
            "format": "openai-batch",
            "prompt_tokens": [[22], [25]],
            "output_tokens": [[3], [9]],
            "offsets": [0.0, 5.0],
            "ignored": "failed request: 1",
        },
    ),
    Case(
        "litellm-payloads-times-counts-and-a-follow-up",
        "BerriAI/litellm litellm/types/utils.py StandardLoggingPayload; docs/my-website/docs/proxy/logging_spec.md",
        _lines(
            _litellm(1732874400.0, _chat("Hi"), "Hello! How can I help?", prompt_tokens=9, completion_tokens=6),
            _litellm(
                1732874410.0,
                _chat("Hi", "Hello! How can I help?", "Tell me a joke."),
                "Why did the cache miss?",
                prompt_tokens=27,
                completion_tokens=7,
            ),
        ),
        {
            "format": "litellm",
            "turns": [2],
            "prompt_tokens": [[9, 27]],
            "output_tokens": [[6, 7]],
            "max_tokens": [[64, 64]],
            "offsets": [0.0],
            "think": [[0.0, 8.5]],  # the second starts 10 s after the first, whose reply took 1.5 s
        },
    ),
    Case(
        "litellm-failures-and-embeddings-ignored-and-counted",
        "litellm/types/utils.py: status 'failure'; call_type of CallTypes (aembedding)",
        _lines(
            _litellm(1732874400.0, _chat("Hi"), "Hello!", completion_tokens=2),
            _litellm(1732874401.0, _chat("Hi"), "", status="failure", error_str="RateLimitError"),
            _litellm(1732874402.0, _chat("x"), "", call_type="aembedding"),
        ),
        {"format": "litellm", "turns": [1], "ignored": "ignored 2 line(s): "},
    ),
    Case(
        "langfuse-ui-json-export-generations-kept-spans-ignored",
        "langfuse/langfuse packages/shared/src/server/utils/transforms/transformStreamToJson.ts; the generations "
        "table export's columns (startTime, usageDetails, modelParameters, input, output)",
        json.dumps(
            [
                _observation("SPAN", "2026-11-20T10:00:00.000Z", "2026-11-20T10:00:00.100Z"),
                _observation(
                    "GENERATION",
                    "2026-11-20T10:00:00.200Z",
                    "2026-11-20T10:00:01.400Z",
                    model="gpt-4o",
                    modelParameters={"max_tokens": 256, "temperature": 0},
                    input=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                    output={"role": "assistant", "content": "Hello!"},
                    usageDetails={"input": 14, "output": 3, "total": 17},
                ),
                _observation(
                    "GENERATION",
                    "2026-11-20T10:00:05.200Z",
                    "2026-11-20T10:00:06.000Z",
                    model="gpt-4o",
                    modelParameters={"max_tokens": "128"},
                    input={"messages": _chat("2+2?")},
                    output="4",
                    usage={"input": 8, "output": 1, "total": 9, "unit": "TOKENS"},
                ),
            ]
        ),
        {
            "file": "observations.json",
            "format": "langfuse",
            "turns": [1, 1],
            "prompt_tokens": [[14], [8]],
            "output_tokens": [[3], [1]],
            "max_tokens": [[256], [128]],
            "offsets": [0.0, 5.0],
            "ignored": "not a generation: 1",
        },
    ),
    Case(
        "langfuse-blob-export-snake-case-json-strings",
        "langfuse/langfuse packages/shared/src/server/repositories/observations.ts "
        "(getObservationsForBlobStorageExport: start_time, usage_details, model_parameters, input as JSON text)",
        _lines(
            {
                "id": "obs-1",
                "trace_id": "trace-1",
                "project_id": "proj-1",
                "environment": "default",
                "type": "GENERATION",
                "parent_observation_id": None,
                "start_time": "2026-11-20 10:00:00.000",
                "end_time": "2026-11-20 10:00:02.000",
                "name": "ChatOpenAI",
                "input": json.dumps(_chat("Translate: bonjour")),
                "output": json.dumps({"role": "assistant", "content": "hello"}),
                "provided_model_name": "gpt-4o-mini",
                "model_parameters": json.dumps({"max_tokens": "32"}),
                "usage_details": {"input": "11", "output": "2", "total": "13"},
                "cost_details": {},
                "completion_start_time": None,
            }
        ),
        {"format": "langfuse", "prompt_tokens": [[11]], "output_tokens": [[2]], "max_tokens": [[32]], "offsets": [0.0]},
    ),
    Case(
        "helicone-jsonl-bodies-counts-and-response-times",
        "Helicone/helicone examples/export/typescript/index.ts (JSONL rows of /v1/request/query-clickhouse: "
        "HeliconeRequest request_created_at, request_body, response_body, prompt_tokens, delay_ms)",
        _lines(
            _helicone(
                "2026-11-20T10:00:00.000Z",
                "2026-11-20T10:00:00.840Z",
                {"model": "gpt-4o", "messages": _chat("Hi"), "max_tokens": 50},
                response_body=_completion("Hello!", 8, 2),
                prompt_tokens=8,
                completion_tokens=2,
            ),
            _helicone(
                "2026-11-20T10:00:05.840Z",
                "2026-11-20T10:00:06.500Z",
                {"model": "gpt-4o", "messages": _chat("Hi", "Hello!", "Bye"), "max_tokens": 50},
                response_body=_completion("Bye!", 19, 2),
                prompt_tokens=19,
                completion_tokens=2,
            ),
        ),
        {
            "format": "helicone",
            "turns": [2],
            "prompt_tokens": [[8, 19]],
            "max_tokens": [[50, 50]],
            "offsets": [0.0],
            "think": [[0.0, 5.0]],  # from the first reply's end (response_created_at), not its start
        },
    ),
    Case(
        "helicone-json-export-newest-first-refused-at-the-row",
        "Helicone/helicone examples/export/typescript/index.ts (sort created_at desc; JSON written as '[\\n', "
        "rows of JSON.stringify(row, null, 2) each followed by ',\\n', then ']')",
        "[\n"
        + "".join(
            json.dumps(_helicone(t, t, None, prompt_tokens=40, completion_tokens=5), indent=2) + ",\n"
            for t in ("2026-11-20 10:00:09.000", "2026-11-20 10:00:01.000")
        )
        + "]\n",
        {"file": "output.json", "exit": 2, "refusal": "{log}:20: out of order: request_created_at is before"},
    ),
    Case(
        "helicone-rows-without-bodies-are-length-only",
        "Helicone/helicone examples/export/typescript/index.ts (without --include-body: no request_body)",
        _lines(
            _helicone(
                "2026-11-20 10:00:01.000", "2026-11-20 10:00:02.000", None, prompt_tokens=40, completion_tokens=5
            ),
            _helicone(
                "2026-11-20 10:00:04.000", "2026-11-20 10:00:05.000", None, prompt_tokens=90, completion_tokens=7
            ),
            _helicone("2026-11-20 10:00:06.000", "2026-11-20 10:00:06.000", None, response_status=429),
        ),
        {
            "format": "helicone",
            "prompt_tokens": [[40], [90]],
            "output_tokens": [[5], [7]],
            "offsets": [0.0, 3.0],
            "ignored": "failed request: 1",
        },
    ),
    Case(
        "otlp-json-resource-spans-chat-kept-tool-ignored",
        "open-telemetry/semantic-conventions docs/gen-ai/gen-ai-spans.md (gen_ai.operation.name, "
        "gen_ai.input.messages parts); OTLP/JSON as the collector's file exporter writes it, a request a line",
        _lines(
            {
                "resourceSpans": [
                    {
                        "resource": {"attributes": [_attribute("service.name", "agent")]},
                        "scopeSpans": [
                            {
                                "scope": {"name": "opentelemetry.instrumentation.openai_v2"},
                                "spans": [
                                    _otlp_span("chat gpt-4o", _T0_NS, _T0_NS + 900_000_000, _CHAT_SPAN),
                                    _otlp_span(
                                        "execute_tool get_weather",
                                        _T0_NS + 950_000_000,
                                        _T0_NS + 990_000_000,
                                        {"gen_ai.operation.name": "execute_tool"},
                                    ),
                                    _otlp_span(
                                        "chat gpt-4o",
                                        _T0_NS + 4_000_000_000,
                                        _T0_NS + 4_500_000_000,
                                        {
                                            **_CHAT_SPAN,
                                            "gen_ai.input.messages": json.dumps([_parts("user", "And Rome?")]),
                                        },
                                    ),
                                ],
                            }
                        ],
                    }
                ]
            }
        ),
        {
            "format": "otel-genai",
            "turns": [1, 1],
            "first": ["Weather in Paris?"],
            "prompt_tokens": [[31], [31]],
            "output_tokens": [[12], [12]],
            "max_tokens": [[200], [200]],
            "offsets": [0.0, 4.0],
            "ignored": "not a GenAI chat span: 1",
        },
    ),
    Case(
        "otel-sdk-span-per-line-openllmetry-flattened-prompt",
        "opentelemetry-python sdk/trace Span.to_json (flat attributes, ISO start_time); traceloop/openllmetry "
        "gen_ai.prompt.N.role/.content, llm.request.type, gen_ai.usage.prompt_tokens",
        _lines(
            *(
                {
                    "name": "openai.chat",
                    "context": {"trace_id": "0x5b8e", "span_id": f"0x{n}", "trace_state": "[]"},
                    "kind": "SpanKind.CLIENT",
                    "parent_id": None,
                    "start_time": start,
                    "end_time": end,
                    "status": {"status_code": "UNSET"},
                    "attributes": {
                        "llm.request.type": "chat",
                        "gen_ai.system": "OpenAI",
                        "gen_ai.request.model": "gpt-3.5-turbo",
                        "gen_ai.request.max_tokens": 80,
                        "gen_ai.prompt.0.role": "system",
                        "gen_ai.prompt.0.content": "You are terse.",
                        "gen_ai.prompt.1.role": "user",
                        "gen_ai.prompt.1.content": question,
                        "gen_ai.completion.0.role": "assistant",
                        "gen_ai.completion.0.content": "ok",
                        "gen_ai.usage.prompt_tokens": 20 + n,
                        "gen_ai.usage.completion_tokens": 1,
                    },
                    "events": [],
                    "links": [],
                    "resource": {"attributes": {"service.name": "app"}, "schema_url": ""},
                }
                for n, (question, start, end) in enumerate(
                    [
                        ("Ping?", "2026-11-20T10:00:00.000000Z", "2026-11-20T10:00:00.500000Z"),
                        ("Pong?", "2026-11-20T10:00:02.000000Z", "2026-11-20T10:00:02.500000Z"),
                    ]
                )
            )
        ),
        {
            "format": "otel-genai",
            "first": ["You are terse.", "Ping?"],
            "prompt_tokens": [[20], [21]],
            "max_tokens": [[80], [80]],
            "offsets": [0.0, 2.0],
        },
    ),
    Case(
        "otel-span-events-carry-the-messages",
        "open-telemetry/semantic-conventions docs/gen-ai/gen-ai-events.md (gen_ai.system.message, "
        "gen_ai.user.message with a content body), recorded as span events",
        _lines(
            {
                **_otlp_span(
                    "chat m",
                    _T0_NS,
                    _T0_NS + 10**9,
                    {"gen_ai.operation.name": "chat", "gen_ai.request.max_tokens": 16},
                ),
                "events": [
                    {"timeUnixNano": str(_T0_NS), "name": name, "attributes": [_attribute("content", text)]}
                    for name, text in (("gen_ai.system.message", "Be kind."), ("gen_ai.user.message", "Hello"))
                ],
            }
        ),
        {"format": "otel-genai", "args": ("--output-tokens", "fixed:7"), "first": ["Be kind.", "Hello"]},
    ),
    Case(
        "a-json-object-of-no-known-format-refused-at-line-1",
        "llmload: detection names the keys it saw",
        _lines({"prompt": "Hi", "completion": "Hello"}),
        {"exit": 2, "refusal": "{log}:1: a JSON object of no known log format (keys ['completion', 'prompt'])"},
    ),
]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse refusals
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _per_session(workload: Any, field: str) -> list[list[Any]]:
    return [[getattr(turn, field) for turn in session.turns] for session in workload.sessions]


def check(case: Case, tmp_path: Path) -> None:
    """Build the log with the real command; the exit code, the refusal or the workload's values are the expected."""
    want = case.expect
    log = tmp_path / want.get("file", "log.jsonl")
    log.write_text(case.given, encoding="utf-8")
    output = tmp_path / "built.yaml"
    code, stdout, stderr = _run(["workload", "build", str(log), "-o", str(output), *want.get("args", ())])
    assert code == want.get("exit", 0), stderr
    if "refusal" in want:
        assert want["refusal"].format(log=log) in stderr
        assert not output.exists()
        return
    workload = load_workload(output)
    assert workload.spec.source is not None and workload.spec.source.format == want["format"]
    if "turns" in want:
        assert [len(s.turns) for s in workload.sessions] == want["turns"]
    if "ids" in want:
        assert [s.id for s in workload.sessions] == want["ids"]
    if "first" in want:
        assert [m.content for m in workload.sessions[0].turns[0].messages] == want["first"]
    for field in ("prompt_tokens", "output_tokens", "max_tokens"):
        if field in want:
            assert _per_session(workload, field) == want[field], field
    if "think" in want:
        assert _per_session(workload, "think_time_s") == [
            [pytest.approx(t, abs=1e-3) for t in s] for s in want["think"]
        ]
    if "offsets" in want:
        offsets = [s.offset_s for s in workload.sessions]
        assert offsets == [None if o is None else pytest.approx(o, abs=1e-3) for o in want["offsets"]]
        assert (_NO_TIMES in stdout) == all(o is None for o in want["offsets"])
    assert want.get("ignored", "") in stderr
