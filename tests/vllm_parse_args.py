"""Parse `vllm serve` argument lists with vLLM's own parser, inside vLLM's venv: JSON in, JSON out.

stdin: a JSON list of argument lists; stdout: for each, the parsed options (dest → value) or
{"refused": message}. tests/test_serve_config_vllm.py compares llmload's reader with it.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    results: list[dict[str, object]] = []
    for argv in json.load(sys.stdin):
        parser = make_arg_parser(FlexibleArgumentParser())
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                namespace = parser.parse_args(argv)
        except (SystemExit, ValueError) as exc:
            results.append({"refused": stderr.getvalue().strip() or str(exc)})
            continue
        results.append({k: v for k, v in vars(namespace).items() if isinstance(v, str | int | float | bool | list)})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
