"""The options `vllm serve` accepts, from a capture of the vLLM llmload is tested against.

The capture (``vllm-0.32.0.json``, written by ``capture.py`` inside vLLM's own environment) holds
every option with how argparse reads it: its spellings, its action (a `--[no-]` bool, a bare
switch, a value or several), the reader of its values, its choices and, for a JSON option typed by a
config dataclass, that dataclass's keys. `VllmOptions.parser()` rebuilds vLLM's argparse parser from
it, so a command line is split, abbreviated, typed and refused by argparse itself, as in vLLM.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import NoReturn

from pydantic import BaseModel

from llmload.errors import InputError

VLLM_VERSION = "0.32.0"
CAPTURE = Path(__file__).with_name(f"vllm-{VLLM_VERSION}.json")
ORIGIN = "_llmload_origin"  # dest of the hidden option that says where the following arguments come from
ORIGIN_OPTION = "--\0origin"  # no shell word can spell it, so no user argument abbreviates to it

# Keys users carry over from older vLLM releases, with why vLLM 0.32 refuses them.
REMOVED = {
    "swap-space": "the V1 engine preempts by recomputing, with no CPU swap space; vLLM 0.32 refuses the key",
}


class Option(BaseModel):
    """One option as vLLM's argparse parser declares it (capture.py): `type` is "bool" (`--x`/`--no-x`),
    "switch" (`--x` alone) or the name of the reader of its values, "optional " first when "" and
    "None" read as None; `const` is what a bare `--x` gives when a value is optional (`nargs` "?");
    `fields` are the keys of the config dataclass a JSON value must fit."""

    dest: str
    type: str
    nargs: str | None = None
    choices: list[str] | None = None
    default: object = None
    const: object = None
    fields: list[str] | None = None

    @property
    def is_switch(self) -> bool:
        """Takes no value: `--flag` alone (bool options also have a `--no-` form)."""
        return self.type in ("bool", "switch")


class Refused(Exception):
    """argparse's refusal of an argument list, in argparse's words (vLLM prints the same and exits 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refused(message)


class _Choices(list[str]):
    """Captured choices (text) that also hold a typed value whose text is one (`--max-lora-rank 16`)."""

    def __contains__(self, value: object) -> bool:
        return super().__contains__(str(value))


class VllmOptions(BaseModel):
    vllm_version: str
    options: dict[str, Option]
    aliases: dict[str, str]

    def lookup(self, key: str) -> tuple[str, Option] | None:
        """The option a config key or flag names (underscores as dashes, as vLLM reads them)."""
        name = key.lstrip("-")
        name = self.aliases.get(name, name.replace("_", "-"))
        option = self.options.get(name)
        return None if option is None else (name, option)

    def closest(self, key: str) -> str | None:
        found = difflib.get_close_matches(key.lstrip("-").replace("_", "-"), list(self.options), n=1, cutoff=0.6)
        return found[0] if found else None

    def spellings(self, name: str) -> list[str]:
        """`--name` and its aliases as typed: `-tp`, and `--alias` for dashed ones (`--device-memory-utilization`)."""
        aliases = [a for a, target in self.aliases.items() if target == name]
        return [f"--{name}", *(f"--{a}" if "-" in a else f"-{a}" for a in aliases)]

    def names(self) -> dict[str, str]:
        """dest → option name (`max_num_seqs` → `max-num-seqs`)."""
        return {option.dest: name for name, option in self.options.items()}

    def parser(self) -> argparse.ArgumentParser:
        """vLLM's `vllm serve` parser rebuilt: the positional `model_tag`, every option with its spellings,
        no defaults (the namespace holds only what was given), `--help` as an option (vLLM would print
        help and exit) and the hidden ORIGIN_OPTION. Its `error` raises Refused."""
        parser = _Parser(prog="vllm serve", add_help=False, argument_default=argparse.SUPPRESS)
        parser.add_argument("model_tag", nargs="?")
        parser.add_argument("-h", "--help", action="store_true")
        parser.add_argument(ORIGIN_OPTION, dest=ORIGIN)
        for name, option in self.options.items():
            spellings = self.spellings(name)
            if option.type == "bool":
                parser.add_argument(*spellings, dest=option.dest, action=argparse.BooleanOptionalAction)
            elif option.type == "switch":
                parser.add_argument(*spellings, dest=option.dest, action="store_true")
            else:
                parser.add_argument(
                    *spellings,
                    dest=option.dest,
                    type=reader(name, option),
                    nargs=option.nargs,
                    const=option.const,
                    choices=None if option.choices is None else _Choices(option.choices),
                )
        return parser


@cache
def vllm_options() -> VllmOptions:
    return VllmOptions.model_validate(json.loads(CAPTURE.read_text(encoding="utf-8")))


_SUFFIX = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """vLLM's reading of sizes (vllm/utils/argparse_utils.py human_readable_int): `25.6k` = 25,600
    (decimal), `64M` = 64 × 2**20 (binary, whole numbers only: ArgumentTypeError), else Python's int
    (ValueError)."""
    match = _SUFFIX.fullmatch(text.strip())
    if match is None:
        return int(text.strip())
    number, suffix = match.groups()
    if suffix in _BINARY:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            )
        return int(number) * _BINARY[suffix]
    return int(float(number) * _DECIMAL[suffix])


