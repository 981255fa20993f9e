"""Which server is behind a URL: a few GET requests that cannot change it, read against kinds.yaml.

The answer decides what a request may carry (a vLLM sampling field refused by transformers serve
fails every request), how a stream ends, which metrics exist and which commands can run, so it is
found once at the start and written into run.json. `--server-kind` overrides it.
"""

from __future__ import annotations

import urllib.error
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from llmload.access import Access
from llmload.errors import InputError
from llmload.models import ServerIdentity
from llmload.server.kinds import GENERIC, ServerKind, kind, kinds

PROBE_TIMEOUT_S = 3.0
NO_ANSWER = "no answer to GET /v1/models"


@dataclass(frozen=True)
class Answer:
    """One GET: its status (None: no answer), the Server header and the JSON body (None: not JSON)."""

    status: int | None
    server: str
    body: Any


def _get(base: str, path: str, access: Access) -> Answer:
    try:
        with access.open(base + path, timeout=PROBE_TIMEOUT_S) as response:
            status, server, raw = response.status, response.headers.get("server", ""), response.read()
    except urllib.error.HTTPError as exc:
        status, server, raw = exc.code, exc.headers.get("server", "") if exc.headers else "", b""
    except (OSError, ValueError):
        return Answer(None, "", None)
    try:
        return Answer(status, server, orjson.loads(raw) if status == 200 else None)
    except orjson.JSONDecodeError:
        return Answer(status, server, None)


def _owned_by(models: Any) -> str | None:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        owner = data[0].get("owned_by")
        return str(owner) if owner is not None else None
    return None


def _marked(body: Any, keys: list[str]) -> bool:
    return bool(keys) and isinstance(body, dict) and all(k in body for k in keys)


def _version(kind_: ServerKind, body: Any) -> str | None:
    key = kind_.detect.version_key
    if key and isinstance(body, dict) and body.get(key) is not None:
        return str(body[key])
    return None


def _identity(kind_: ServerKind, evidence: str, probe: Answer | None = None) -> ServerIdentity:
    return ServerIdentity(
        kind=kind_.name, label=kind_.label, version=_version(kind_, probe.body) if probe else None, evidence=evidence
    )


def base_url(url: str) -> str:
    """The server's root: the OpenAI base URL (`…/v1`) may be given."""
    return url.rstrip("/").removesuffix("/v1")


def identify(url: str, access: Access | None = None, override: str | None = None) -> ServerIdentity:
    """The kind of server at `url`: by host (hosted APIs), /v1/models' owner, the Server header, each
    kind's own probe, then /openapi.json's paths; else a generic OpenAI server. `override` (a kind's
    name, from --server-kind) is taken as it is, its version still asked for."""
    base, access = base_url(url), access or Access()
    table = kinds()
    if override is not None:
        try:
            chosen = kind(override)
        except KeyError as exc:
            raise InputError(f"--server-kind: {exc.args[0]}") from None
        probe = _get(base, chosen.detect.probe, access) if chosen.detect.probe else None
        return _identity(chosen, "--server-kind", probe)
    host = urlsplit(base).hostname or ""
    for candidate in table.values():
        if any(host == suffix or host.endswith(suffix) for suffix in candidate.detect.hosts):
            return _identity(candidate, f"host {host}")
    models = _get(base, "/v1/models", access)
    owner = _owned_by(models.body)
    for candidate in table.values():
        if owner is not None and owner == candidate.detect.owned_by:
            probe = _get(base, candidate.detect.probe, access) if candidate.detect.probe else None
            return _identity(candidate, f"/v1/models owned_by {owner!r}", probe)
    for candidate in table.values():
        header = candidate.detect.server_header
        if header and models.server.lower().startswith(header.lower()):
            probe = _get(base, candidate.detect.probe, access) if candidate.detect.probe else None
            return _identity(candidate, f"Server: {models.server}", probe)
    for candidate in table.values():
        if candidate.detect.probe and candidate.detect.marker:
            probe = _get(base, candidate.detect.probe, access)
            if _marked(probe.body, candidate.detect.marker):
                return _identity(candidate, f"GET {candidate.detect.probe}", probe)
    spec = _get(base, "/openapi.json", access).body
    paths = spec.get("paths") if isinstance(spec, dict) else None
    if isinstance(paths, dict):
        for candidate in table.values():
            wanted = candidate.detect.openapi_paths
            if wanted and all(p in paths for p in wanted):
                return _identity(candidate, f"/openapi.json lists {', '.join(wanted)}")
    return _identity(table[GENERIC], "no probe matched" if models.status is not None else NO_ANSWER)


def require_calibrating_server(url: str) -> ServerIdentity:
    """The server at `url` when it has what calibration reads (vLLM's /metrics and /tokenize, as the
    embedded target does); InputError (exit 2) naming what it is otherwise."""
    found = identify(url)
    if found.evidence == NO_ANSWER:
        raise InputError(f"{base_url(url)}/v1/models did not answer: no server to calibrate")
    if not kind(found.kind).calibrates:
        raise InputError(
            f"calibration needs vLLM's /metrics and /tokenize; {base_url(url)} is {found.name} (told by"
            f" {found.evidence})"
        )
    return found
