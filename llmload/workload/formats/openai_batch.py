"""`openai-batch`: OpenAI Batch API files, input or output, one JSON object per line.

Input lines are requests as sent: the prompt text and `max_tokens`, no times (a batch has no arrival
times to keep). Output lines hold no prompt text: each is a length-only request of the response's
`usage`, at the completion's `created` time (unix seconds). Build from the input file for the text, or
from the output file for real lengths and times; a file of both would count every request twice.

Azure OpenAI's batch files are the same with `"url": "/chat/completions"`. Responses API lines
(`/v1/responses`: `input`, `instructions`, `max_output_tokens`; output bodies of object `response` with
`created_at` and `usage` input/output tokens) read alike.

Source: the Batch API reference (platform.openai.com/docs/api-reference/batch, "The request input
object" and "The request output object"; openapi `BatchRequestInput`, `BatchRequestOutput`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmload.workload.formats.common import (
    BadLine,
    Head,
    Issue,
    LogFormat,
    LogRequest,
    Parsed,
    chat_completion,
    json_records,
    log_timestamp,
    object_field,
    parse_records,
    request_max_tokens,
    request_messages,
    responses_messages,
)

_CHAT_PATH = "/chat/completions"
"""The chat endpoint's path: OpenAI's batch files say `/v1/chat/completions`, Azure OpenAI's `/chat/completions`."""
_RESPONSES_PATH = "/responses"
"""The Responses API's (`/v1/responses`): `input` and `instructions` for messages, `max_output_tokens`."""


def _batch_record(where: str, record: dict[str, Any]) -> Iterator[Parsed]:
    """An input line (a chat request) or an output line (its response's lengths and time).

    Example lines::

        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}}
        {"id": "batch_req_1", "custom_id": "r1", "error": null,
         "response": {"status_code": 200, "request_id": "req_1",
                      "body": {"object": "chat.completion", "created": 1711652795, "choices": [...],
                               "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}}}

    Lines of other endpoints (embeddings, completions) and failed requests (an `error`, a status other
    than 200) are ignored and counted.
    """
    if "body" in record:
        url = record.get("url")
        path = url.split("?", 1)[0] if isinstance(url, str) else ""
        if not path.endswith((_CHAT_PATH, _RESPONSES_PATH)):
            yield Issue(where, f"not a chat request: url {url!r}", fatal=False, category="not a chat request")
            return
        body = object_field(record, "body")
        messages = request_messages(body) if path.endswith(_CHAT_PATH) else responses_messages(body)
        yield LogRequest(where=where, messages=messages, max_tokens=request_max_tokens(body))
        return
    response = object_field(record, "response")
    if record.get("error") is not None or response.get("status_code") != 200:
        yield Issue(where, "failed request: no response body", fatal=False, category="failed request")
        return
    body = object_field(response, "body")
    if body.get("object") not in ("chat.completion", "response"):
        yield Issue(where, f"not a chat request: a {body.get('object')!r} response", fatal=False,
                    category="not a chat request")  # fmt: skip
        return
    _, prompt_tokens, output_tokens = chat_completion(body, "response.body")
    if prompt_tokens is None or output_tokens is None:
        raise BadLine("no usage: response.body.usage lacks prompt_tokens or completion_tokens")
    yield LogRequest(
        where=where,
        timestamp=log_timestamp(body.get("created", body.get("created_at"))),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )


def parse_openai_batch(path: Path) -> Iterator[Parsed]:
    """OpenAI Batch API input or output lines (see `_batch_record`)."""
    return parse_records(json_records(path), _batch_record)


def _sniff(head: Head) -> bool:
    """A first JSON object with a `custom_id` and a request `body` or a `response`."""
    return (
        head.record is not None and "custom_id" in head.record and ("body" in head.record or "response" in head.record)
    )


FORMAT = LogFormat(name="openai-batch", title="an OpenAI Batch API file", sniff=_sniff, parse=parse_openai_batch)
