"""The streaming client against a real loopback server: timing, usage, and every failure classified."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from llmload.client import ChatClient, Limits
from llmload.server.request import chat_body
from llmload.sim.process import SimProcess

MODEL = "llmload-sim"  # the name the embedded target serves
MESSAGES = [{"role": "user", "content": "hello there, how are you today?"}]


@pytest.fixture(scope="module")
def paced() -> Iterator[SimProcess]:
    with SimProcess("--ttft-ms", "60", "--itl-ms", "15", "--max-model-len", "512") as sim:
        yield sim


def test_stream_is_timed_per_token_and_matches_the_sdk(paced: SimProcess) -> None:
    client = ChatClient(paced.url)
    result = client.stream_chat(chat_body(MODEL, MESSAGES, max_tokens=None, output_tokens=12))
    assert result.ok, result.error_message
    assert result.http_status == 200
    assert result.completion_tokens == 12 == len(result.token_times)
    # each token timed when it arrives, never before the server paced it (60 ms, then 15 ms a token);
    # how close to the server's clock is `make bench`'s table (benchmarks/load_generator.py), not a test's
    ttft_ms = (result.token_times[0] - result.sent_at) * 1000
    assert ttft_ms >= 55
    gaps = [b - a for a, b in zip(result.token_times, result.token_times[1:], strict=False)]
    assert sorted(gaps)[len(gaps) // 2] >= 0.011
    # the openai SDK, parsing the same server's stream, sees the same text and usage
    sdk = openai.OpenAI(base_url=paced.url + "/v1", api_key="x")
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 12, "ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None
    assert text == result.text
    assert (usage.prompt_tokens, usage.completion_tokens) == (result.prompt_tokens, result.completion_tokens)
    client.close()


def test_base_url_may_end_in_v1(paced: SimProcess) -> None:
    client = ChatClient(paced.url + "/v1")
    assert client.stream_chat(chat_body(MODEL, MESSAGES, max_tokens=3, output_tokens=None)).ok
    client.close()


def test_prompt_over_max_model_len_is_context_length(paced: SimProcess) -> None:
    client = ChatClient(paced.url)
    long = [{"role": "user", "content": "word " * 2000}]
    result = client.stream_chat(chat_body(MODEL, long, max_tokens=4, output_tokens=None))
    assert (result.error_category, result.http_status) == ("context_length", 400)
    assert "maximum context length" in (result.error_message or "")
    client.close()


@pytest.mark.parametrize(
    ("fault", "category", "status", "code"),
    [
        ("http_429", "rate_limited", 429, None),
        ("http_503", "rate_limited", 503, None),
        ("http_500", "http_5xx", 500, None),
        ("engine_dead", "engine_dead", 500, None),
        ("oom", "oom", 500, None),
        # an error object inside a 200 stream: the status line's 200 and the object's code, both kept
        ("stream_busy", "rate_limited", 200, 503),
        ("stream_engine_dead", "engine_dead", 200, 500),
        ("cut", "stream_error", 200, None),
        ("stall", "timeout", 200, None),
    ],
)
def test_each_fault_is_classified(fault: str, category: str, status: int, code: int | None) -> None:
    with SimProcess("--fault", f"{fault}:1.0", "--ttft-ms", "5", "--itl-ms", "2") as sim:
        client = ChatClient(sim.url, limits=Limits(first_token_s=2.0, between_tokens_s=0.5, total_s=5.0))
        result = client.stream_chat(chat_body(MODEL, MESSAGES, max_tokens=None, output_tokens=20))
        seen = (result.error_category, result.http_status, result.stream_error_code)
        assert seen == (category, status, code), result.error_message
        assert result.error_message
        # the connection is left usable or closed: a following request on the same client works or fails cleanly
        follow = client.stream_chat(chat_body(MODEL, MESSAGES, max_tokens=None, output_tokens=2))
        assert follow.error_category == category
        client.close()


@pytest.mark.parametrize(
    ("fault", "category", "message"),
    [
        # transformers serve: finish_reason and usage on the last chunk, then the stream closes
        ("no_done", None, None),
        ("no_end", "incomplete", "neither a finish_reason nor [DONE]"),
        ("error_chunk", "stream_error", "in-stream error: No requests can be scheduled"),
        ("bad_json", "malformed", "is not JSON"),
        ("html", "malformed", "HTTP 200 text/html; charset=utf-8, not an event stream: <!DOCTYPE html>"),
    ],
)
def test_a_stream_ends_honestly(fault: str, category: str | None, message: str | None) -> None:
    """Complete: a [DONE] or a finish_reason. A clean close with neither lost its end; an error object
    in the stream, an event that is not JSON, or an HTML page is a failure with its message."""
    with SimProcess("--fault", f"{fault}:1.0", "--ttft-ms", "5", "--itl-ms", "2") as sim:
        client = ChatClient(sim.url, limits=Limits(first_token_s=2.0, between_tokens_s=0.5, total_s=5.0))
        result = client.stream_chat(chat_body(MODEL, MESSAGES, max_tokens=None, output_tokens=20))
        assert result.error_category == category, result.error_message
        assert message is None or message in (result.error_message or ""), result.error_message
        if category is None:
            assert len(result.token_times) == 20 and result.completion_tokens == 20
        client.close()


def test_server_gone_is_server_down() -> None:
    with SimProcess() as sim:
        url = sim.url
    client = ChatClient(url, limits=Limits(connect_s=2.0))
    result = client.stream_chat(chat_body(MODEL, MESSAGES, max_tokens=2, output_tokens=None))
    assert result.error_category == "server_down"
    assert result.http_status is None
