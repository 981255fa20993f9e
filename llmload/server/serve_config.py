"""Read a `vllm serve` configuration the way vLLM does: a YAML file, a command line, or both.

vLLM turns each YAML key into `--key value` (underscores read as dashes, `true` as the bare flag,
`false` as `--no-key` where that exists, lists as several values) and puts them before the
command line's own arguments, so the command line wins. A key vLLM does not know stops vLLM at
startup; here it is an InputError naming the file, the line and the closest known key.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import ConfigValue, ServeConfig
from llmload.server.vllm_options import REMOVED, Option, read_value, vllm_options
from llmload.yamlfile import yaml_entries

COMMAND_LINE = "--vllm-args"
# What may stand before the options: `vllm serve [MODEL]` or `python -m vllm.entrypoints...`.
_LAUNCHERS = ("vllm", "serve")


@dataclass(frozen=True)
class _Setting:
    """One key as vLLM's parser would see it: its option name, the raw text(s), where it was set."""

    name: str
    option: Option
    raw: str | bool | list[str]
    origin: str


def known_option(key: str, origin: str) -> tuple[str, Option]:
    """The option a key names (dashes or underscores), or an InputError naming `origin` and the closest key."""
    options = vllm_options()
    found = options.lookup(key)
    if found is not None:
        return found
    name = key.lstrip("-").replace("_", "-")
    if name in REMOVED:
        raise InputError(f"{origin}: {name}: {REMOVED[name]}")
    hint = options.closest(key)
    suggestion = f"; did you mean {hint}?" if hint else ""
    raise InputError(
        f"{origin}: {name}: vLLM {options.vllm_version} does not know this key and would refuse to start{suggestion}"
    )


def yaml_text(value: object) -> str | bool | list[str]:
    """What vLLM's load_config_file passes to argparse for a YAML value."""
    if isinstance(value, bool):
        return value
    if isinstance(value, list):
        return [str(item) for item in value]
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _file_settings(path: Path) -> Iterator[_Setting]:
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(f"{path}: vLLM reads only .yaml/.yml config files")
    for key, value, line in yaml_entries(path, "vLLM options"):
        origin = f"{path}:{line}"
        name, option = known_option(key, origin)
        yield _Setting(name, option, yaml_text(value), origin)


def _split_command_line(command_line: str) -> tuple[list[str], str | None]:
    """The options of a `vllm serve` command line, and its positional model if any."""
    try:
        tokens = shlex.split(command_line)
    except ValueError as exc:
        raise InputError(f"{COMMAND_LINE}: cannot split {command_line!r}: {exc}") from None
    if tokens and (tokens[0].endswith("python") or "python3" in tokens[0]) and tokens[1:2] == ["-m"]:
        tokens = tokens[3:]  # python -m vllm.entrypoints.openai.api_server ...
    while tokens and tokens[0].rsplit("/", 1)[-1] in _LAUNCHERS:
        tokens = tokens[1:]
    if tokens and not tokens[0].startswith("-"):
        return tokens[1:], tokens[0]
    return tokens, None


def _command_line_settings(tokens: list[str], origin: str = COMMAND_LINE) -> Iterator[_Setting]:
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-") or token == "-":
            raise InputError(f"{origin}: unexpected argument {token!r} (vLLM would refuse it)")
        key, has_value, inline = token.partition("=")
        negated = key.startswith("--no-") and vllm_options().lookup(key[5:]) is not None
        name, option = known_option(key[5:] if negated else key, origin)
        if option.is_switch:
            if has_value:
                raise InputError(f"{origin}: {key} takes no value")
            yield _Setting(name, option, not negated, origin)
            continue
        if has_value:
            yield _Setting(name, option, inline, origin)
            continue
        values = []
        while i < len(tokens) and not (tokens[i].startswith("-") and len(tokens[i]) > 1 and not _number(tokens[i])):
            values.append(tokens[i])
            i += 1
            if option.nargs not in ("+", "*"):
                break
        if not values:
            raise InputError(f"{origin}: {key} expects a value")
        yield _Setting(name, option, values if option.nargs in ("+", "*") else values[0], origin)


def _number(token: str) -> bool:
    """`-1` is a value (max-model-len -1 = auto), not an option."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def _value(setting: _Setting) -> ConfigValue:
    """The setting's value as vLLM reads it; InputError naming where it was set when vLLM would refuse it."""
    option, raw = setting.option, setting.raw
    if isinstance(raw, bool):
        if not option.is_switch:
            raise InputError(f"{setting.origin}: {setting.name} expects a value, not {str(raw).lower()}")
        return raw
    if option.is_switch:
        raise InputError(f"{setting.origin}: {setting.name} is a switch: true or false, not {raw!r}")
    try:
        if isinstance(raw, list):
            if option.nargs not in ("+", "*"):
                raise ValueError("takes one value, not a list")
            return [str(read_value(option, item)) for item in raw]
        value = read_value(option, raw)
    except ValueError as exc:
        raise InputError(f"{setting.origin}: {setting.name}: {exc}") from None
    return value if value is None or isinstance(value, str | int | float) else str(value)


def _settings(path: Path | None, command_line: str | None, flags: Sequence[Sequence[str]]) -> Iterator[_Setting]:
    """The file's settings, then the command line's (a `--config FILE` in it is read in its place), then
    the flags of llmload's own command, each one named where it is refused."""
    tokens, model = _split_command_line(command_line) if command_line else ([], None)
    if "--config" in tokens:
        at = tokens.index("--config")
        if path is not None or at + 1 >= len(tokens):
            raise InputError(f"{COMMAND_LINE}: give one config file, either --vllm-config or --config in the args")
        path = Path(tokens[at + 1])
        tokens = tokens[:at] + tokens[at + 2 :]
    if path is not None:
        yield from _file_settings(path)
    if model is not None:
        yield _Setting("model", vllm_options().options["model"], model, COMMAND_LINE)
    yield from _command_line_settings(tokens)
    for flag in flags:
        yield from _command_line_settings(list(flag), origin=flag[0])


def read_serve_config(
    path: Path | None = None, command_line: str | None = None, flags: Sequence[Sequence[str]] = ()
) -> ServeConfig:
    """A `vllm serve --config FILE`, a `vllm serve ...` command line and llmload's own setting flags
    (`["--max-num-seqs", "8"]`, serve_config.arguments), as vLLM would read them, the later winning."""
    modelled = set(ServeConfig.model_fields) - {"not_modelled", "origins"}
    values: dict[str, ConfigValue] = {}
    not_modelled: dict[str, ConfigValue] = {}
    origins: dict[str, str] = {}
    for setting in _settings(path, command_line, flags):
        if setting.raw is False and setting.option.type == "switch":
            continue  # vLLM drops `key: false` for a flag with no --no- form
        value = _value(setting)
        dest = setting.option.dest
        if dest == "served_model_name" and isinstance(value, list):
            value = value[0] if value else None
        if dest in modelled:
            values[dest] = value
        else:
            not_modelled[setting.name] = value
        origins[dest if dest in modelled else setting.name] = setting.origin
    try:
        return ServeConfig.model_validate({**values, "not_modelled": not_modelled, "origins": origins})
    except ValidationError as exc:
        where = {err["loc"][0] for err in exc.errors() if err["loc"]}
        places = ", ".join(f"{origins[w]}" for w in sorted(map(str, where)) if w in origins)
        raise InputError(f"{places or 'vllm config'}: {validation_message(exc)}") from None
