"""The replicas a run spreads its sessions over: `--host URL,URL` or `--host @FILE` (one URL a line).

Prefix caches are per replica, so every turn of a session goes to the same one, drawn by
`session_split.pick` with equal shares; a router that keeps sessions on a replica by a header gets the
session's id in `--session-header NAME`. The first replica is the run's `host`: its server kind and model
list stand for all of them; the observer scrapes every replica's /metrics (llmload.observe.scraper).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from llmload.errors import InputError
from llmload.session_split import pick


def _check_url(url: str, where: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError(f"{where} {url} is not a URL: give http://HOST:PORT (or https://)")
    return url.rstrip("/")


def _read_hosts_file(name: str) -> list[str]:
    path = Path(name)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"--host @{name}: {exc.strerror or exc}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            hosts.append(_check_url(text, f"--host @{name} line {number}:"))
    if not hosts:
        raise InputError(f"--host @{name}: no URL in it (one a line, # starts a comment)")
    return hosts


@dataclass(frozen=True)
class Replicas:
    hosts: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.hosts or len(set(self.hosts)) < len(self.hosts):
            raise InputError(f"--host: each replica once, at least one (given: {', '.join(self.hosts) or 'none'})")

    @classmethod
    def parse(cls, text: str) -> Replicas:
        """`URL`, `URL,URL,...` or `@FILE`."""
        text = text.strip()
        if text.startswith("@"):
            return cls(tuple(_read_hosts_file(text[1:])))
        return cls(tuple(_check_url(part.strip(), "--host") for part in text.split(",") if part.strip()))

    @property
    def primary(self) -> str:
        return self.hosts[0]

    def for_session(self, session_id: str) -> str:
        return self.hosts[pick(session_id, "replica", [1.0] * len(self.hosts))]
