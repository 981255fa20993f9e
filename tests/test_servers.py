"""Server kinds (llmload/server): which server a URL is, what its requests carry, and a field a
server refuses dropped for the rest of the run. Detection is checked against loopback servers that
answer each probe the way the real server does (its source, quoted in kinds.yaml's `read_from`),
and against the embedded target; the real servers that run here are in test_servers_real.py."""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from llmload.errors import InputError
from llmload.server.detect import identify, require_calibrating_server
from llmload.server.kinds import compatibility_table, kind, kinds
from llmload.server.request import RequestShape, parse_extra_body
from llmload.sim.process import SimProcess
from tests.locust_runs import fixed_output_workload, run_locust
from tests.wire_server import QuietHandler, serve

Page = tuple[int, Any, dict[str, str]]  # status, JSON body, headers


def _answering(pages: dict[str, Page]) -> type[BaseHTTPRequestHandler]:
    """GETs answered from `pages` (404 otherwise); every path asked is kept in `asked`."""

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"
        asked: ClassVar[list[str]] = []

        def do_GET(self) -> None:
            Handler.asked.append(self.path)
            status, body, headers = pages.get(self.path, (404, {"detail": "Not Found"}, {}))
            self.answer(status, json.dumps(body).encode(), "application/json", headers)

    return Handler


def _models(owner: str) -> Page:
    return 200, {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owner}]}, {}


# each server's answers to the probes, as its source writes them
SERVERS: dict[str, tuple[dict[str, Page], str | None]] = {
    "vllm": ({"/v1/models": _models("vllm"), "/version": (200, {"version": "0.33.0"}, {})}, "0.33.0"),
    "sglang": (
        {"/v1/models": _models("sglang"),
         "/server_info": (200, {"version": "0.5.23", "model_path": "/m", "frontend": "python"}, {})},
        "0.5.23",
    ),
    "tgi": (
        {"/v1/models": _models("meta-llama/Llama-3.1-8B"),
         "/info": (200, {"model_id": "m", "router": "text-generation-router", "version": "3.3.6-dev0",
                         "max_total_tokens": 4096}, {})},
        "3.3.6-dev0",
    ),
    "llama_cpp": (
        {"/v1/models": (200, {"data": [{"id": "m", "owned_by": "llamacpp"}]}, {"Server": "llama.cpp"}),
         "/props": (200, {"build_info": "b1-0c1e570", "total_slots": 4}, {"Server": "llama.cpp"})},
        "b1-0c1e570",
    ),
    "ollama": ({"/v1/models": _models("library"), "/api/version": (200, {"version": "0.33.0"}, {})}, "0.33.0"),
    "trtllm": ({"/v1/models": _models("tensorrt_llm"), "/version": (200, {"version": "1.2.0"}, {})}, "1.2.0"),
    "lmdeploy": ({"/v1/models": _models("lmdeploy")}, None),
    "triton": ({"/v1/models": _models("Triton Inference Server")}, None),
    "transformers": (
        {"/v1/models": (200, {"object": "list", "data": []}, {}),
         "/openapi.json": (200, {"info": {"title": "FastAPI"}, "paths": {
             "/v1/chat/completions": {}, "/v1/responses": {}, "/load_model": {}, "/reset": {}, "/health": {}}}, {})},
        None,
    ),
    "generic": ({"/v1/models": _models("someone")}, None),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SERVERS))
def test_each_server_is_told_by_probes_that_change_nothing(name: str) -> None:
    pages, version = SERVERS[name]
    handler = _answering(pages)
    with serve(handler) as url:
        found = identify(url + "/v1")
    assert (found.kind, found.version) == (name, version), found
    assert found.label == kind(name).label
    assert all(path.startswith("/") for path in handler.asked)  # GETs only (the handler answers nothing else)


def test_calibration_refuses_a_server_without_vllms_endpoints_naming_it() -> None:
    with serve(_answering(SERVERS["tgi"][0])) as url, pytest.raises(InputError) as refused:
        require_calibrating_server(url)
    assert str(refused.value) == (
        f"calibration needs vLLM's /metrics and /tokenize; {url} is TGI 3.3.6-dev0 (told by GET /info)"
    )


def test_hosted_apis_are_told_by_their_host_and_never_probed() -> None:
    assert identify("https://api.openai.com/v1").kind == "openai"
    assert identify("https://my-team.openai.azure.com/openai/deployments/gpt").kind == "azure"


def test_the_embedded_target_is_a_vllm_and_says_it_is_the_simulator() -> None:
    with SimProcess() as sim:
        found = identify(sim.url)
        assert (found.kind, found.version) == ("vllm", "0.32.0+llmload-sim")
        assert identify(sim.url, override="transformers").kind == "transformers"
    with pytest.raises(InputError, match="--server-kind: no server kind 'vlm'"):
        identify("http://127.0.0.1:9", override="vlm")


def _body(shape: RequestShape, output_tokens: int | None = 16, max_tokens: int | None = None) -> dict[str, Any]:
    raw = shape.body("m", [{"role": "user", "content": "hi"}], max_tokens=max_tokens, output_tokens=output_tokens)
    body: dict[str, Any] = orjson.loads(raw)
    return body


def _raw(shape: RequestShape) -> bytes:
    return orjson.dumps(_body(shape))


