"""The options `vllm serve` accepts, from a capture of the vLLM llmload is tested against.

The capture (``vllm-0.32.0.json``, written by ``capture.py`` inside vLLM's own environment) holds
every long option with how argparse reads it; a key that is not there is one vLLM refuses at
startup ("unrecognized arguments"), so llmload refuses it too, naming the closest known key.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

from pydantic import BaseModel

VLLM_VERSION = "0.32.0"
CAPTURE = Path(__file__).with_name(f"vllm-{VLLM_VERSION}.json")

# Keys users carry over from older vLLM releases, with why vLLM 0.32 refuses them.
REMOVED = {
    "swap-space": "the V1 engine preempts by recomputing, with no CPU swap space; vLLM 0.32 refuses the key",
}


class Option(BaseModel):
    """One option as vLLM's argparse parser declares it."""

    dest: str
    type: str
    nargs: str | None = None
    choices: list[str] | None = None
    default: object = None

    @property
    def is_switch(self) -> bool:
        """Takes no value: `--flag` alone (bool options also have a `--no-` form)."""
        return self.type in ("bool", "switch")


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


@cache
def vllm_options() -> VllmOptions:
    return VllmOptions.model_validate(json.loads(CAPTURE.read_text(encoding="utf-8")))


_SUFFIX = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """vLLM's reading of sizes: `25.6k` = 25,600 (decimal), `64M` = 64 × 2**20 (binary, whole numbers only)."""
    match = _SUFFIX.fullmatch(text.strip())
    if match is None:
        return _whole(text)
    number, suffix = match.groups()
    if suffix in _BINARY:
        if "." in number:
            raise ValueError(f"{text!r}: decimals are not allowed with binary suffixes like {suffix}")
        return int(number) * _BINARY[suffix]
    return int(float(number) * _DECIMAL[suffix])


def _int_or_auto(text: str) -> int:
    return -1 if text.strip() in ("-1", "auto") else human_readable_int(text)


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


_READERS: dict[str, Callable[[str], object]] = {
    "int": _whole,
    "float": _number,
    "str": str,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": _int_or_auto,
}


def read_value(option: Option, text: str) -> object:
    """A value as vLLM's argparse would read it (ValueError when it would refuse it); types llmload
    does not model (JSON configs, dataclasses) stay text."""
    kind = option.type.removeprefix("optional ")
    if option.type.startswith("optional ") and text in ("", "None"):
        return None
    value = _READERS.get(kind, str)(text)
    if option.choices is not None and str(value) not in option.choices:
        raise ValueError(f"{text!r} is not one of {', '.join(option.choices)}")
    return value
