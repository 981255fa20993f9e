"""The servers that run on these CPUs, each checked against its row of llmload/server/kinds.yaml
(what docs/servers.md prints): told apart by llmload's probes, how its stream ends and where its
usage comes, whether it refuses an unknown field, whether the way llmload forces a length gives
exactly that length, the metrics it is read for and its tokenize endpoint. Then the sample
workload, fixed lengths and all, against transformers serve and llama-server: no false failure,
the server named, lengths forced and measured."""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from llmload.observe.metrics import metric_totals
from llmload.server.detect import identify
from llmload.server.kinds import CONDITIONAL_FIELDS, kind
from llmload.server.request import RequestShape
from tests.locust_runs import REPO, llmload_cli, metrics_text, run_locust
from tests.server_harness import HarnessServer

pytestmark = [pytest.mark.servers, pytest.mark.vllm]
SAMPLE = REPO / "workloads" / "chat-multiturn.yaml"
KINDS = {"vllm_server": "vllm", "transformers_server": "transformers", "llama_server": "llama_cpp"}
MESSAGES = [{"role": "user", "content": "Say something about the river and the mountain."}]


@pytest.fixture(params=list(KINDS))
def real(request: pytest.FixtureRequest) -> tuple[HarnessServer, str]:
    server: HarnessServer = request.getfixturevalue(request.param)
    return server, KINDS[request.param]


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[5:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


def test_each_real_server_is_what_its_row_says(real: tuple[HarnessServer, str]) -> None:
    server, expected = real
    model = server.served_model_name
    found = identify(server.url)
    assert found.kind == expected, found
    row = kind(found.kind)
    shape = RequestShape(row)
    for tokens in (24, 57):
        status, raw = _post(server.url, shape.body(model, MESSAGES, max_tokens=None, output_tokens=tokens))
        assert status == 200, raw[:500]
        assert (b"data: [DONE]" in raw) is row.sends_done, raw[-300:]
        events = _events(raw)
        finishing = [e for e in events if any(c.get("finish_reason") for c in e.get("choices") or [])]
        usage = [e for e in events if e.get("usage")]
        assert finishing and usage and usage[-1]["usage"]["completion_tokens"] == tokens, events[-2:]
        on_finish = usage[-1] in finishing
        assert on_finish is row.usage.startswith("on the finish_reason chunk"), (row.usage, usage[-1])
    body = orjson.loads(shape.body(model, MESSAGES, max_tokens=4, output_tokens=None))
    status, raw = _post(server.url, orjson.dumps({**body, "foo_bar": 1}))
    assert (status == 200) is (row.unknown_fields == "ignored"), (status, raw[:300], row.unknown_fields)
    if status != 200:
        assert row.unknown_fields == f"refused (HTTP {status})" and b"foo_bar" in raw
    if row.metrics_path:
        exported = metric_totals(metrics_text(server.url.rstrip("/") + row.metrics_path.removesuffix("/metrics")))
        missing = [
            names[0]
            for field, names in row.metrics.items()
            if field not in CONDITIONAL_FIELDS and not any(n in exported for n in names)
        ]
        assert not missing, missing
    if row.tokenize:
        method, path, text_field = row.tokenize.split()
        parts = urlsplit(server.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        body = orjson.dumps({text_field.strip("{}"): "hi there", "model": model})
        connection.request(method, path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()[:300]
        connection.close()


@pytest.mark.parametrize("fixture", ["transformers_server", "llama_server"])
def test_the_sample_workload_runs_against_another_server_with_no_false_failure(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Fixed output lengths, growing chats: every request answered, each at exactly its length, the
    report naming the server and putting the measured lengths beside the workload's."""
    server: HarnessServer = request.getfixturevalue(fixture)
    model = server.served_model_name
    run = run_locust(
        server.url, SAMPLE, tmp_path / "reports", fixture, "--model", model, "--target-qps", "1", "--stages", "100",
        "--stage-duration", "20", "--warmup", "0", "--arrival", "constant", "--drain-timeout", "60", timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    summary, records = run.summary, run.records
    requests = summary["requests"]
    assert requests["ok"] == requests["sent"] == 20 and requests["failed"] == requests["unfinished"] == 0, requests
    assert (records.output_tokens == records.requested_output_tokens).all()
    assert records.output_tokens_forced.all() and records.usage_from_server.all()
    lengths = summary["output_lengths"]
    assert lengths["forced"] == lengths["requested"] == 20
    assert lengths["output_tokens"] == lengths["requested_tokens"]
    row = kind(KINDS[fixture])
    assert summary["run"]["server"]["kind"] == row.name
    report = (run.run_dir / "report.md").read_text()
    assert report.splitlines()[2].startswith(f"Target `{server.url}`, {row.label}")
    assert "Output lengths: 20 successful requests fixed one" in report
    for field in row.not_exported():
        if field == "kv_cache_usage":
            assert f"KV-cache usage max not exported by {row.label}" in report
    if row.metrics:  # llama-server with --metrics: its queue in every sample
        samples = [orjson.loads(line) for line in (run.run_dir / "server.jsonl").read_bytes().splitlines()]
        assert samples and all(s["running"] is not None and s["waiting"] is not None for s in samples)
        assert any(s["generation_tokens_total"] for s in samples)


def test_calibrating_transformers_serve_stops_and_says_why(transformers_server: HarnessServer, tmp_path: Path) -> None:
    proc = llmload_cli(
        "sim", "calibrate", "--host", transformers_server.url, "-o", str(tmp_path / "p.yaml"), timeout=60
    )
    assert proc.returncode == 2
    assert f"calibration needs vLLM's /metrics and /tokenize; {transformers_server.url} is transformers serve" in (
        proc.stderr
    )
