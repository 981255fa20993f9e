"""`litellm`: LiteLLM's `StandardLoggingPayload`, one JSON object per line (or a JSON array of them),
as its logging callbacks (s3, GCS bucket, custom loggers) write every call.

Kept: `startTime` and `endTime` (unix seconds: the reply's end separates think time from the reply),
`messages`, `model_parameters.max_tokens`, `prompt_tokens` and `completion_tokens` (0, LiteLLM's "not
counted", is taken as unknown), the reply text of `response`. Failed calls (`status` "failure") and calls
other than chat completions (`call_type` embedding, image_generation, …) are ignored and counted.

Source: LiteLLM `litellm/types/utils.py` `StandardLoggingPayload` and docs/my-website/docs/proxy/logging_spec.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmload.workload.formats.common import (
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
    token_count,
)

_CHAT_CALLS = frozenset({"completion", "acompletion"})


def _litellm_record(where: str, record: dict[str, Any]) -> Iterator[Parsed]:
    """One logged call.

    Example (keys abridged)::

        {"id": "chatcmpl-1", "trace_id": "t1", "call_type": "acompletion", "stream": false, "status": "success",
         "startTime": 1732874400.12, "endTime": 1732874401.5, "completionStartTime": 1732874401.5,
         "model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "model_parameters": {"max_tokens": 64},
         "response": {"choices": [{"message": {"role": "assistant", "content": "Hello"}}], ...},
         "prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11, "response_cost": 2.5e-05, "metadata": {...}}
    """
    if record.get("status") == "failure":
        yield Issue(where, "failed call: status failure", fatal=False, category="failed call")
        return
    call = record.get("call_type")
    if call not in _CHAT_CALLS:
        yield Issue(where, f"not a chat call: call_type {call!r}", fatal=False, category="not a chat call")
        return
    response = record.get("response")
    reply, usage_prompt, usage_output = (
        (response, None, None) if isinstance(response, str) else chat_completion(response, "response")
    )
    yield LogRequest(
        where=where,
        timestamp=log_timestamp(record.get("startTime")),
        finished=log_timestamp(record.get("endTime")),
        messages=chat_messages(record.get("messages")),
        max_tokens=request_max_tokens(object_field(record, "model_parameters")),
        prompt_tokens=token_count(record.get("prompt_tokens"), "prompt_tokens") or usage_prompt,
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
