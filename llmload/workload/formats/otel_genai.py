"""`otel-genai`: OpenTelemetry spans of GenAI calls, exported as JSON: OTLP/JSON trace requests
(`{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}`, one a line as the collector's file exporter
writes them), or one span a line (an OTLP/JSON span, or the Python SDK's `Span.to_json()` with a flat
`attributes` object and ISO `start_time`), or such spans indented one after another, as the SDK's
`ConsoleSpanExporter` prints them (`common.json_values`). Each span whose `gen_ai.operation.name` (or OpenLLMetry's
`llm.request.type`) is chat, text_completion or generate_content is one request; other spans (tools,
agents, embeddings, HTTP) are ignored and counted.

Kept: the span's start and end (`startTimeUnixNano`/`endTimeUnixNano`, or `start_time`/`end_time`),
`gen_ai.request.max_tokens`, `gen_ai.usage.input_tokens`/`output_tokens` (or the older
`prompt_tokens`/`completion_tokens`, or OpenLLMetry's `llm.usage.*`), and the prompt where the
instrumentation recorded it: the
`gen_ai.input.messages` attribute (with `gen_ai.system_instructions`; text parts kept, tool-call
parts sent as empty content), a `gen_ai.prompt` JSON attribute (or on a `gen_ai.content.prompt` event),
OpenLLMetry's flattened `gen_ai.prompt.N.role`/`.content` (older: `llm.prompts.N.*`; a content
that was a list of parts is JSON text there), or the `gen_ai.{system,user,assistant,tool}.message`
span events; the reply from `gen_ai.output.messages` or `gen_ai.completion.0.content`. Semconv 1.37+
may put the messages on a `gen_ai.client.inference.operation.details` event instead: read alike.
OpenInference (Arize Phoenix) LLM spans (`openinference.span.kind` LLM) are read from their own names:
`llm.input_messages.N.message.*`, `llm.output_messages.0`, `llm.token_count.prompt`/`completion`, and
`max_tokens` in the `llm.invocation_parameters` JSON. A span with token
counts but no prompt text is a length-only request.

Source: the OpenTelemetry GenAI semantic conventions (open-telemetry/semantic-conventions
docs/gen-ai/gen-ai-spans.md, gen-ai-events.md, gen-ai-input-messages.json) and the OTLP/JSON encoding
(opentelemetry-proto, 64-bit integers as strings).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from llmload.workload.formats.common import (
    BadLine,
    Head,
    Issue,
    LogFormat,
    LogRequest,
    Parsed,
    chat_messages,
    json_records,
    log_timestamp,
    optional_integer,
    parse_records,
    token_count,
)

_CHAT_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})
_MEDIA_PARTS = frozenset({"blob", "file", "uri", "image", "image_url", "audio"})
_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_MESSAGE_EVENTS = {f"gen_ai.{role}.message": role for role in ("system", "user", "assistant", "tool")}


def _any_value(value: Any) -> Any:
    """An OTLP/JSON `AnyValue` as a Python value (intValue arrives as a string)."""
    if not isinstance(value, dict):
        return value
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        if not str(value["intValue"]).lstrip("-").isdigit():
            raise BadLine(f"bad span: intValue {value['intValue']!r} is not an integer")
        return int(value["intValue"])
    if "doubleValue" in value:
        return value["doubleValue"]
    if "boolValue" in value:
        return value["boolValue"]
    if "arrayValue" in value:
        return [_any_value(v) for v in _items(value["arrayValue"], "values")]
    if "kvlistValue" in value:
        return _attributes(_items(value["kvlistValue"], "values"))
    return None


def _items(container: Any, key: str) -> list[Any]:
    """`container[key]`, a list ([] where missing or null); BadLine for another shape."""
    value = container.get(key) if isinstance(container, dict) else None
    if value is None and isinstance(container, dict):
        return []
    if not isinstance(value, list):
        raise BadLine(f"bad span: {key} is not a list")
    return value


def _attributes(value: Any) -> dict[str, Any]:
    """Attributes as a dict: OTLP/JSON's list of {key, value}, or the SDK's flat object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, list) or not all(isinstance(a, dict) and "key" in a for a in value):
        raise BadLine("bad span: attributes is neither an object nor a list of {key, value}")
    return {a["key"]: _any_value(a.get("value")) for a in value}


def _time(span: dict[str, Any], nanos: str, iso: str) -> float | None:
    value = span.get(nanos)
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
            raise BadLine(f"bad timestamp: {nanos} is {value!r}")
        return int(value) / 1e9
    return log_timestamp(span.get(iso))


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadLine(f"bad span: {value[:40]!r} is not JSON") from None
    return value


