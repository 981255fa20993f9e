"""Read a `vllm serve` configuration the way vLLM 0.32 does: a YAML file, a command line, or both.

The arguments go through the steps of vLLM's FlexibleArgumentParser.parse_args
(vllm/utils/argparse_utils.py), then through argparse itself, rebuilt from the captured option
table (VllmOptions.parser), so what vLLM accepts is accepted with the same values and what it
refuses is refused, named by file:line or the flag it came from:

- `vllm serve`: a `--model M` anywhere is moved to the positional model, which wins; a
  `--served-model-name` with neither a positional model nor `--config` is refused.
- `--config FILE` (only that exact word; `--config=FILE` only sets `config`, as in vLLM; twice is
  refused): the file's keys become `--key value` (a list: several values, a mapping: its JSON, `true`:
  the bare flag, `false`: `--no-key` where the parser has that option string, else nothing; an empty
  list: nothing), put after the positional model and before the rest of the command line, which
  therefore wins. `vllm serve` looks `--no-key` up in its top-level parser, which has none, so there
  every `false` is dropped; `python -m vllm.entrypoints.openai.api_server` (and a bare option
  list, and --vllm-config alone) honours it for dashed keys. `vllm serve` needs a model, positional
  or in the file.
- Underscores in `--names` read as dashes (up to the first `.`), `-O3`/`-O=3`/`-O 3` are
  `--optimization-level 3`, and `--json-option.key value` (`.key+ a,b`: a list) builds a JSON object
  passed last: a JSON value, else a human-readable int, else text.
- argparse: unique prefixes of long options (`--max-model 4096`), `--key=value`, the last of a
  repeated option winning, nargs lists ending at the next option, types and choices.

llmload's own setting flags (`--max-num-seqs 8` of `llmload capacity`) come after everything and win.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import ConfigValue, ServeConfig
from llmload.server.vllm_options import (
    ORIGIN,
    ORIGIN_OPTION,
    Option,
    Refused,
    human_readable_int,
    unknown_key,
    vllm_options,
)
from llmload.yamlfile import yaml_entries

COMMAND_LINE = "--vllm-args"
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.launchers.api_server.entry")


@dataclass(frozen=True)
class _Arg:
    """One argument as vLLM's parser sees it, and where it was given (FILE:LINE or the flag)."""

    text: str
    origin: str


def known_option(key: str, origin: str) -> tuple[str, Option]:
    """The option a key names exactly (dashes or underscores, or an alias), or an InputError naming
    `origin` and the closest key."""
    found = vllm_options().lookup(key)
    if found is None:
        raise unknown_key(key, origin)
    return found


def yaml_text(value: object) -> str | bool | list[str]:
    """What vLLM's load_config_file passes to argparse for a YAML value: a bool as the flag, a list
    as its items' text, a mapping as its JSON, anything else as Python's str()."""
    if isinstance(value, bool):
        return value
    if isinstance(value, list):
        return [str(item) for item in value]
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _runs_vllm_serve(tokens: Sequence[str]) -> bool:
    """Whether a split command line is `vllm serve ...` (or `serve ...`, the launcher left out)."""
    return tokens[:1] == ["serve"] or (
        bool(tokens) and tokens[0].rsplit("/", 1)[-1] == "vllm" and tokens[1:2] == ["serve"]
    )


def serve_launcher(command: str) -> str | None:
    """ "vllm serve" when a server command (a sweep's --serve template) starts vLLM through its CLI,
    whose reading of a --config file differs from the api_server's (it drops every `key: false`), to
    be given to read_serve_config as its command line; None for any other command."""
    try:
        return "vllm serve" if _runs_vllm_serve(shlex.split(command)) else None
    except ValueError:
        return None


