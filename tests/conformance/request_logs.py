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
import csv
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


_HELICONE_CSV_COLUMNS = (
    "response_id",
    "response_created_at",
    "response_status",
    "request_created_at",
    "request_body",
    "request_properties",
    "request_user_id",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "latency",
    "cost",
)


def _helicone_csv(*rows: dict[str, Any]) -> str:
    """Rows as `npx @helicone/export --format csv` writes them (examples/export/typescript/index.ts
    `convertToCSVRow`): every cell quoted, an object's JSON with its quotes doubled before the cell's are."""

    def cell(value: Any) -> str:
        if value is None:
            return ""
        text = json.dumps(value, separators=(",", ":")).replace('"', '""') if isinstance(value, dict) else str(value)
        return '"' + text.replace('"', '""') + '"'

    lines = [",".join(_HELICONE_CSV_COLUMNS)]
    lines += [",".join(cell(row.get(column)) for column in _HELICONE_CSV_COLUMNS) for row in rows]
    return "\n".join(lines) + "\n"


def _csv(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV with a header, objects as JSON text in their cells, null as an empty cell."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in row.items()})
    return out.getvalue()


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


def _spend_log(n: int, start: str, end: str, **fields: Any) -> dict[str, Any]:
    """A row of LiteLLM's `LiteLLM_SpendLogs` table as exported (schema.prisma; ISO times, JSON columns)."""
    return {
        "request_id": f"chatcmpl-{n}",
        "call_type": "acompletion",
        "api_key": "88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778539800c9f1243fe6b4b",
        "spend": 0.00012,
        "total_tokens": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "startTime": start,
        "endTime": end,
        "completionStartTime": end,
        "model": "gpt-4o",
        "model_id": "model-1",
        "model_group": "gpt-4o",
        "custom_llm_provider": "openai",
        "api_base": "https://api.openai.com/v1",
        "user": "",
        "metadata": {"user_api_key_alias": None, "status": "success"},
        "cache_hit": "False",
        "cache_key": "Cache OFF",
        "request_tags": [],
        "team_id": None,
        "end_user": "",
        "requester_ip_address": "",
        "messages": {},
        "response": {},
        "session_id": f"sess-{n}",
        "status": "success",
        "proxy_server_request": {},
        **fields,
    }


def _sdk_span(name: str, start: str, end: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """A span as the OpenTelemetry Python SDK's `Span.to_json()` writes it (flat attributes, ISO times)."""
    return {
        "name": name,
        "context": {
            "trace_id": "0x5b8efff798038103d269b633813fc60c",
            "span_id": "0x051581bf3cb55c13",
            "trace_state": "[]",
        },
        "kind": "SpanKind.CLIENT",
        "parent_id": None,
        "start_time": start,
        "end_time": end,
        "status": {"status_code": "UNSET"},
        "attributes": attributes,
        "events": [],
        "links": [],
        "resource": {"attributes": {"telemetry.sdk.language": "python", "service.name": "app"}, "schema_url": ""},
    }


def _text_parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


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
        "json-array-of-message-arrays-indented",
        "issue 55's shape saved as one JSON file: an indented array of conversations, each an array of OpenAI "
        "chat messages (json.dump(conversations, f, indent=2))",
        json.dumps([_chat("Hello", "Hi!", "Write me a poem"), _chat("2+2?", "4")], indent=2) + "\n",
        {
            "file": "conversations.json",
            "args": ("--output-tokens", "fixed:7"),
            "format": "messages-jsonl",
            "turns": [2, 1],
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
        "jsonl-of-message-arrays-content-as-text-parts",
        "OpenAI chat messages whose content is a list of parts ([{type: text, text}], the vision-era shape, "
        "and the Responses API's input_text) in a JSONL of message arrays",
        _lines(
            [
                {"role": "system", "content": _text_parts("Be brief.")},
                {"role": "user", "content": [*_text_parts("Summarize: "), {"type": "input_text", "text": "a b c"}]},
                {"role": "assistant", "content": _text_parts("abc")},
            ]
        ),
        {"format": "messages-jsonl", "turns": [1], "first": ["Be brief.", "Summarize: a b c"], "offsets": [None]},
    ),
    Case(
        "message-with-an-image-part-refused-by-name-at-its-line",
        "OpenAI chat content parts (image_url): llmload replays text only, so an image prompt is refused, named",
        _lines(
            _chat("Hi", "Hello!"),
            [
                {
                    "role": "user",
                    "content": [
                        *_text_parts("What is this?"),
                        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
                    ],
                }
            ],
        ),
        {"exit": 2, "refusal": "{log}:2: unsupported content: messages[0] has a 'image_url' part (text only)"},
    ),
    Case(
        "azure-openai-batch-input-chat-completions-url",
        "learn.microsoft.com azure/ai-services/openai/how-to/batch (input lines with url /chat/completions)",
        _lines(*({**line, "url": "/chat/completions"} for line in _BATCH_INPUT)),
        {"format": "openai-batch", "turns": [1, 1], "max_tokens": [[100], [200]], "offsets": [None, None]},
    ),
    Case(
        "openai-batch-output-error-objects-and-400-bodies-counted",
        "platform.openai.com/docs/guides/batch (output lines: error object, or a response with status_code 400 "
        "and an error body)",
        _lines(
            {
                "id": "batch_req_1",
                "custom_id": "request-1",
                "response": {"status_code": 200, "request_id": "req_1", "body": _completion("Hi!", 22, 3)},
                "error": None,
            },
            {
                "id": "batch_req_2",
                "custom_id": "request-2",
                "response": {
                    "status_code": 400,
                    "request_id": "req_2",
                    "body": {
                        "error": {
                            "message": "Invalid 'max_tokens'",
                            "type": "invalid_request_error",
                            "param": "max_tokens",
                            "code": "integer_below_min_value",
                        }
                    },
                },
                "error": None,
            },
            {
                "id": "batch_req_3",
                "custom_id": "request-3",
                "response": None,
                "error": {"code": "batch_expired", "message": "This request could not be executed before the end."},
            },
        ),
        {"format": "openai-batch", "prompt_tokens": [[22]], "offsets": [0.0], "ignored": "failed request: 2"},
    ),
    Case(
        "litellm-spend-logs-export-without-prompts-is-length-only-with-times",
        "BerriAI/litellm schema.prisma LiteLLM_SpendLogs (request_id, startTime, endTime, messages/response '{}' "
        "unless store_prompts_in_spend_logs), exported as JSON rows",
        _lines(
            _spend_log(
                1,
                "2026-11-20T10:00:00.000Z",
                "2026-11-20T10:00:01.200Z",
                prompt_tokens=120,
                completion_tokens=30,
                total_tokens=150,
            ),
            _spend_log(
                2,
                "2026-11-20T10:00:04.500Z",
                "2026-11-20T10:00:05.000Z",
                prompt_tokens=80,
                completion_tokens=12,
                total_tokens=92,
            ),
            _spend_log(
                3, "2026-11-20T10:00:06.000Z", "2026-11-20T10:00:06.100Z", call_type="aembedding", prompt_tokens=5
            ),
        ),
        {
            "format": "litellm",
            "prompt_tokens": [[120], [80]],
            "output_tokens": [[30], [12]],
            "offsets": [0.0, 4.5],
            "ignored": "not a chat call: 1",
        },
    ),
    Case(
        "litellm-spend-logs-prompts-as-json-text-postgres-times",
        "BerriAI/litellm schema.prisma LiteLLM_SpendLogs with store_prompts_in_spend_logs: messages and response "
        "JSON columns exported as text, timestamps as Postgres writes them ('2026-11-20 10:00:00.5+00')",
        _lines(
            _spend_log(
                1,
                "2026-11-20 10:00:00.5+00",
                "2026-11-20 10:00:01.5+00",
                prompt_tokens=9,
                completion_tokens=6,
                messages=json.dumps(_chat("Hi")),
                response=json.dumps(_completion("Hello! How can I help?", 9, 6)),
                proxy_server_request=json.dumps({"model": "gpt-4o", "messages": _chat("Hi"), "max_tokens": 64}),
            ),
            _spend_log(
                2,
                "2026-11-20 10:00:11.5+00",
                "2026-11-20 10:00:12+00",
                prompt_tokens=27,
                completion_tokens=7,
                messages=json.dumps(_chat("Hi", "Hello! How can I help?", "A joke?")),
                response=json.dumps(_completion("No.", 27, 7)),
            ),
        ),
        {
            "format": "litellm",
            "turns": [2],
            "first": ["Hi"],
            "prompt_tokens": [[9, 27]],
            "max_tokens": [[64, None]],
            "offsets": [0.0],
            "think": [[0.0, 10.0]],
        },
    ),
    Case(
        "litellm-text-completion-and-streamed-chat-payloads",
        "litellm/types/utils.py CallTypes (atext_completion), StandardLoggingPayload of a streamed call "
        "(stream true, response the assembled ModelResponse), TextCompletionResponse choices[].text",
        _lines(
            _litellm(
                1732874400.0,
                _chat("Once upon a time"),
                "",
                call_type="atext_completion",
                response={
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": " there was"}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": 3},
                },
            ),
            _litellm(
                1732874405.0,
                [{"role": "user", "content": _text_parts("Hi")}],
                "Hello!",
                stream=True,
                completion_tokens=2,
                prompt_tokens=8,
            ),
        ),
        {
            "format": "litellm",
            "turns": [1, 1],
            "prompt_tokens": [[4], [8]],
            "output_tokens": [[3], [2]],
            "offsets": [0.0, 5.0],
        },
    ),
    Case(
        "langfuse-public-api-page-indented-data-meta",
        "langfuse public API GET /api/public/observations response {data: [Observation], meta: {page, limit, "
        "totalItems, totalPages}}, saved indented; v3 fields (providedModelName, usageDetails, costDetails)",
        json.dumps(
            {
                "data": [
                    _observation(
                        "GENERATION",
                        "2026-11-20T10:00:00.200Z",
                        "2026-11-20T10:00:01.400Z",
                        completionStartTime="2026-11-20T10:00:00.500Z",
                        model="gpt-4o",
                        providedModelName="gpt-4o-2024-08-06",
                        modelParameters={"max_tokens": 256},
                        input=[{"role": "user", "content": _text_parts("Hi")}],
                        output={"role": "assistant", "content": _text_parts("Hello!")},
                        usageDetails={"input": 14, "output": 3, "total": 17},
                        costDetails={"input": 3.5e-05, "output": 3e-05, "total": 6.5e-05},
                    ),
                    _observation("SPAN", "2026-11-20T10:00:02.000Z", "2026-11-20T10:00:02.100Z"),
                    _observation(
                        "GENERATION",
                        "2026-11-20T10:00:07.000Z",
                        "2026-11-20T10:00:07.500Z",
                        model="gpt-4o",
                        input=_chat("2+2?"),
                        output="4",
                        usageDetails={"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
                    ),
                ],
                "meta": {"page": 1, "limit": 50, "totalItems": 3, "totalPages": 1},
            },
            indent=2,
        ),
        {
            "file": "observations-page-1.json",
            "format": "langfuse",
            "turns": [1, 1],
            "first": ["Hi"],
            "prompt_tokens": [[14], [8]],
            "output_tokens": [[3], [1]],
            "offsets": [0.0, 6.8],
            "ignored": "not a generation: 1",
        },
    ),
    Case(
        "langfuse-traces-export-refused-naming-observations",
        "langfuse public API GET /api/public/traces / the Traces table export (id, timestamp, input, output, "
        "sessionId, htmlPath): traces hold no per-call timing or usage",
        json.dumps(
            [
                {
                    "id": "trace-1",
                    "timestamp": "2026-11-20T10:00:00.000Z",
                    "name": "chat",
                    "input": {"question": "Hi"},
                    "output": "Hello!",
                    "sessionId": "s1",
                    "userId": None,
                    "metadata": {},
                    "tags": [],
                    "htmlPath": "/project/p/traces/trace-1",
                    "latency": 1.2,
                    "totalCost": 6.5e-05,
                    "observations": ["obs-1"],
                }
            ],
            indent=2,
        ),
        {"file": "traces.json", "exit": 2, "refusal": "{log}:2: a Langfuse trace, not an observation"},
    ),
    Case(
        "helicone-query-api-page-anthropic-body-system-kept",
        "Helicone API POST /v1/request/query response {data: [HeliconeRequest], error: null} saved as returned "
        "(sort created_at asc); an Anthropic Messages body (top-level system, text blocks) and response (content, "
        "usage input_tokens/output_tokens)",
        json.dumps(
            {
                "data": [
                    _helicone(
                        created,
                        answered,
                        {
                            "model": "claude-3-5-sonnet-20241022",
                            "max_tokens": 300,
                            "system": "You are terse.",
                            "messages": [{"role": "user", "content": _text_parts(question)}],
                        },
                        request_path="https://api.anthropic.com/v1/messages",
                        provider="ANTHROPIC",
                        response_body={
                            "id": "msg_1",
                            "type": "message",
                            "role": "assistant",
                            "content": _text_parts("ok"),
                            "stop_reason": "end_turn",
                            "usage": {"input_tokens": 12, "output_tokens": 1},
                        },
                    )
                    for question, created, answered in (
                        ("Ping?", "2026-11-20T10:00:00.000Z", "2026-11-20T10:00:00.900Z"),
                        ("Pong?", "2026-11-20T10:00:03.000Z", "2026-11-20T10:00:03.700Z"),
                    )
                ],
                "error": None,
            }
        ),
        {
            "file": "query.json",
            "format": "helicone",
            "turns": [1, 1],
            "first": ["You are terse.", "Ping?"],
            "prompt_tokens": [[12], [12]],
            "output_tokens": [[1], [1]],
            "max_tokens": [[300], [300]],
            "offsets": [0.0, 3.0],
        },
    ),
    Case(
        "otel-console-span-exporter-indented-spans-one-after-another",
        "open-telemetry/opentelemetry-python sdk/trace/export ConsoleSpanExporter (formatter span.to_json() + "
        "os.linesep, to_json indent=4); traceloop/openllmetry _set_prompts (a list content as json.dumps text)",
        "".join(
            json.dumps(
                _sdk_span(
                    "openai.chat",
                    start,
                    end,
                    {
                        "llm.request.type": "chat",
                        "gen_ai.system": "OpenAI",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.request.max_tokens": 50,
                        "gen_ai.prompt.0.role": "user",
                        "gen_ai.prompt.0.content": json.dumps(_text_parts(question)),
                        "gen_ai.completion.0.role": "assistant",
                        "gen_ai.completion.0.content": "ok",
                        "gen_ai.usage.prompt_tokens": 11,
                        "gen_ai.usage.completion_tokens": 1,
                    },
                ),
                indent=4,
            )
            + "\n"
            for question, start, end in (
                ("Ping?", "2026-11-20T10:00:00.000000Z", "2026-11-20T10:00:00.400000Z"),
                ("Pong?", "2026-11-20T10:00:02.500000Z", "2026-11-20T10:00:03.000000Z"),
            )
        ),
        {
            "file": "spans.txt",
            "format": "otel-genai",
            "turns": [1, 1],
            "first": ["Ping?"],
            "prompt_tokens": [[11], [11]],
            "max_tokens": [[50], [50]],
            "offsets": [0.0, 2.5],
        },
    ),
    Case(
        "otel-openllmetry-legacy-llm-attributes",
        "traceloop/openllmetry before the gen_ai.* rename: llm.prompts.N.role/.content, llm.completions.N.content, "
        "llm.usage.prompt_tokens/completion_tokens, llm.request.max_tokens, llm.request.type",
        _lines(
            _sdk_span(
                "openai.chat",
                "2026-11-20T10:00:00.000000Z",
                "2026-11-20T10:00:01.000000Z",
                {
                    "llm.request.type": "chat",
                    "llm.vendor": "OpenAI",
                    "llm.request.model": "gpt-3.5-turbo",
                    "llm.request.max_tokens": 40,
                    "llm.prompts.0.role": "user",
                    "llm.prompts.0.content": "Tell me a joke",
                    "llm.completions.0.role": "assistant",
                    "llm.completions.0.content": "No.",
                    "llm.usage.prompt_tokens": 12,
                    "llm.usage.completion_tokens": 2,
                    "llm.usage.total_tokens": 14,
                },
            )
        ),
        {
            "format": "otel-genai",
            "first": ["Tell me a joke"],
            "prompt_tokens": [[12]],
            "output_tokens": [[2]],
            "max_tokens": [[40]],
            "offsets": [0.0],
        },
    ),
    Case(
        "otlp-json-semconv-image-part-refused-by-name",
        "open-telemetry/semantic-conventions gen-ai-input-messages.json (BlobPart / UriPart in parts): a prompt "
        "with media cannot be replayed as text",
        _lines(
            {
                "resourceSpans": [
                    {
                        "scopeSpans": [
                            {
                                "spans": [
                                    _otlp_span(
                                        "chat gpt-4o",
                                        _T0_NS,
                                        _T0_NS + 10**9,
                                        {
                                            **_CHAT_SPAN,
                                            "gen_ai.input.messages": json.dumps(
                                                [
                                                    {
                                                        "role": "user",
                                                        "parts": [
                                                            {"type": "text", "content": "What is this?"},
                                                            {
                                                                "type": "uri",
                                                                "modality": "image",
                                                                "uri": "https://x/cat.png",
                                                            },
                                                        ],
                                                    }
                                                ]
                                            ),
                                        },
                                    )
                                ]
                            }
                        ]
                    }
                ]
            }
        ),
        {"exit": 2, "refusal": "{log}:1: unsupported content: a gen_ai message has a 'uri' part (text only)"},
    ),
    Case(
        "helicone-csv-export-doubled-json-quotes-rows-in-time-order",
        "Helicone/helicone examples/export/typescript/index.ts --format csv (writeCSVHeader columns; "
        "convertToCSVRow doubles an object's JSON quotes, then the cell's), rows put in time order",
        _helicone_csv(
            *(
                _helicone(
                    created,
                    answered,
                    {"model": "gpt-4o", "messages": _chat(*texts), "max_tokens": 50},
                    prompt_tokens=tokens,
                    completion_tokens=2,
                    latency=700,
                    request_properties={"app": "support"},
                )
                for texts, tokens, created, answered in (
                    (("Hi",), 8, "2026-11-20T10:00:00.000Z", "2026-11-20T10:00:00.700Z"),
                    (("Hi", "Hello!", 'Say "bye"'), 21, "2026-11-20T10:00:04.700Z", "2026-11-20T10:00:05.400Z"),
                )
            )
        ),
        {
            "file": "output.csv",
            "format": "helicone",
            "turns": [2],
            "first": ["Hi"],
            "prompt_tokens": [[8, 21]],
            "output_tokens": [[2, 2]],
            "max_tokens": [[50, 50]],
            "offsets": [0.0],
            "think": [[0.0, 4.0]],
        },
    ),
    Case(
        "langfuse-csv-export-json-cells",
        "langfuse/langfuse batch export of the observations table as CSV (the JSON export's camelCase columns; "
        "input, output, modelParameters, usageDetails as JSON text; numbers as text; null empty)",
        _csv(
            [
                _observation(
                    "GENERATION",
                    start,
                    end,
                    model="gpt-4o-mini",
                    modelParameters={"max_tokens": 128},
                    input=_chat(question),
                    output={"role": "assistant", "content": "ok"},
                    usageDetails={"input": tokens, "output": 1, "total": tokens + 1},
                    costDetails={},
                )
                for question, tokens, start, end in (
                    ("Ping?", 10, "2026-11-20T10:00:00.000Z", "2026-11-20T10:00:00.600Z"),
                    ("Pong?", 12, "2026-11-20T10:00:09.000Z", "2026-11-20T10:00:09.500Z"),
                )
            ]
        ),
        {
            "file": "observations.csv",
            "format": "langfuse",
            "turns": [1, 1],
            "first": ["Ping?"],
            "prompt_tokens": [[10], [12]],
            "output_tokens": [[1], [1]],
            "max_tokens": [[128], [128]],
            "offsets": [0.0, 9.0],
        },
    ),
    Case(
        "gateway-log-created-at-duration-and-streamed-chunks",
        "a gateway's request log naming its times created_at and duration_ms, the streamed response logged as its "
        "chat.completion.chunk objects (platform.openai.com/docs/api-reference/chat-streaming; the last chunk's "
        "usage with stream_options.include_usage)",
        _lines(
            *(
                {
                    "id": f"log-{n}",
                    "created_at": created,
                    "duration_ms": 1000,
                    "request": {
                        "model": "gpt-4o-mini",
                        "messages": messages,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                    "response": [
                        {
                            "id": "c",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": "gpt-4o-mini",
                            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                            "usage": None,
                        },
                        *(
                            {
                                "id": "c",
                                "object": "chat.completion.chunk",
                                "created": 1,
                                "model": "gpt-4o-mini",
                                "choices": [{"index": 0, "delta": {"content": piece}}],
                                "usage": None,
                            }
                            for piece in ("Hel", "lo!")
                        ),
                        {
                            "id": "c",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": "gpt-4o-mini",
                            "choices": [],
                            "usage": {"prompt_tokens": tokens, "completion_tokens": 2},
                        },
                    ],
                }
                for n, (created, messages, tokens) in enumerate(
                    [
                        ("2026-11-20T10:00:00Z", _chat("Hi"), 8),
                        ("2026-11-20T10:00:06Z", _chat("Hi", "Hello!", "Bye"), 19),
                    ]
                )
            )
        ),
        {
            "format": "openai-jsonl",
            "turns": [2],
            "prompt_tokens": [[8, 19]],
            "output_tokens": [[2, 2]],
            "offsets": [0.0],
            "think": [[0.0, 5.0]],
        },
    ),
    Case(
        "openinference-llm-spans-otlp-json",
        "Arize-ai/openinference spec/semantic_conventions.md (openinference.span.kind LLM, "
        "llm.input_messages.N.message.role/content, llm.token_count.prompt, llm.invocation_parameters), "
        "exported as OTLP/JSON by the collector's file exporter",
        _lines(
            {
                "resourceSpans": [
                    {
                        "scopeSpans": [
                            {
                                "spans": [
                                    _otlp_span(
                                        "ChatCompletion",
                                        _T0_NS + offset,
                                        _T0_NS + offset + 800_000_000,
                                        {
                                            "openinference.span.kind": "LLM",
                                            "llm.model_name": "gpt-4o",
                                            "llm.invocation_parameters": json.dumps({"max_tokens": 90}),
                                            "llm.input_messages.0.message.role": "system",
                                            "llm.input_messages.0.message.content": "Be brief.",
                                            "llm.input_messages.1.message.role": "user",
                                            "llm.input_messages.1.message.contents.0.message_content.type": "text",
                                            "llm.input_messages.1.message.contents.0.message_content.text": question,
                                            "llm.output_messages.0.message.role": "assistant",
                                            "llm.output_messages.0.message.content": "ok",
                                            "llm.token_count.prompt": 17,
                                            "llm.token_count.completion": 1,
                                        },
                                    )
                                    for offset, question in ((0, "Ping?"), (3_000_000_000, "Pong?"))
                                ]
                            }
                        ]
                    }
                ]
            }
        ),
        {
            "format": "otel-genai",
            "turns": [1, 1],
            "first": ["Be brief.", "Ping?"],
            "prompt_tokens": [[17], [17]],
            "output_tokens": [[1], [1]],
            "max_tokens": [[90], [90]],
            "offsets": [0.0, 3.0],
        },
    ),
    Case(
        "otel-semconv-messages-on-the-operation-details-event",
        "open-telemetry/semantic-conventions docs/gen-ai/gen-ai-events.md (event "
        "gen_ai.client.inference.operation.details carrying gen_ai.input.messages and gen_ai.system_instructions)",
        _lines(
            {
                **_otlp_span(
                    "chat gpt-4o",
                    _T0_NS,
                    _T0_NS + 10**9,
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.max_tokens": 32,
                        "gen_ai.usage.input_tokens": 15,
                        "gen_ai.usage.output_tokens": 3,
                    },
                ),
                "events": [
                    {
                        "timeUnixNano": str(_T0_NS + 10**9),
                        "name": "gen_ai.client.inference.operation.details",
                        "attributes": [
                            _attribute(
                                "gen_ai.system_instructions", json.dumps([{"type": "text", "content": "Be kind."}])
                            ),
                            _attribute("gen_ai.input.messages", json.dumps([_parts("user", "Hello")])),
                        ],
                    }
                ],
            }
        ),
        {"format": "otel-genai", "first": ["Be kind.", "Hello"], "prompt_tokens": [[15]], "offsets": [0.0]},
    ),
    Case(
        "openai-batch-responses-api-input-lines",
        "platform.openai.com/docs/guides/batch (url /v1/responses; body input, instructions, max_output_tokens)",
        _lines(
            {
                "custom_id": "r1",
                "method": "POST",
                "url": "/v1/responses",
                "body": {
                    "model": "gpt-4.1-mini",
                    "instructions": "Be brief.",
                    "input": "Name a river.",
                    "max_output_tokens": 40,
                },
            },
            {
                "custom_id": "r2",
                "method": "POST",
                "url": "/v1/responses",
                "body": {
                    "model": "gpt-4.1-mini",
                    "max_output_tokens": 80,
                    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a lake."}]}],
                },
            },
        ),
        {
            "format": "openai-batch",
            "turns": [1, 1],
            "first": ["Be brief.", "Name a river."],
            "max_tokens": [[40], [80]],
            "offsets": [None, None],
        },
    ),
    Case(
        "openai-batch-responses-api-output-usage-and-created-at",
        "platform.openai.com/docs/api-reference/responses/object (object response, created_at, output message "
        "output_text, usage input_tokens/output_tokens) in a batch output line",
        _lines(
            *(
                {
                    "id": f"batch_req_{n}",
                    "custom_id": f"r{n}",
                    "response": {
                        "status_code": 200,
                        "request_id": f"req_{n}",
                        "body": {
                            "id": f"resp_{n}",
                            "object": "response",
                            "created_at": created,
                            "status": "completed",
                            "model": "gpt-4.1-mini-2025-04-14",
                            "output": [
                                {
                                    "type": "message",
                                    "id": "msg_1",
                                    "status": "completed",
                                    "role": "assistant",
                                    "content": [{"type": "output_text", "text": "Nile.", "annotations": []}],
                                }
                            ],
                            "usage": {"input_tokens": tokens, "output_tokens": 3, "total_tokens": tokens + 3},
                        },
                    },
                    "error": None,
                }
                for n, (created, tokens) in enumerate([(1741476542, 20), (1741476549, 24)])
            )
        ),
        {"format": "openai-batch", "prompt_tokens": [[20], [24]], "output_tokens": [[3], [3]], "offsets": [0.0, 7.0]},
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
