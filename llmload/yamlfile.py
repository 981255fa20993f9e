"""Strict YAML files (workloads, thresholds, soak criteria, simulator profiles, fault files, vLLM
configs): one reader, one error style, so a misspelt key is named the same way whichever file it is in."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from llmload.errors import InputError, validation_message

ModelT = TypeVar("ModelT", bound=BaseModel)


def yaml_entries(path: Path, what: str = "keys", error: type[InputError] = InputError) -> list[tuple[str, Any, int]]:
    """The key, value and 1-based line of each entry of the YAML mapping in `path` (an empty file has
    none); a file that cannot be read, is not YAML or is not a mapping of `what` raises `error`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return []
        if not isinstance(root, yaml.MappingNode):
            raise error(f"{path}: expected a mapping of {what}, got a {root.tag.rsplit(':', 1)[-1]}")
        loader.flatten_mapping(root)  # `<<: *anchor` merges, as yaml.safe_load reads them
        return [
            (str(loader.construct_object(key, deep=True)), loader.construct_object(value, deep=True),
             key.start_mark.line + 1)
            for key, value in root.value
        ]  # fmt: skip
    except yaml.YAMLError as exc:
        raise error(f"{_where(path, exc)}: not valid YAML: {_problem(exc)}") from None
    finally:
        loader.dispose()


def _where(path: Path, exc: yaml.YAMLError) -> str:
    """`file:line:column` of a YAML error, where the parser says."""
    mark = getattr(exc, "problem_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def _problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint in one line (its own message spans several, with the text quoted)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [exc.context, exc.problem]
        return ": ".join(part for part in parts if part) or str(exc).splitlines()[0]
    return str(exc).splitlines()[0]


def load_yaml_mapping(path: Path, what: str = "keys", error: type[InputError] = InputError) -> dict[str, Any]:
    """The YAML mapping in `path` (empty: {}), refused as `yaml_entries` refuses it."""
    return {key: value for key, value, _ in yaml_entries(path, what, error)}


def load_yaml_model(path: Path, model: type[ModelT], error: type[InputError] = InputError) -> ModelT:
    """`model` from the YAML mapping in `path`; any problem raises `error` naming the file, the line
    of the key at fault and, for an unknown key, the closest known one."""
    entries = yaml_entries(path, error=error)
    if not entries and any(field.is_required() for field in model.model_fields.values()):
        raise error(f"{path}: empty")
    try:
        return model.model_validate({key: value for key, value, _ in entries})
    except ValidationError as exc:
        lines = {key: line for key, _, line in entries}
        first = exc.errors()[0]["loc"]
        key = str(first[0]) if first else ""
        where = f"{path}:{lines[key]}" if key in lines else str(path)
        message = validation_message(exc)
        unknown = next((err["loc"] for err in exc.errors() if err["type"] == "extra_forbidden"), None)
        known = _known_keys(model, unknown[:-1]) if unknown else None
        if unknown and known:
            hint = difflib.get_close_matches(str(unknown[-1]), known, n=1, cutoff=0.6)
            within = "".join(f"{part}." for part in unknown[:-1])  # the path as the message gives it
            message += f"; did you mean {within}{hint[0]}?" if hint else f" (known: {', '.join(known)})"
        raise error(f"{where}: {message}") from None


def _known_keys(model: type[BaseModel], path: tuple[int | str, ...]) -> list[str] | None:
    """The keys the model nested at `path` (list indexes skipped) knows; None where that is no model."""
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (`X`, `X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _model_in(arg)) is not None), None)