def _parts_text(message: Any) -> str:
    """A semconv message's text parts joined; tool-call parts give no text, and media parts (blob, file,
    uri) are refused, as replaying the text alone would send another prompt."""
    parts = message.get("parts") if isinstance(message, dict) else None
    if not isinstance(parts, list):
        raise BadLine("bad span: a gen_ai message without a parts list")
    media = next((p["type"] for p in parts if isinstance(p, dict) and p.get("type") in _MEDIA_PARTS), None)
    if media is not None:
        raise BadLine(f"unsupported content: a gen_ai message has a {media!r} part (text only)")
    return "".join(
        p["content"]
        for p in parts
        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)
    )


def _parts_messages(value: Any) -> list[dict[str, str]]:
    messages = _json(value)
    if not isinstance(messages, list):
        raise BadLine("bad span: gen_ai.input.messages is not a list")
    return chat_messages(
        [{"role": m.get("role") if isinstance(m, dict) else None, "content": _parts_text(m)} for m in messages]
    )


def _flattened_content(value: Any) -> Any:
    """An OpenLLMetry content attribute: text, or a list of content parts it wrote as JSON text
    (`json.dumps(content)` where the message's content was a list)."""
    if isinstance(value, str) and value.startswith("[{") and value.endswith("}]"):
        try:
            parts = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        if isinstance(parts, list) and all(isinstance(p, dict) and "type" in p for p in parts):
            return parts
    return value


