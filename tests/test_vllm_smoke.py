"""Smoke tests against a real vLLM server: the facts the load tester relies on actually hold."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmload.client import ChatClient
from llmload.server.request import chat_body
from tests.vllm_harness import SERVED_MODEL_NAME, VllmServer

pytestmark = pytest.mark.vllm

# Random weights would stop at EOS at random; these force an exact output length.
EXACT = {"ignore_eos": True}


@pytest.fixture
def client(vllm_server: VllmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def test_exact_completion_tokens(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=SERVED_MODEL_NAME,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        extra_body={"min_tokens": 8, **EXACT},
    )
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 8
    assert resp.usage.prompt_tokens > 0
    assert resp.choices[0].finish_reason == "length"


def test_stream_has_usage_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=SERVED_MODEL_NAME,
        messages=[{"role": "user", "content": "Stream please."}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 12, **EXACT},
    )
    chunks = list(stream)
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1
    assert usage_chunks[0] is chunks[-1]
    assert chunks[-1].choices == []
    assert usage_chunks[0].usage is not None
    assert usage_chunks[0].usage.completion_tokens == 12
    # First chunk announces the role; content arrives in later chunks.
    assert chunks[0].choices[0].delta.role == "assistant"


def test_multi_turn_prompt_grows(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": "You are terse."}]
    seen: list[int] = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question number {turn}: what is the queue doing?"})
        resp = client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=messages, max_tokens=4, extra_body={"min_tokens": 4, **EXACT}
        )
        assert resp.usage is not None
        seen.append(resp.usage.prompt_tokens)
        messages.append({"role": "assistant", "content": resp.choices[0].message.content or "ok"})
    assert seen == sorted(seen) and len(set(seen)) == 3, seen


# vLLM 0.32 has two over-length checks: a cheap character pre-check (> 13 chars per allowed token
# -> param "input_text") and the real token count (-> param "input_tokens"). Both are HTTP 400.
@pytest.mark.parametrize(
    ("repeats", "param"),
    [(600, "input_tokens"), (2048, "input_text")],  # ~2.4k tokens/13.8k chars; ~8.2k tokens/47k chars
    ids=["tokens", "chars"],
)
def test_prompt_over_max_model_len_is_400(client: openai.OpenAI, repeats: int, param: str) -> None:
    too_long = "the model server queue " * repeats  # 4 tokens per repeat with the tiny tokenizer
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=[{"role": "user", "content": too_long}], max_tokens=4
        )
    err = info.value
    assert err.status_code == 400
    assert err.param == param, err.body
    assert "maximum context length is 2048 tokens" in err.message, err.body


def test_a_model_it_does_not_serve_is_model_not_found_with_its_message(vllm_server: VllmServer) -> None:
    """A LoRA adapter or model name the server lacks: vLLM's 404, its own category, the message kept."""
    client = ChatClient(vllm_server.url)
    try:
        result = client.stream_chat(
            chat_body("no-such-adapter", [{"role": "user", "content": "hi"}], max_tokens=4, output_tokens=None)
        )
    finally:
        client.close()
    assert (result.error_category, result.http_status) == ("model_not_found", 404), result
    assert "The model `no-such-adapter` does not exist" in (result.error_message or "")