def _launcher(command_line: str | None) -> tuple[bool, list[str]]:
    """Whether a command line runs `vllm serve` (else the api_server module, whose reading a bare
    option list gets too), and its arguments after the launcher."""
    if command_line is None:
        return False, []
    try:
        tokens = shlex.split(command_line)
    except ValueError as exc:
        raise InputError(f"{COMMAND_LINE}: cannot split {command_line!r}: {exc}") from None
    if _runs_vllm_serve(tokens):
        return True, tokens[tokens.index("serve") + 1 :]
    if len(tokens) >= 3 and "python" in tokens[0].rsplit("/", 1)[-1] and tokens[1] == "-m":
        if tokens[2] not in _API_SERVER_MODULES:
            raise InputError(f"{COMMAND_LINE}: {tokens[2]} is not vLLM's server; give `vllm serve ...`")
        return False, tokens[3:]
    return False, tokens


def _config_args(path: Path, origin: str, serve: bool) -> list[_Arg]:
    """vLLM's load_config_file: the file's keys as arguments, each named by its file:line."""
    extension = str(path).split(".")[-1]
    if extension not in ("yaml", "yml"):
        raise InputError(f"{origin}: {path}: vLLM reads only .yaml/.yml config files, not .{extension}")
    entries: dict[str, tuple[Any, int]] = {}
    for key, value, line in yaml_entries(path, "vLLM options"):
        entries[key] = (value, line)  # as yaml.safe_load: a repeated key keeps its place, takes the last value
    if not entries:
        raise InputError(f"{path}: empty; vLLM cannot read a config file with no keys")
    no_forms = set() if serve else {f"--no-{name}" for name, o in vllm_options().options.items() if o.type == "bool"}
    args: list[_Arg] = []
    for key, (value, line) in entries.items():
        where, text = f"{path}:{line}", yaml_text(value)
        if text is True:
            args.append(_Arg(f"--{key}", where))
        elif text is False:
            args += [_Arg(f"--no-{key}", where)] if f"--no-{key}" in no_forms else []
        elif isinstance(text, list):
            args += [_Arg(f"--{key}", where), *(_Arg(item, where) for item in text)] if text else []
        else:
            args += [_Arg(f"--{key}", where), _Arg(text, where)]
    return args


def _refuse(arg: _Arg | None, message: str) -> InputError:
    return InputError(f"{arg.origin if arg else COMMAND_LINE}: {message}")


def _with_config(args: list[_Arg], serve: bool) -> list[_Arg]:
    """vLLM's `serve` model handling and _pull_args_from_config: the file's arguments in their place."""
    if serve:
        at = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a.text)), None)
        if at is not None:
            if args[at].text == "--model" and at + 1 >= len(args):
                raise _refuse(args[at], "--model expects a value (vLLM fails with an IndexError)")
            model, rest = (args[at + 1], at + 2) if args[at].text == "--model" else (args[at], at + 1)
            args = [_Arg(model.text.removeprefix("--model="), model.origin), *args[:at], *args[rest:]]
        texts = [a.text for a in args]
        if (
            args and args[0].text.startswith("-")
            and not any(re.match(r"^--config(=.+|$)", t) for t in texts)
            and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", t) for t in texts)
        ):  # fmt: skip
            raise _refuse(
                args[0], "with `vllm serve`, --served-model-name needs the model as the first positional argument"
            )
    texts = [a.text for a in args]
    if "--config" not in texts:
        return args
    at = texts.index("--config")
    if texts.count("--config") > 1:
        raise _refuse(args[at], "vLLM reads one config file: --config is given twice (or with --vllm-config)")
    if at == len(args) - 1:
        raise _refuse(args[at], "--config expects a file")
    config = _config_args(Path(args[at + 1].text), args[at + 1].origin, serve)
    model_first = bool(args) and not args[0].text.startswith("-")
    if serve and not model_first and "--model" not in (a.text for a in config):
        raise _refuse(args[at], "`vllm serve` needs a model: give it first (vllm serve MODEL) or as model: in the file")
    head = args[:1] if model_first else []
    return [*head, *config, *args[len(head) : at], *args[at + 2 :]]


