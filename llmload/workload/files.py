"""Workload file v1: a YAML spec a person edits plus a JSONL file of sessions, loaded strictly."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml
from pydantic import ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import Session, WorkloadSpec
from llmload.workload.formats import log_format
from llmload.yamlfile import load_yaml_model


class WorkloadError(InputError):
    """A workload file that cannot be used; the message names the file, line and key."""


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    sessions: list[Session]
    path: Path

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def mean_turns(self) -> float:
        return self.requests / len(self.sessions)

    def content_sha256(self) -> str:
        """SHA-256 (hex) of the workload file's bytes and then its sessions file's, read in 1 MiB pieces:
        the same text sent gives the same digest, whatever the file is named or wherever it lies."""
        digest = hashlib.sha256()
        for path in (self.path, self.path.parent / self.spec.sessions):
            with path.open("rb") as handle:
                while piece := handle.read(1 << 20):
                    digest.update(piece)
        return digest.hexdigest()

    @property
    def asks_lengths(self) -> bool:
        """Some turn asks for an exact output length (the others carry max_tokens)."""
        return any(turn.output_tokens is not None for session in self.sessions for turn in session.turns)


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    try:
        spec = load_yaml_model(path, WorkloadSpec, WorkloadError)
    except WorkloadError:
        if path.is_file() and (fmt := log_format(path)) is not None:  # a request log given for its workload
            raise WorkloadError(
                f"{path}: this is {fmt.title}, not a workload: `llmload workload build {path} -o"
                f" {path.with_suffix('.yaml').name}` makes one"
            ) from None
        raise
    sessions_path = path.parent / spec.sessions
    sessions = list(_read_sessions(sessions_path, spec.block_size))
    if not sessions:
        raise WorkloadError(f"{sessions_path}: no sessions")
    return Workload(spec, sessions, path)


def _block_problem(session: Session, block_size: int | None) -> str | None:
    """Why a session's turns of blocks cannot be sent: no block size, or ids that do not cover the prompt."""
    for index, turn in enumerate(session.turns, start=1):
        if turn.blocks is None:
            continue
        if block_size is None:
            return f"turn {index} gives its prompt as blocks, and the workload's YAML names no block_size"
        full, needed = divmod(turn.prompt_tokens or 0, block_size)
        if len(turn.blocks) not in (full, full + (needed > 0)):
            return (
                f"turn {index} has {len(turn.blocks)} blocks for prompt_tokens {turn.prompt_tokens}"
                f" ({full + (needed > 0)} of {block_size} tokens, the last may be partial)"
            )
    return None


def _read_sessions(path: Path, block_size: int | None) -> Iterable[Session]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read sessions: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                session = Session.model_validate(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{number}: not valid JSON: {exc}") from None
            except ValidationError as exc:
                raise WorkloadError(f"{path}:{number}: {validation_message(exc)}") from None
            if (problem := _block_problem(session, block_size)) is not None:
                raise WorkloadError(f"{path}:{number}: {problem}")
            yield session


def save_workload(spec: WorkloadSpec, sessions: Iterable[Session], path: str | Path) -> Path:
    """Write the YAML spec and its sessions file (named by `spec.sessions`, beside it)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = (path.parent / spec.sessions).open("wb")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot write: {exc.strerror or exc}") from None
    with out:
        for session in sessions:
            out.write(orjson.dumps(session.model_dump(exclude_none=True)) + b"\n")
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return path
