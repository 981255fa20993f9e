"""`litellm`: LiteLLM's `StandardLoggingPayload`, one JSON object per line (or a JSON array of them),
as its logging callbacks (s3, GCS bucket, custom loggers) write every call.

Kept: `startTime` and `endTime` (unix seconds: the reply's end separates think time from the reply),
`messages`, `model_parameters.max_tokens`, `prompt_tokens` and `completion_tokens` (0, LiteLLM's "not
counted", is taken as unknown), the reply text of `response`. Failed calls (`status` "failure") and calls
other than chat and text completions (`call_type` embedding, image_generation, …) are ignored and
counted. The proxy's `LiteLLM_SpendLogs` rows read alike: ISO times, messages and response as JSON text,
and, where the proxy kept no prompts (`{}`), the request body of `proxy_server_request` or else a
length-only request of `prompt_tokens`.

Source: LiteLLM `litellm/types/utils.py` `StandardLoggingPayload`, docs/my-website/docs/proxy/logging_spec.md,
and `schema.prisma` `LiteLLM_SpendLogs`.
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
    chat_completion,
    chat_messages,
    json_records,
    log_timestamp,
    object_field,
    parse_records,
    request_max_tokens,
    request_messages,
    token_count,
)

_CHAT_CALLS = frozenset({"completion", "acompletion", "text_completion", "atext_completion", "responses", "aresponses"})


def _decoded(value: Any) -> Any:
    """A JSON string decoded (a `LiteLLM_SpendLogs` export keeps messages and response as JSON text)."""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _messages(value: Any) -> list[dict[str, str]] | None:
    """The logged messages: a list, a text completion's prompt string (one user message), or None where
    the log did not keep them (the spend log without `store_prompts_in_spend_logs` writes `{}`)."""
    value = _decoded(value)
    if isinstance(value, str) and value:
        return [{"role": "user", "content": value}]
    if not value:
        return None
    return chat_messages(value)


def _litellm_record(where: str, record: dict[str, Any]) -> Iterator[Parsed]:
    """One logged call: a `StandardLoggingPayload`, or a row of the proxy's `LiteLLM_SpendLogs` table
    (`request_id`, ISO `startTime`/`endTime`, messages and response as JSON text or `{}` when the proxy
    does not store prompts, the request body in `proxy_server_request`).

    Example (keys abridged)::

        {"id": "chatcmpl-1", "trace_id": "t1", "call_type": "acompletion", "stream": false, "status": "success",
         "startTime": 1732874400.12, "endTime": 1732874401.5, "completionStartTime": 1732874401.5,
         "model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "model_parameters": {"max_tokens": 64},
         "response": {"choices": [{"message": {"role": "assistant", "content": "Hello"}}], ...},
         "prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11, "response_cost": 2.5e-05, "metadata": {...}}

    A call without messages is a length-only request of its `prompt_tokens`; one with neither is a bad line.
    """
    if record.get("status") == "failure":
        yield Issue(where, "failed call: status failure", fatal=False, category="failed call")
        return
    call = record.get("call_type")
    if call not in _CHAT_CALLS:
        yield Issue(where, f"not a chat call: call_type {call!r}", fatal=False, category="not a chat call")
        return
    sent = _decoded(record.get("proxy_server_request"))
    sent = sent if isinstance(sent, dict) else {}
    response = _decoded(record.get("response"))
    reply, usage_prompt, usage_output = (
        (response or None, None, None) if isinstance(response, str) else chat_completion(response or None, "response")
    )
    messages = _messages(record.get("messages"))
    if messages is None and sent.get("messages") is not None:
        messages = request_messages(sent)
    elif messages is None and isinstance(sent.get("prompt"), str):
        messages = [{"role": "user", "content": sent["prompt"]}]
    prompt_tokens = token_count(record.get("prompt_tokens"), "prompt_tokens") or usage_prompt
    if messages is None and prompt_tokens is None:
        raise BadLine("no prompt: neither messages nor prompt_tokens")
    parameters = object_field(record, "model_parameters")
    yield LogRequest(
        where=where,
        timestamp=log_timestamp(record.get("startTime")),
        finished=log_timestamp(record.get("endTime")),
        messages=messages,
        max_tokens=request_max_tokens(parameters) or request_max_tokens(sent),
        prompt_tokens=prompt_tokens,
        output_tokens=token_count(record.get("completion_tokens"), "completion_tokens") or usage_output,
        reply=reply,
    )


def parse_litellm(path: Path) -> Iterator[Parsed]:
    """LiteLLM standard logging payloads (see `_litellm_record`)."""
    return parse_records(json_records(path), _litellm_record)


def _sniff(head: Head) -> bool:
    """A first JSON object with LiteLLM's `call_type` and `startTime`."""
    return head.record is not None and "call_type" in head.record and "startTime" in head.record


FORMAT = LogFormat(name="litellm", title="a LiteLLM standard logging payload log", sniff=_sniff, parse=parse_litellm)
