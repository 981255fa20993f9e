"""Strict YAML files (workloads, thresholds, soak criteria, simulator profiles): one loader, one
error style, so a misspelt key is named the same way whichever file it is in."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from llmload.errors import InputError, validation_message

ModelT = TypeVar("ModelT", bound=BaseModel)


def load_yaml_model(path: Path, model: type[ModelT], error: type[InputError] = InputError) -> ModelT:
    """`model` from the YAML mapping in `path`; any problem raises `error` naming the file (and key)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a YAML mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{path}: {validation_message(exc)}") from None
