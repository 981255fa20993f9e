"""Parse `vllm serve` argument lists with vLLM's own parser, inside vLLM's venv: JSON in, JSON out.

stdin: a JSON list of argument lists; stdout: for each, the parsed options (dest → value, dicts
and config dataclasses as JSON, only the options the arguments set) or {"refused": message}.
An argument list that starts with "serve" goes through vLLM's `vllm` command as
vllm/entrypoints/cli/main.py builds it (the positional model wins over --model, as
ServeSubcommand.cmd makes it); any other through the parser of
`python -m vllm.entrypoints.openai.api_server` (vllm/entrypoints/launchers/api_server/entry.py
main), which takes a positional model but serves --model's. tests/test_serve_config_vllm.py
compares llmload's reader with it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
from typing import Any


def _plain(value: Any) -> Any:
    """A parsed value as JSON holds it: a config dataclass as the fields it was given."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        from pydantic import TypeAdapter

        return TypeAdapter(type(value)).dump_python(value, mode="json", exclude_unset=True)
    return repr(value)


def _parser(serve: bool) -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if not serve:
        return _only_given(make_arg_parser(FlexibleArgumentParser()))
    parser = FlexibleArgumentParser()
    _only_given(ServeSubcommand().subparser_init(parser.add_subparsers(required=False, dest="subparser")))
    return parser


def _only_given(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser with no defaults: its namespace holds only what the arguments set."""
    for action in parser._actions:
        if action.dest != "help":
            action.default = argparse.SUPPRESS
    return parser


def parse(argv: list[str]) -> dict[str, Any]:
    """vLLM's reading of one argument list: the options set (dest → value) or {"refused": message}."""
    serve = argv[:1] == ["serve"]
    parser = _parser(serve)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):  # --help prints
            namespace = vars(parser.parse_args(argv))
    except (SystemExit, Exception) as exc:  # vLLM also fails with IndexError, AssertionError, ValueError
        return {"refused": stderr.getvalue().strip() or f"{type(exc).__name__}: {exc}"}
    if serve and "model_tag" in namespace:
        namespace["model"] = namespace.pop("model_tag")
    namespace.pop("subparser", None)
    return json.loads(json.dumps(namespace, default=_plain))


def main() -> None:
    json.dump([parse(argv) for argv in json.load(sys.stdin)], sys.stdout)


if __name__ == "__main__":
    main()
