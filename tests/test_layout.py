"""The package's layout keeps its promises: no import cycles between llmload's modules, and Locust
imported only by the Locust glue (the engine runs and is tested without it)."""

from __future__ import annotations

import ast
import re
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


def _rooms() -> dict[Path, list[str]]:
    """Each package of llmload (a room) and the names of what it holds: modules and sub-rooms."""
    rooms = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        room = init.parent
        if room == PACKAGE:
            continue
        inside = [p.stem for p in room.glob("*.py") if p.stem not in ("__init__", "__main__")]
        inside += [p.name for p in room.iterdir() if (p / "__init__.py").exists()]
        rooms[room] = sorted(inside)
    return rooms


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def test_every_folder_of_python_is_a_room_whose_docstring_lists_its_modules() -> None:
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert folders == {PACKAGE, *_rooms()}, "a folder of modules without an __init__.py"
    for room, inside in _rooms().items():
        docstring = ast.get_docstring(ast.parse((room / "__init__.py").read_text(encoding="utf-8"))) or ""
        missing = [name for name in inside if not _named(name, docstring)]
        assert not missing, f"{room.relative_to(PACKAGE.parent)}/__init__.py does not name {missing}"


def test_the_architecture_room_table_names_every_room_and_its_modules() -> None:
    """docs/ARCHITECTURE.md's table is the map a newcomer reads: a room or module it does not name
    is a room nobody can find."""
    rows = [
        line.split("|")[1:3]
        for line in (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `")
    ]
    table = {name: what for first, what in rows for name in re.findall(r"`([\w./]+)`", first)}
    for module in PACKAGE.glob("*.py"):
        if module.stem not in ("__init__", "__main__"):
            assert f"{module.name}" in table, f"no row of the room table names llmload/{module.name}"
    for room, inside in _rooms().items():
        if room.parent != PACKAGE:
            continue  # a sub-room (workload/formats/) is named in its room's row
        row = table.get(f"{room.name}/")
        assert row is not None, f"no row of the room table names llmload/{room.name}/"
        missing = [name for name in inside if not _named(name, row)]
        assert not missing, f"the row of {room.name}/ does not name {missing}"
