"""The conformance corpus: inputs as real servers, gateways and vLLM write them, each with the value
llmload must read from it.

Every case is a small input made to reproduce one shape seen in the field (a public bug report, the
standard that defines the format, or the source of the program that writes it), the command that
reads it, and the right answer. One module per kind of input, each with its own `check`; the single
table-driven test, tests/test_conformance.py, runs them all. Adding a case is one row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Case:
    """One input and what must be read from it.

    `id` names the case in pytest's output; `source` says where the shape comes from (a tracker
    thread, a standard's section, a program's source file); `given` is the input (a stream's bytes,
    a log's text, an argument line); `expect` holds the right values, keyed as the kind's `check`
    reads them.
    """

    id: str
    source: str
    given: Any
    expect: dict[str, Any] = field(default_factory=dict)


class Kind(Protocol):
    """A module of the corpus: its name, its cases and how one is checked."""

    KIND: str
    CASES: list[Case]

    def check(self, case: Case, tmp_path: Path) -> None: ...