def test_a_length_is_forced_only_the_way_each_kind_takes_it() -> None:
    forced = {name: {k: v for k, v in _body(RequestShape(k)).items() if k not in ("model", "messages", "stream")}
              for name, k in kinds().items()}  # fmt: skip
    usage = {"stream_options": {"include_usage": True}}
    assert (
        forced["vllm"]
        == forced["sglang"]
        == forced["trtllm"]
        == {**usage, "max_tokens": 16, "min_tokens": 16, "ignore_eos": True}
    )
    assert forced["lmdeploy"] == {**usage, "max_tokens": 16, "min_new_tokens": 16, "ignore_eos": True}
    assert forced["llama_cpp"] == {**usage, "max_tokens": 16, "ignore_eos": True}
    assert forced["transformers"] == {
        **usage,
        "max_tokens": 16,
        "generation_config": '{"min_new_tokens":16,"eos_token_id":-1}',
    }
    for name in ("tgi", "ollama", "triton", "openai", "azure", "generic"):
        assert forced[name] == {**usage, "max_tokens": 16}, name
        assert not RequestShape(kind(name)).forces_length and kind(name).force_note
    # a workload that only caps the length: max_tokens, nothing forced, on every kind
    assert {k for k in _body(RequestShape(kind("vllm")), output_tokens=None, max_tokens=64)} == {
        "model", "messages", "stream", "stream_options", "max_tokens"
    }  # fmt: skip


def test_a_field_of_ours_a_server_refuses_is_dropped_for_the_rest_of_the_run(caplog: pytest.LogCaptureFixture) -> None:
    """As transformers serve (422), OpenAI (400) and Triton (422, FastAPI's detail list) refuse them;
    the user's --extra-body fields and a refusal about something else are never dropped."""
    refusals = [
        (422, "Unexpected fields in the request: {'ignore_eos', 'min_tokens'}", ["ignore_eos", "min_tokens"]),
        (400, "Unrecognized request argument supplied: min_tokens", ["min_tokens"]),
        (422, str([{"type": "extra_forbidden", "loc": ["body", "ignore_eos"]}]), ["ignore_eos"]),
        (400, "This model's maximum context length is 2048 tokens", []),
        (500, "Unexpected fields in the request: {'ignore_eos'}", []),
    ]
    for status, message, dropped in refusals:
        shape = RequestShape(kind("vllm"), extra=parse_extra_body('{"top_k": 20}'))
        sent = orjson.dumps(_body(shape))
        with caplog.at_level(logging.WARNING, logger="llmload"):
            assert shape.refused(status, message, sent) == dropped
        body = _body(shape)
        assert body["top_k"] == 20 and not set(dropped) & set(body)
        assert shape.forces_length is not bool(dropped)
        # a request sent before another dropped the field is retried too, with no second warning
        assert shape.refused(status, message, sent) == dropped and not shape.refused(status, message, _raw(shape))
    shape = RequestShape(kind("vllm"), extra={"min_tokens": 4})
    assert shape.refused(400, "Unrecognized request argument supplied: min_tokens", _raw(shape)) == []  # the user's
    assert any(
        "refused ignore_eos, min_tokens" in r.message and "no longer forced" in r.message for r in caplog.records
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{top_k: 20}", "--extra-body: not valid JSON"),
        ("[1]", "--extra-body: not a JSON object: a list"),
        ('{"stream": false}', "stream"),
    ],
)
def test_a_bad_extra_body_is_refused(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_extra_body(text)


def test_a_run_against_a_server_that_refuses_our_fields_drops_them_and_fails_nothing(tmp_path: Path) -> None:
    """The embedded target answering as OpenAI does to vLLM's sampling fields: the first request is
    refused, sent again without them (its schedule delay shows the extra round trip), and every
    request after goes without; the report says the lengths were not forced and what came back."""
    workload = fixed_output_workload(tmp_path, 12, sessions=40)
    with SimProcess("--ttft-ms", "5", "--itl-ms", "2", "--refuse-fields", "ignore_eos,min_tokens") as sim:
        run = run_locust(
            sim.url, workload, tmp_path / "reports", "refused", "--target-qps", "8", "--stages", "100",
            "--stage-duration", "4", "--arrival", "constant", "--extra-body", '{"top_p": 0.9}',
        )  # fmt: skip
        statuses = sim.stats()["responses_by_status"]
    assert run.returncode == 0, run.output[-3000:]
    summary = run.summary
    assert summary["requests"]["failed"] == 0 and summary["requests"]["ok"] == summary["requests"]["sent"] > 0
    # refused once per field (the simulator names one at a time, as OpenAI does), never again
    assert 1 <= statuses.get("400", 0) <= 2 + 2, statuses  # two requests may meet each refusal at once
    assert run.output.count("refused ignore_eos") == 1 and run.output.count("refused min_tokens") == 1, run.output[
        -3000:
    ]
    records = run.records
    assert not records.output_tokens_forced.any() and (records.requested_output_tokens == 12).all()
    lengths = summary["output_lengths"]
    assert lengths["requested"] == summary["requests"]["ok"] and lengths["forced"] == 0
    assert any(w.startswith("output lengths not forced for") for w in summary["run"]["warnings"])
    assert (
        summary["run"]["server"]["kind"] == "vllm"
        and "vLLM 0.32.0+llmload-sim" in (run.run_dir / "report.md").read_text()
    )


def test_the_docs_print_the_table_of_kinds_yaml() -> None:
    text = (Path(__file__).parents[1] / "docs" / "servers.md").read_text()
    start = text.index("<!-- the table:")
    table = text[text.index("\n", start) + 1 : text.index("<!-- end of the table -->")]
    assert table == compatibility_table(), "docs/servers.md's table is stale: regenerate it (see the docs)"
