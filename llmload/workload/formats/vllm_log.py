"""`vllm-log`: vLLM server logs written with `--enable-log-requests`."""

from __future__ import annotations

import ast
import re
from collections import OrderedDict
from collections.abc import Iterator
from datetime import UTC, datetime
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
    log_timestamp,
)

_PY_STR = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|None)"""
_TOKEN_IDS = r"(\[[\d, ]*\]|None)"
# vLLM ≥ 0.10: details at DEBUG, then the INFO line, from one call (RequestLogger.log_inputs).
_DETAILS = re.compile(rf"Request (\S+) details: prompt: ({_PY_STR}), prompt_token_ids: {_TOKEN_IDS}")
_RECEIVED = re.compile(r"Received request (\S+): params: (.*)")
_BODY = re.compile(r"Request (\S+) JSON body: (.*)")
# vLLM ≤ 0.9: one INFO line with everything.
_RECEIVED_OLD = re.compile(
    rf"Received request (\S+): prompt: ({_PY_STR}), (?:sampling_)?params: (.*?), prompt_token_ids: {_TOKEN_IDS}"
)
_STAMP_FULL = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)")
_STAMP_SHORT = re.compile(r"(?<![\d-])(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_VLLM_LINE = re.compile(r"(?:INFO|DEBUG|WARNING|ERROR) \d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_PENDING_MAX = 10_000


def _sampling(params: str) -> tuple[int | None, int | None]:
    """(max_tokens, forced output) from a SamplingParams repr; ignore_eos forces max_tokens out."""
    found = re.search(r"\bmax_tokens=(\d+)", params)
    max_tokens = int(found.group(1)) if found else None
    forced = max_tokens if "ignore_eos=True" in params else None
    return max_tokens, forced


def _count_ids(ids: str) -> int | None:
    return None if ids == "None" else (0 if ids == "[]" else ids.count(",") + 1)


class _VllmClock:
    """vLLM's default log time is `MM-DD hh:mm:ss` (no year): keep it monotonic across new year."""

    def __init__(self) -> None:
        self.year, self.last = 2000, 0.0

    def read(self, line: str) -> float | None:
        full = _STAMP_FULL.search(line)
        if full:
            return log_timestamp(full.group(1).replace(",", "."))
        short = _STAMP_SHORT.search(line)
        if not short:
            return None
        month, day, hour, minute, second = (int(g) for g in short.groups()[:5])
        fraction = float(f"0.{short.group(6)}") if short.group(6) else 0.0
        stamp = datetime(self.year, month, day, hour, minute, second, tzinfo=UTC).timestamp() + fraction
        if stamp < self.last - 180 * 86400:
            self.year += 1
            stamp = datetime(self.year, month, day, hour, minute, second, tzinfo=UTC).timestamp() + fraction
        self.last = stamp
        return stamp


def _bounded_put(pending: OrderedDict[str, Any], key: str, value: Any) -> None:
    pending[key] = value
    if len(pending) > _PENDING_MAX:
        pending.popitem(last=False)


def parse_vllm_log(path: Path) -> Iterator[Parsed]:
    """vLLM server logs with `--enable-log-requests`; other lines are skipped.

    vLLM ≥ 0.10 (checked against 0.32's `RequestLogger`) logs at INFO only
    `Received request chatcmpl-…: params: SamplingParams(… max_tokens=…), lora_request: None.`;
    the prompt comes at DEBUG (`VLLM_LOGGING_LEVEL=DEBUG`), just before, as
    `Request chatcmpl-… details: prompt: '<templated>', prompt_token_ids: [...]`, and the request
    body before that as `Request … JSON body: {...}`. Older vLLM logs one line:
    `Received request chatcmpl-…: prompt: '…', params: SamplingParams(…), prompt_token_ids: [...]`.

    The prompt length is `prompt_token_ids` (the server's own count). The messages are the JSON
    body's when it was logged, so multi-turn chats group into sessions; otherwise the templated
    prompt becomes one user message. `ignore_eos=True` means the output was `max_tokens` long.
    """
    clock = _VllmClock()
    prompts: OrderedDict[str, tuple[str | None, int | None]] = OrderedDict()
    bodies: OrderedDict[str, str] = OrderedDict()
    logs_bodies = False
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            if "equest " not in raw:
                continue
            line = _ANSI.sub("", raw) if "\x1b" in raw else raw
            where = f"{path}:{number}"
            try:
                if (body := _BODY.search(line)) is not None:
                    logs_bodies = True
                    _bounded_put(bodies, body.group(1), body.group(2))
                elif (details := _DETAILS.search(line)) is not None:
                    prompt = ast.literal_eval(details.group(2))
                    _bounded_put(prompts, details.group(1), (prompt, _count_ids(details.group(3))))
                elif (old := _RECEIVED_OLD.search(line)) is not None:
                    _, prompt, params, ids = old.groups()
                    stamp = clock.read(line[: old.start()])
                    yield from _vllm_request(
                        where, stamp, prompt=ast.literal_eval(prompt), n_ids=_count_ids(ids), params=params, body=None
                    )
                elif (received := _RECEIVED.search(line)) is not None:
                    request_id, params = received.groups()
                    if params.startswith("None"):
                        prompts.pop(request_id, None)
                        yield Issue(where, f"not a generation request (no sampling params): {request_id}", False)
                        continue
                    if request_id not in prompts:
                        raise BadLine(
                            f"no prompt logged: request {request_id} (vLLM ≥ 0.10 logs prompts at DEBUG level: "
                            "run it with VLLM_LOGGING_LEVEL=DEBUG and --enable-log-requests)"
                        )
                    prompt, n_ids = prompts.pop(request_id)
                    body_text = bodies.pop(request_id.removeprefix("chatcmpl-"), None)
                    if body_text is None and logs_bodies and request_id.startswith("chatcmpl-"):
                        yield Issue(where, f"templated prompt used: no JSON body matches {request_id}", False)
                    stamp = clock.read(line[: received.start()])
                    yield from _vllm_request(where, stamp, prompt=prompt, n_ids=n_ids, params=params, body=body_text)
                elif "Received request" in line:
                    raise BadLine("unreadable vLLM request line: cut short, or a format this parser does not know")
            except (BadLine, SyntaxError, ValueError) as exc:
                yield Issue(where, str(exc) if isinstance(exc, BadLine) else f"unreadable vLLM request line: {exc}")


def _vllm_request(
    where: str, stamp: float | None, *, prompt: str | None, n_ids: int | None, params: str, body: str | None
) -> Iterator[Parsed]:
    if prompt is None and n_ids is None:
        raise BadLine("no prompt logged: neither a prompt nor prompt_token_ids")
    # Token ids without text (a client sent ids): a length-only request, synthesized like a trace.
    messages = None if prompt is None else [{"role": "user", "content": prompt}]
    if body is not None:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
            yield Issue(where, "templated prompt used: JSON body cut short (--max-log-len)", False)
        if isinstance(parsed, dict) and "messages" in parsed:
            messages = chat_messages(parsed["messages"])
    max_tokens, forced = _sampling(params)
    yield LogRequest(
        where=where,
        timestamp=stamp,
        messages=messages,
        max_tokens=max_tokens,
        prompt_tokens=n_ids,
        output_tokens=forced,
    )


def _sniff(head: Head) -> bool:
    """vLLM request or log lines in the first 64 KiB of a log that does not start with a JSON object."""
    return head.record is None and ("Received request" in head.text or _VLLM_LINE.search(head.text) is not None)


FORMAT = LogFormat(name="vllm-log", title="a vLLM log", sniff=_sniff, parse=parse_vllm_log, fallback=True)
