"""The package's layout keeps its promises: no import cycles between llmload's modules, and Locust
imported only by the Locust glue (the engine runs and is tested without it)."""

from __future__ import annotations

import ast
from pathlib import Path

import llmload

PACKAGE = Path(llmload.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Modules `path` imports at any depth (function-level imports are edges too), names resolved:
    `from llmload.x import y` is an edge to llmload.x.y when that is a module, else to llmload.x."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = {t for t in _imports(path) if t in modules and t != name}
        # a package's __init__ is imported on the way to any of its modules: an edge only when named
        graph[name] = {t for t in targets if not any(o.startswith(t + ".") and o in targets for o in targets)}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None (depth-first search, colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles() -> None:
    graph = _graph()
    assert len(graph) > 50, "the walk found llmload's modules"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_locust_glue_imports_locust() -> None:
    importers = sorted(
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        if any(name == "locust" or name.startswith("locust.") for name in _imports(path))
    )
    assert importers and all(name.startswith("llmload.locust") for name in importers), importers