def _dashed(text: str) -> str:
    """Underscores as dashes in an option's name, up to its first `.` (not in its `=value`)."""
    key, eq, value = text.partition("=")
    name, dot, rest = key[2:].partition(".")
    return f"--{name.replace('_', '-')}{dot}{rest}{eq}{value}"


def _spelled(args: list[_Arg]) -> list[_Arg]:
    """vLLM's rewriting of each argument: dashes for underscores, `-O3` as --optimization-level 3."""
    out: list[_Arg] = []
    for i, arg in enumerate(args):
        text = arg.text
        if text.startswith("--help="):
            out.append(_Arg("--help", arg.origin))
        elif text.startswith("--"):
            out.append(_Arg(_dashed(text), arg.origin))
        elif text.startswith("-O") and text != "-O":
            level = text[3:] if text[2] == "=" else text[2:]
            out += [_Arg("--optimization-level", arg.origin), _Arg(level, arg.origin)]
        elif text == "-O" and i + 1 < len(args) and args[i + 1].text in ("0", "1", "2", "3"):
            out.append(_Arg("--optimization-level", arg.origin))
        else:
            out.append(arg)
    return out


def _dot_value(text: str) -> object:
    """A `--json-option.key` value: JSON, else a human-readable int (`80g`), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return human_readable_int(text)
    except ValueError:  # argparse.ArgumentTypeError is one
        return text


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's recursive_dict_update: objects merge, lists extend, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] += value
        else:
            into[key] = value


def _dotted(args: list[_Arg]) -> list[_Arg]:
    """`--json-option.a.b value` arguments gathered into one `--json-option '{"a": {"b": value}}'` each,
    passed after all others (so it replaces a whole JSON value given the plain way)."""
    kept: list[_Arg] = []
    objects: dict[str, tuple[dict[str, Any], str]] = {}
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        text = arg.text
        if not text.startswith("-") or "." not in text:
            kept.append(arg)
            continue
        if "=" in text:
            text, value = text.split("=", 1)
            if "." not in text:  # the dot was in the value
                kept.append(arg)
                continue
        elif i + 1 < len(args):
            value, skip = args[i + 1].text, True
        else:
            raise _refuse(arg, f"{text} expects a value (vLLM fails with an IndexError)")
        if text.endswith("+"):
            text, value = text[:-1], json.dumps(value.split(","))
        name, *keys = text.split(".")
        nested: Any = _dot_value(value)
        for key in reversed(keys):
            nested = {key: nested}
        merged = objects.get(name, ({}, ""))[0]
        _merge(merged, nested)
        objects[name] = (merged, arg.origin)  # named where last given
    for name, (whole, origin) in objects.items():
        kept += [_Arg(name, origin), _Arg(json.dumps(whole), origin)]
    return kept


def _is_option(text: str) -> bool:
    """An argument argparse surely takes for an option (not a value such as -1 or a text with spaces)."""
    return re.match(r"^--?[A-Za-z]", text) is not None and " " not in text.partition("=")[0]


def _marked(args: list[_Arg]) -> list[str]:
    """The arguments with the hidden ORIGIN_OPTION before an option whose origin differs from the last:
    it only ever stands before another option, so argparse splits the arguments as without it."""
    out: list[str] = []
    current = None
    for i, arg in enumerate(args):
        if arg.text == "--":  # argparse reads all that follows as positional
            return [*out, *(a.text for a in args[i:])]
        if arg.origin != current and _is_option(arg.text):
            out.append(f"{ORIGIN_OPTION}={arg.origin}")
            current = arg.origin
        out.append(arg.text)
    return out


class _Namespace(argparse.Namespace):
    """argparse's namespace, remembering where each value was set (the last ORIGIN_OPTION before it)."""

    values: dict[str, object]
    origins: dict[str, str | None]
    current: str | None

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["values"] = {}
        self.__dict__["origins"] = {}
        self.__dict__["current"] = None

    def __setattr__(self, dest: str, value: object) -> None:
        if dest == ORIGIN:
            self.__dict__["current"] = value
        else:
            self.values[dest] = value
            self.origins[dest] = self.current

    def __getattr__(self, dest: str) -> object:
        try:
            return self.__dict__["values"][dest]
        except KeyError:
            raise AttributeError(dest) from None

    def __contains__(self, dest: object) -> bool:
        return dest in self.values


