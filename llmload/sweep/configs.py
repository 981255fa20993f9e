"""The configurations a sweep tries: a base `vllm serve --config` file and what varies, either the
product of `--vary KEY=V1,V2` or one file per configuration (`--configs`), each written in full to
its own directory and read back as vLLM would read it, so a misspelt key stops the sweep before
any server starts."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmload.errors import InputError
from llmload.models import ConfigValue
from llmload.server.serve_config import known_option, read_serve_config, yaml_text
from llmload.yamlfile import load_yaml_mapping

CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class SweepConfig:
    """One configuration: its name (and directory), what varies in it, and the whole YAML mapping."""

    name: str
    varied: dict[str, ConfigValue]
    settings: dict[str, Any]

    def write(self, directory: Path) -> Path:
        """The config file in `directory`, checked as vLLM reads it (InputError names file:line)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CONFIG_FILE
        path.write_text(yaml.safe_dump(self.settings, sort_keys=False), encoding="utf-8")
        read_serve_config(path)
        return path


def _mapping(path: Path) -> dict[str, Any]:
    loaded = load_yaml_mapping(path, "vLLM options")
    read_serve_config(path)  # its keys are vLLM's, named with file:line when not
    return loaded


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` over `base`, a key written with underscores replacing its dashed twin (and back); a
    None (YAML null) takes the key out: vLLM's own default, e.g. no speculative-config."""
    canonical = {k.replace("_", "-"): k for k in base}
    out = dict(base)
    for key, value in changes.items():
        out.pop(canonical.get(key.replace("_", "-"), key), None)
        if value is not None:
            out[key] = value
    return out


def _shown(value: Any) -> ConfigValue:
    """A varied value as the sweep's rows show it: a mapping (a speculative-config) as the JSON text vLLM
    receives; None: not set."""
    return yaml_text(value) if isinstance(value, dict) else value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "config"


def _vary(spec: str) -> tuple[str, list[Any]]:
    """KEY=V1,V2 or, for values with commas (a speculative-config), a YAML list: KEY=[{...}, null]."""
    key, sep, values = spec.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise InputError(f"--vary {spec!r}: give KEY=V1,V2,... (for example max-model-len=2048,8192)")
    name, _ = known_option(key.strip(), f"--vary {spec}")
    parsed = (
        _yaml_list(spec, values)
        if values.strip().startswith("[")
        else [yaml.safe_load(v.strip()) for v in values.split(",") if v.strip()]
    )
    if len(set(map(str, parsed))) != len(parsed):
        raise InputError(f"--vary {spec!r}: a value is given twice")
    return name, parsed


def _yaml_list(spec: str, values: str) -> list[Any]:
    try:
        parsed = yaml.safe_load(values)
    except yaml.YAMLError as exc:
        raise InputError(f"--vary {spec!r}: its values are not a YAML list: {exc}".replace("\n", " ")) from None
    if not isinstance(parsed, list) or not parsed:
        raise InputError(f"--vary {spec!r}: give the values as a YAML list, e.g. [2048, 8192]")
    return parsed


def expand(base: Path | None, vary: Sequence[str], configs: Sequence[Path]) -> list[SweepConfig]:
    """Every configuration to try, in order: the product of --vary, or each --configs file over the base."""
    if vary and configs:
        raise InputError("give either --vary or --configs, not both")
    settings = _mapping(base) if base is not None else {}
    if configs:
        files = [(path, _merged(settings, _mapping(path))) for path in configs]
        names = [_slug(path.stem) for path, _ in files]
        if len(set(names)) != len(names):
            raise InputError(f"--configs: two files share a name ({', '.join(names)}): each names a directory")
        differ = sorted(
            {k for _, s in files for k in s if len({repr(other.get(k)) for _, other in files}) > 1},
        )
        return [
            SweepConfig(name, {k: _shown(s.get(k)) for k in differ}, s)
            for name, (_, s) in zip(names, files, strict=True)
        ]
    axes = [_vary(spec) for spec in vary]
    if len({key for key, _ in axes}) != len(axes):
        raise InputError("--vary: a key is given twice; list its values in one --vary KEY=V1,V2")
    if not axes:
        if base is None:
            raise InputError("give --vllm-config with --vary KEY=V1,V2 or --configs A.yaml B.yaml")
        return [SweepConfig(_slug(base.stem), {}, settings)]
    out = []
    for values in itertools.product(*(values for _, values in axes)):
        chosen = {key: value for (key, _), value in zip(axes, values, strict=True)}
        varied = {key: _shown(value) for key, value in chosen.items()}
        name = "_".join(
            f"{_slug(key)}-{_slug('unset' if value is None else str(value))}" for key, value in varied.items()
        )
        out.append(SweepConfig(name, varied, _merged(settings, chosen)))
    return out