def human_readable_int_or_auto(text: str) -> int:
    """human_readable_int, or -1 for `-1` and `auto` (any case): vLLM fits the longest that fits."""
    return -1 if text.strip() in ("-1",) or text.strip().lower() == "auto" else human_readable_int(text)


def _expand_numbers(text: str) -> str:
    """Bare `80g`, `8K` outside JSON strings as whole numbers (vllm/engine/arg_utils.py
    _expand_json_human_readable_numbers), as vLLM does before reading a config dataclass."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b", lambda m: str(human_readable_int(m.group())), parts[i])
    return "".join(parts)


def _dataclass_reader(name: str, fields: list[str]) -> Callable[[str], object]:
    """A config dataclass's JSON (vLLM validates it with pydantic): an object of its keys."""

    def parse_dataclass(text: str) -> object:
        try:
            value = json.loads(_expand_numbers(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{text!r}: --{name} takes a JSON object")
        for key in value:
            if key not in fields:
                hint = difflib.get_close_matches(key, fields, n=1)
                raise argparse.ArgumentTypeError(
                    f"{key!r} is not a key of --{name}" + (f"; did you mean {hint[0]!r}?" if hint else "")
                )
        return value

    return parse_dataclass


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Value {text} cannot be converted to JSON.") from None


def _dict_or_str(text: str) -> object:
    """vllm/engine/arg_utils.py union_dict_and_str: JSON when it looks like an object, else the text."""
    return _loads(text) if re.match(r"(?s)^\s*{.*}\s*$", text) else text


def _comma_list(text: str) -> list[int | str]:
    """`--device-ids "2,3"`: its inline reader's list, numbers as ints."""
    return [int(part) if part.isdigit() else part for part in (p.strip() for p in text.split(","))]


_READERS: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "str": str,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "loads": _loads,
    "union_dict_and_str": _dict_or_str,
    "comma_list": _comma_list,
    "lower_snake": lambda text: text.lower().replace("-", "_"),
}


def reader(name: str, option: Option) -> Callable[[str], object]:
    """The function argparse reads a value of `--name` with (named as vLLM's, for argparse's messages);
    it raises ValueError or argparse.ArgumentTypeError where vLLM's would."""
    kind = option.type.removeprefix("optional ")
    read = _dataclass_reader(name, option.fields or []) if kind == "parse_dataclass" else _READERS.get(kind, str)
    if not option.type.startswith("optional "):
        return read

    def optional_type(text: str) -> object:
        if text in ("", "None"):
            return None
        try:
            return read(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"Value {text} cannot be converted to {kind}.") from None

    return optional_type


def unknown_key(key: str, origin: str) -> InputError:
    """The refusal of a key vLLM does not know: why it was removed, or the closest known key."""
    options = vllm_options()
    name = key.lstrip("-").replace("_", "-")
    if name in REMOVED:
        return InputError(f"{origin}: {name}: {REMOVED[name]}")
    hint = options.closest(key)
    suggestion = f"; did you mean {hint}?" if hint else ""
    return InputError(
        f"{origin}: {name}: vLLM {options.vllm_version} does not know this key and would refuse to start{suggestion}"
    )
