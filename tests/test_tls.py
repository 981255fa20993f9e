"""HTTPS targets: the embedded target serving TLS with a CA made here (trustme), reached by real Locust
runs and the client. Every connection of a run (the model list, server detection, the chat streams,
/health, /metrics) trusts what --ca-cert says and carries --header; a certificate that is not
trusted is refused before any request, in OpenSSL's words; --insecure is said aloud; no secret is
written anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import trustme

from llmload.access import INSECURE_WARNING, Access
from llmload.client import ChatClient, StreamResult
from llmload.sim.process import SimProcess
from tests.locust_runs import run_locust, small_workload

KEY = "sk-tls-test-GATEWAY-31337"
SHORT_RUN = ("--target-qps", "4", "--stages", "100", "--stage-duration", "4", "--warmup", "0", "--arrival", "constant")
BODY = orjson.dumps(
    {"model": "llmload-sim", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
)


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA that signed the server's certificate
    server: Path  # its key and certificate chain
    client_ca: Path  # the CA a mutual-TLS server trusts for clients
    client: Path  # a client's key and certificate, signed by client_ca
    self_signed: Path  # a key and a certificate signed by itself


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("tls")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    paths = Certificates(directory / "ca.pem", directory / "server.pem", directory / "client-ca.pem",
                         directory / "client.pem", directory / "self-signed.pem")  # fmt: skip
    server_ca.cert_pem.write_to_path(str(paths.ca))
    server_ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(paths.server))
    client_ca.cert_pem.write_to_path(str(paths.client_ca))
    client_ca.issue_cert("load-generator@example.test").private_key_and_cert_chain_pem.write_to_path(str(paths.client))
    paths.self_signed.write_bytes(server_ca.private_key_pem.bytes() + server_ca.cert_pem.bytes())
    return paths


@pytest.fixture(scope="module")
def https_target(certificates: Certificates) -> Iterator[SimProcess]:
    """HTTPS, and like `vllm serve --api-key`: /v1 answers 401 without the bearer token."""
    with SimProcess("--ssl-certfile", str(certificates.server), "--api-key", KEY, "--itl-ms", "5") as sim:
        yield sim


def _files_text(directory: Path) -> str:
    return "\n".join(path.read_bytes().decode(errors="replace") for path in directory.rglob("*") if path.is_file())


def test_every_connection_of_a_run_trusts_the_ca_given_and_carries_the_header(
    tmp_path: Path, https_target: SimProcess, certificates: Certificates
) -> None:
    assert https_target.url.startswith("https://")
    run = run_locust(
        https_target.url, small_workload(tmp_path), tmp_path / "reports", "tls", *SHORT_RUN,
        "--ca-cert", str(certificates.ca), "--header", f"Authorization: Bearer {KEY}",
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    records = run.records
    assert len(records) >= 14 and (records.status == "ok").all(), records.error_message.dropna().unique()
    manifest = run.manifest
    # the model came from /v1/models and the kind from the probes: both over TLS, with the header
    assert manifest["model"] == "llmload-sim" and manifest["server"]["kind"] == "vllm", manifest["server"]
    assert manifest["access"] == {"tls_verify": "ca_cert", "ca_cert": str(certificates.ca), "client_cert": None,
                                  "headers": ["Authorization"], "api_key": False}  # fmt: skip
    samples = [orjson.loads(line) for line in (run.run_dir / "server.jsonl").read_bytes().splitlines()]
    assert any(s.get("running") is not None for s in samples), samples[:2]  # /metrics read over TLS
    report = (run.run_dir / "report.md").read_text()
    assert f"Connection: TLS, verified against `{certificates.ca}`; headers Authorization" in report
    assert KEY not in _files_text(run.run_dir) and KEY not in run.output


def test_a_certificate_not_trusted_is_refused_before_any_request_in_openssls_words(
    tmp_path: Path, https_target: SimProcess
) -> None:
    run = run_locust(https_target.url, small_workload(tmp_path), tmp_path / "reports", "untrusted", *SHORT_RUN)
    assert run.returncode == 2, run.output[-3000:]
    assert "certificate verify failed: unable to get local issuer certificate" in run.output
    assert "--ca-cert FILE" in run.output and "Traceback" not in run.output
    assert not (run.run_dir / "requests.jsonl").exists()


def test_insecure_reaches_the_target_and_says_so_on_the_console_and_in_the_report(
    tmp_path: Path, https_target: SimProcess
) -> None:
    run = run_locust(
        https_target.url, small_workload(tmp_path), tmp_path / "reports", "insecure", *SHORT_RUN,
        "--insecure", "--model", "llmload-sim", env={"LLMLOAD_API_KEY": KEY},
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    assert (run.records.status == "ok").all()
    assert INSECURE_WARNING in run.output
    assert run.manifest["access"]["tls_verify"] == "insecure" and run.manifest["access"]["api_key"] is True
    assert INSECURE_WARNING in run.summary["run"]["warnings"]
    assert "**TLS, certificates not verified (--insecure)**" in (run.run_dir / "report.md").read_text()
    assert KEY not in _files_text(run.run_dir) and KEY not in run.output


def _stream(url: str, access: Access | None = None) -> StreamResult:
    client = ChatClient(url, access=access)
    try:
        return client.stream_chat(BODY)
    finally:
        client.close()


def test_a_stream_to_an_untrusted_certificate_fails_as_tls_with_the_reason(
    https_target: SimProcess, certificates: Certificates
) -> None:
    result = _stream(https_target.url)
    assert result.error_category == "tls", result
    assert result.error_message == "TLS: certificate verify failed: unable to get local issuer certificate"
    with SimProcess("--ssl-certfile", str(certificates.self_signed)) as self_signed:
        result = _stream(self_signed.url)
    assert (result.error_category, result.error_message) == (
        "tls",
        "TLS: certificate verify failed: self-signed certificate",
    )


def test_a_server_that_requires_a_client_certificate(tmp_path: Path, certificates: Certificates) -> None:
    """Mutual TLS: without --client-cert the run is refused before it starts (the server closes the
    connection after the handshake, as asyncio servers, vLLM's among them, do); with it, it streams."""
    mutual = ("--ssl-certfile", str(certificates.server), "--ssl-ca-certs", str(certificates.client_ca))
    with SimProcess(*mutual) as sim:
        refused = run_locust(sim.url, small_workload(tmp_path), tmp_path / "reports", "no-client-cert", *SHORT_RUN,
                             "--ca-cert", str(certificates.ca))  # fmt: skip
        result = _stream(sim.url, Access(ca_cert=certificates.ca, client_cert=certificates.client))
    assert refused.returncode == 2, refused.output[-3000:]
    assert "it may require a client certificate (--client-cert FILE" in refused.output
    assert result.ok and len(result.token_times) == 4, result
