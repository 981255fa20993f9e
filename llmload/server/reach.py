"""Whether the target can be reached at all: a TCP connection to its host and port, and for https its
TLS handshake, before the run sends it a request (each would be charged to it as a failure)."""

from __future__ import annotations

import socket
import urllib.parse

from llmload.access import Access, tls_reason
from llmload.errors import InputError

PROBE_TIMEOUT_S = 3.0  # the TCP connect to the target before the first arrival


def require_reachable(host: str, access: Access) -> None:
    """An InputError when no connection to the target opens, or its TLS handshake fails: no request is
    sent to a host where nothing listens or that cannot be trusted (each would be charged to it as a failure)."""
    parsed = urllib.parse.urlsplit(host)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError(f"--host {host} is not a URL: give http://HOST:PORT (or https://)")
    if (error := unreachable(host, access)) is not None:
        raise InputError(error if error.startswith("TLS") else f"nothing answers at {host}: {error}")


def unreachable(url: str, access: Access) -> str | None:
    """Why a TCP connection to the target's host and port fails, or an https target's TLS handshake
    (a sentence of its own, starting "TLS"), or None when the connection opens."""
    parsed = urllib.parse.urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        connection = socket.create_connection((parsed.hostname or "", port), timeout=PROBE_TIMEOUT_S)
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            return f"no answer in {PROBE_TIMEOUT_S:g} s"
        reason = str(exc.strerror or exc)
        return reason[:1].lower() + reason[1:]  # "connection refused", as part of a sentence
    with connection:
        return _tls_refusal(connection, parsed, access) if parsed.scheme == "https" else None


def _tls_refusal(connection: socket.socket, url: urllib.parse.SplitResult, access: Access) -> str | None:
    """Why the target's TLS refuses this client, or None. A HEAD request follows the handshake: with TLS
    1.3 a missing client certificate is refused only then, by an alert or (asyncio's servers: vLLM's)
    a connection closed without a word."""
    try:
        with access.ssl_context().wrap_socket(connection, server_hostname=url.hostname) as tls:
            tls.sendall(f"HEAD / HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode())
            if not tls.recv(1):
                return (
                    f"TLS: {url.geturl()} closed the connection after the handshake without answering: it may require"
                    " a client certificate (--client-cert FILE, --client-key FILE)"
                )
    except TimeoutError:
        return None  # the handshake went through; a slow answer is not this check's business
    except OSError as exc:
        reason = tls_reason(exc) or str(exc)
        hint = " (--ca-cert FILE trusts the CA that signed it; --insecure verifies nothing)"
        return f"TLS handshake with {url.geturl()} failed: {reason}{hint if 'verify' in reason else ''}"
    return None