def _flattened(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenLLMetry's `prefix.N.role` / `prefix.N.content` attributes as messages, in N order."""
    out: list[dict[str, Any]] = []
    while f"{prefix}.{len(out)}.role" in attributes or f"{prefix}.{len(out)}.content" in attributes:
        n = len(out)
        content = _flattened_content(attributes.get(f"{prefix}.{n}.content"))
        out.append({"role": attributes.get(f"{prefix}.{n}.role"), "content": content})
    return out


def _first(attributes: dict[str, Any], *names: str) -> Any:
    """The first of `names` the span has: the semconv name, then older ones (OpenLLMetry's `llm.*`)."""
    return next((attributes[name] for name in names if attributes.get(name) is not None), None)


def _openinference_messages(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference's `prefix.N.message.role` / `.message.content` (or its text parts,
    `.message.contents.M.message_content.type`/`.text`) as messages, in N order."""
    out: list[dict[str, Any]] = []
    while f"{prefix}.{len(out)}.message.role" in attributes:
        key = f"{prefix}.{len(out)}.message"
        content = attributes.get(f"{key}.content")
        if content is None and f"{key}.contents.0.message_content.type" in attributes:
            content, m = [], 0
            while f"{key}.contents.{m}.message_content.type" in attributes:
                part = f"{key}.contents.{m}.message_content"
                content.append({"type": attributes[f"{part}.type"], "text": attributes.get(f"{part}.text")})
                m += 1
        out.append({"role": attributes[f"{key}.role"], "content": content})
    return out


def _openinference(attributes: dict[str, Any]) -> dict[str, Any]:
    """An OpenInference (Arize Phoenix) LLM span's attributes in the names this module reads: the messages of
    `llm.input_messages.*` as `gen_ai.prompt`, the reply, `llm.token_count.*`, and `max_tokens` of the
    `llm.invocation_parameters` JSON."""
    out: dict[str, Any] = {}
    messages = _openinference_messages(attributes, "llm.input_messages")
    if messages:
        out["gen_ai.prompt"] = messages
    replies = _openinference_messages(attributes, "llm.output_messages")
    if replies and isinstance(replies[0]["content"], str):
        out["gen_ai.completion.0.content"] = replies[0]["content"]
    for ours, theirs in (("gen_ai.usage.input_tokens", "llm.token_count.prompt"),
                         ("gen_ai.usage.output_tokens", "llm.token_count.completion")):  # fmt: skip
        if attributes.get(theirs) is not None:
            out[ours] = attributes[theirs]
    parameters = attributes.get("llm.invocation_parameters")
    try:
        parameters = orjson.loads(parameters) if isinstance(parameters, str) else parameters
    except orjson.JSONDecodeError:
        parameters = None
    if isinstance(parameters, dict):
        limit = parameters.get("max_completion_tokens", parameters.get("max_tokens"))
        if limit is not None:
            out["gen_ai.request.max_tokens"] = limit
    return out


def _prompt(attributes: dict[str, Any], events: list[tuple[Any, dict[str, Any]]]) -> list[dict[str, str]] | None:
    """The span's prompt messages wherever its instrumentation put them (None: it recorded none)."""
    if "gen_ai.input.messages" in attributes:
        system = attributes.get("gen_ai.system_instructions")
        instructions = [{"role": "system", "content": "".join(
            p["content"] for p in _json(system) if isinstance(p, dict) and isinstance(p.get("content"), str)
        )}] if system is not None else []  # fmt: skip
        return instructions + _parts_messages(attributes["gen_ai.input.messages"])
    prompt = attributes.get("gen_ai.prompt")
    prompt = next((a.get("gen_ai.prompt") for name, a in events if name == "gen_ai.content.prompt"), prompt)
    if prompt is not None:
        return chat_messages(_json(prompt))
    flattened = _flattened(attributes, "gen_ai.prompt") or _flattened(attributes, "llm.prompts")
    if flattened:
        return chat_messages(flattened)
    said = [(_MESSAGE_EVENTS[name], a) for name, a in events if name in _MESSAGE_EVENTS]
    if said:
        return chat_messages([{"role": role, "content": a.get("content")} for role, a in said])
    return None


def _reply(attributes: dict[str, Any]) -> str | None:
    output = attributes.get("gen_ai.output.messages")
    if output is not None:
        messages = _json(output)
        return _parts_text(messages[0]) if isinstance(messages, list) and messages else None
    reply = _flattened_content(_first(attributes, "gen_ai.completion.0.content", "llm.completions.0.content"))
    if isinstance(reply, list):
        return chat_messages([{"role": "assistant", "content": reply}])[0]["content"]
    return reply if isinstance(reply, str) else None


def _span(where: str, span: Any) -> Iterator[Parsed]:
    if not isinstance(span, dict):
        raise BadLine("bad span: not an object")
    attributes = _attributes(span.get("attributes"))
    operation = attributes.get("gen_ai.operation.name", attributes.get("llm.request.type"))
    if attributes.get("openinference.span.kind") == "LLM":
        operation, attributes = "chat", {**_openinference(attributes), **attributes}
    if operation not in _CHAT_OPERATIONS:
        yield Issue(
            where, f"not a GenAI chat span: {span.get('name')!r}", fatal=False, category="not a GenAI chat span"
        )
        return
    events = [
        (e.get("name"), _attributes(e.get("attributes"))) for e in span.get("events") or () if isinstance(e, dict)
    ]
    for name, event in events:  # semconv 1.37+: the messages may be on this event rather than the span
        if name == _DETAILS_EVENT:
            attributes = {**event, **attributes}
    prompt_tokens = token_count(
        _first(attributes, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.usage.prompt_tokens"),
        "input_tokens",
    )
    messages = _prompt(attributes, events)
    if messages is None and prompt_tokens is None:
        raise BadLine("no prompt: the span has neither prompt messages nor gen_ai.usage.input_tokens")
    yield LogRequest(
        where=where,
        timestamp=_time(span, "startTimeUnixNano", "start_time"),
        finished=_time(span, "endTimeUnixNano", "end_time"),
        messages=messages,
        max_tokens=optional_integer(
            _first(attributes, "gen_ai.request.max_tokens", "llm.request.max_tokens"),
            "gen_ai.request.max_tokens",
            minimum=1,
        ),
        prompt_tokens=prompt_tokens,
        output_tokens=token_count(
            _first(
                attributes,
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.completion_tokens",
                "llm.usage.completion_tokens",
            ),
            "output_tokens",
        ),
        reply=_reply(attributes),
    )


def _otel_record(where: str, record: dict[str, Any]) -> Iterator[Parsed]:
    """An OTLP/JSON trace request (every span of it, each at this line) or one span.

    Example (one span, OTLP/JSON, attributes abridged)::

        {"resourceSpans": [{"resource": {...}, "scopeSpans": [{"scope": {"name": "openai"}, "spans": [
          {"traceId": "5b8e…", "spanId": "eee1…", "name": "chat gpt-4o", "kind": 3,
           "startTimeUnixNano": "1732874400000000000", "endTimeUnixNano": "1732874400840000000",
           "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                          {"key": "gen_ai.request.max_tokens", "value": {"intValue": "64"}},
                          {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "9"}},
                          {"key": "gen_ai.input.messages", "value": {"stringValue": "[{\\"role\\": \\"user\\",
                            \\"parts\\": [{\\"type\\": \\"text\\", \\"content\\": \\"Hi\\"}]}]"}}]}]}]}]}
    """
    if "resourceSpans" not in record:
        yield from _span(where, record)
        return
    spans = [
        span
        for resource in _items(record, "resourceSpans")
        for scope in _items(resource, "scopeSpans") + _items(resource, "instrumentationLibrarySpans")
        for span in _items(scope, "spans")
    ]
    for index, span in enumerate(spans):  # a bad span is reported, and the line's other spans are read
        try:
            yield from _span(where, span)
        except BadLine as exc:
            yield Issue(where, f"{exc} (span {index} of the line)")


def parse_otel_genai(path: Path) -> Iterator[Parsed]:
    """OpenTelemetry GenAI spans exported as JSON (see `_otel_record`)."""
    return parse_records(json_records(path), _otel_record)


def _sniff(head: Head) -> bool:
    """A first JSON object that is an OTLP/JSON trace request (`resourceSpans`) or a span: `attributes`
    and a start time (`startTimeUnixNano`, or the SDK's `start_time` with its `context`)."""
    record = head.record
    if record is None:
        return False
    return "resourceSpans" in record or (
        "attributes" in record and ("startTimeUnixNano" in record or ("start_time" in record and "context" in record))
    )


FORMAT = LogFormat(name="otel-genai", title="an OpenTelemetry GenAI span export", sniff=_sniff, parse=parse_otel_genai)
