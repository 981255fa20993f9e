"""The conformance corpus (tests/conformance): every case's input, read by llmload, gives its right value."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import tests.conformance
from tests.conformance import Case

KINDS: tuple[ModuleType, ...] = tuple(
    importlib.import_module(f"tests.conformance.{info.name}")
    for info in pkgutil.iter_modules(tests.conformance.__path__)
)


@pytest.mark.parametrize(
    ("kind", "case"), [pytest.param(kind, case, id=f"{kind.KIND}/{case.id}") for kind in KINDS for case in kind.CASES]
)
def test_case(kind: ModuleType, case: Case, tmp_path: Path) -> None:
    kind.check(case, tmp_path)


def test_the_corpus_is_large_enough() -> None:
    """Issue 55: at least 40 cases, every one with a source, no id twice within a kind."""
    cases = [(kind.KIND, case) for kind in KINDS for case in kind.CASES]
    assert len(cases) >= 40
    assert all(case.source for _, case in cases)
    assert len({(k, c.id) for k, c in cases}) == len(cases)
