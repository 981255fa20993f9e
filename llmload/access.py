"""How llmload is let in to the target: its API key, extra headers and TLS trust, given once.

Every connection to the target (the chat streams and their /health probes, /metrics, the server's
detection, the model list, the reachability check) is built from one `Access`, so a CA, a client
certificate or a header given once reaches each of them. The key and the headers' values are
secrets: `Access` never shows them, and `note()` (what run.json keeps) names the headers only.
"""

from __future__ import annotations

import functools
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import gevent.ssl
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL

from llmload.errors import InputError
from llmload.models import AccessNote, TLSVerify

INSECURE_WARNING = "TLS certificates are not verified (--insecure): anyone on the path could have answered"


def parse_header(text: str) -> tuple[str, str]:
    """`Name: value` (as curl's -H takes it) as (name, value); an InputError names the flag."""
    name, colon, value = text.partition(":")
    name = name.strip()
    if not colon or not name or any(c.isspace() for c in name):
        raise InputError(f"--header {text!r}: give 'Name: value'")
    return name, value.strip()


def tls_reason(exc: BaseException) -> str | None:
    """Why a TLS handshake or session failed, in OpenSSL's words ("certificate verify failed:
    self-signed certificate"), or None when `exc` is no TLS error (urllib wraps it in a URLError)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException) and not isinstance(exc, ssl.SSLError):
        return tls_reason(reason)
    if not isinstance(exc, ssl.SSLError):
        return None
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    return str(exc.reason or exc).replace("_", " ").lower()


@dataclass(frozen=True)
class Access:
    """The credentials and trust of every connection to one target (`--api-key`, `--header`,
    `--ca-cert`, `--client-cert` / `--client-key`, `--insecure`)."""

    api_key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.client_key is not None and self.client_cert is None:
            raise InputError("--client-key needs --client-cert (the certificate the key belongs to)")
        if self.insecure and self.ca_cert is not None:
            raise InputError("--insecure verifies nothing, so --ca-cert would not be used: give one of the two")
        for flag, path in (("--ca-cert", self.ca_cert), ("--client-cert", self.client_cert),
                           ("--client-key", self.client_key)):  # fmt: skip
            if path is not None and not path.is_file():
                raise InputError(f"{flag} {path}: no such file")
        if self.ca_cert or self.client_cert or self.insecure:
            self.ssl_context()  # a certificate that does not load fails here, before any request

    @classmethod
    def from_options(cls, options: Any) -> Access:
        """From the Locust flags (`llmload/locust/flags.py` defines them)."""
        return cls(
            api_key=options.api_key or None,
            headers=tuple(parse_header(text) for text in options.header),
            ca_cert=Path(options.ca_cert) if options.ca_cert else None,
            client_cert=Path(options.client_cert) if options.client_cert else None,
            client_key=Path(options.client_key) if options.client_key else None,
            insecure=options.insecure,
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """What no record, log or report may carry: the key and every header's value."""
        return tuple(s for s in (self.api_key, *(value for _, value in self.headers)) if s)

    def request_headers(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base`, then the bearer token, then --header (which wins: a gateway's own Authorization)."""
        headers = dict(base or {})
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(self.headers)
        return headers

    def ssl_context(self, *, cooperative: bool = False) -> ssl.SSLContext:
        """urllib's context, or (`cooperative`) gevent's, whose sockets yield to other greenlets."""
        return _ssl_context(self.ca_cert, self.client_cert, self.client_key, self.insecure, cooperative)

    def http_client(self, url: str | URL, **options: Any) -> HTTPClient:
        """A geventhttpclient client (the hot path's transport) with these headers and, for https, this trust.
        A plain-http client makes no TLS context: gevent's, made in a process that patched ssl late (a test
        process importing Locust after ssl), can fail."""
        url = URL(url) if isinstance(url, str) else url
        if url.scheme == "https":
            context = self.ssl_context(cooperative=True)
            options.update(ssl_context_factory=lambda *_, **__: context, insecure=self.insecure)
        return HTTPClient.from_url(url, headers=self.request_headers(options.pop("headers", None)), **options)

    def open(self, url: str, *, timeout: float, data: bytes | None = None, method: str | None = None,
             headers: Mapping[str, str] | None = None) -> HTTPResponse:  # fmt: skip
        """urllib's urlopen with these headers and this trust (errors as urlopen raises them)."""
        request = urllib.request.Request(url, data=data, method=method, headers=self.request_headers(headers))
        context = self.ssl_context() if url.lower().startswith("https://") else None
        response: HTTPResponse = urllib.request.urlopen(request, timeout=timeout, context=context)
        return response

    def note(self, url: str) -> AccessNote:
        """How the run reached `url`, for run.json and the report: never a secret."""
        tls = url.lower().startswith("https://")
        verify: TLSVerify = "insecure" if self.insecure else ("ca_cert" if self.ca_cert else "system")
        return AccessNote(
            tls_verify=verify if tls else "plain_http",
            ca_cert=str(self.ca_cert) if self.ca_cert and tls else None,
            client_cert=str(self.client_cert) if self.client_cert and tls else None,
            headers=[name for name, _ in self.headers],
            api_key=bool(self.api_key),
        )


@functools.lru_cache(maxsize=8)
def _ssl_context(
    ca_cert: Path | None, client_cert: Path | None, client_key: Path | None, insecure: bool, cooperative: bool
) -> ssl.SSLContext:
    """One context per trust: the system's CAs plus --ca-cert, the client certificate loaded once."""
    context = (gevent.ssl.create_default_context if cooperative else ssl.create_default_context)()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        if ca_cert is not None:
            context.load_verify_locations(cafile=str(ca_cert))
    except (ssl.SSLError, OSError) as exc:
        raise InputError(f"--ca-cert {ca_cert}: not a PEM certificate ({tls_reason(exc) or exc})") from None
    try:
        if client_cert is not None:
            context.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
    except (ssl.SSLError, OSError) as exc:
        raise InputError(
            f"--client-cert {client_cert}: its certificate and key do not load ({tls_reason(exc) or exc})"
        ) from None
    return context