def _where(args: list[_Arg], text: str) -> _Arg | None:
    return next((a for a in args if a.text == text or a.text.partition("=")[0] == text), None)


def _parse(args: list[_Arg]) -> _Namespace:
    """argparse's reading of the final arguments; InputError naming where a refused one was given."""
    namespace = _Namespace()
    try:
        _, extras = vllm_options().parser().parse_known_args(_marked(args), namespace)
    except Refused as exc:
        message = str(exc)
        named = re.search(r"option: (\S+)", message)
        culprit = _where(args, named.group(1)) if named else None
        raise InputError(f"{culprit.origin if culprit else namespace.current or COMMAND_LINE}: {message}") from None
    for extra in extras:
        arg = _where(args, extra)
        if extra.startswith("-") and extra.strip("-"):
            raise unknown_key(extra.partition("=")[0], arg.origin if arg else COMMAND_LINE)
        raise _refuse(arg, f"unexpected argument {extra!r} (vLLM would refuse it)")
    if "help" in namespace:
        raise _refuse(_where(args, "--help"), "--help: vLLM would print its help and exit, not serve")
    return namespace


def _config_value(value: object) -> ConfigValue:
    """A parsed value as ServeConfig holds it: a JSON object as its text, list items as text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list):
        return [item if isinstance(item, str) else json.dumps(item) for item in value]
    return json.dumps(value)


def read_serve_config(
    path: Path | None = None, command_line: str | None = None, flags: Sequence[Sequence[str]] = ()
) -> ServeConfig:
    """A `vllm serve --config FILE` (`path`), a `vllm serve ...` or api_server command line and
    llmload's own setting flags (`["--max-num-seqs", "8"]`, serve_config.arguments), read as vLLM
    reads them (the module docstring), the later winning. Raises InputError, naming FILE:LINE or the
    flag, where vLLM would refuse to start."""
    serve, tokens = _launcher(command_line)
    args = [_Arg(token, COMMAND_LINE) for token in tokens]
    if path is not None:
        args += [_Arg("--config", "--vllm-config"), _Arg(str(path), "--vllm-config")]
    args = _dotted(_spelled(_with_config(args, serve)))
    args += [_Arg(token, flag[0]) for flag in flags for token in flag]
    parsed = _parse(args)
    if serve and parsed.values.get("model_tag") is not None:
        parsed.values["model"], parsed.origins["model"] = parsed.values["model_tag"], parsed.origins["model_tag"]
        del parsed.values["model_tag"]  # vllm/entrypoints/cli/serve.py ServeSubcommand.cmd
    modelled = set(ServeConfig.model_fields) - {"not_modelled", "origins"}
    names = vllm_options().names()
    values: dict[str, ConfigValue] = {}
    not_modelled: dict[str, ConfigValue] = {}
    origins: dict[str, str] = {}
    for dest, given in parsed.values.items():
        key = dest if dest in modelled else names.get(dest, dest)  # model_tag: the api_server ignores it
        first = given[0] if dest == "served_model_name" and isinstance(given, list) and given else given
        (values if dest in modelled else not_modelled)[key] = _config_value(first)
        origins[key] = parsed.origins[dest] or COMMAND_LINE
    try:
        return ServeConfig.model_validate({**values, "not_modelled": not_modelled, "origins": origins})
    except ValidationError as exc:
        where = {err["loc"][0] for err in exc.errors() if err["loc"]}
        places = ", ".join(f"{origins[w]}" for w in sorted(map(str, where)) if w in origins)
        raise InputError(f"{places or 'vllm config'}: {validation_message(exc)}") from None
