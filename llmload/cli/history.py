"""`llmload history DIR…`: every finished run under the folders (reports/, or CI artifacts downloaded into
one), each figure's trend over the runs comparable with the newest and the change points found, the
runs apart with why (llmload.history; docs/history.md). Writes history.json and history.html into -o
(default: the first DIR); no server needs to run. Exit 0, or 2 when no finished run is found."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "every run under the folders: each figure's trend, its change points, history.html"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directories", nargs="+", type=Path, metavar="DIR", help="folders holding run directories")
    parser.add_argument("-o", "--output", type=Path, default=None, help="where history.json and .html go (first DIR)")
    parser.add_argument("--json", action="store_true", help="print the whole history as JSON, not the table")


def run(args: argparse.Namespace) -> int:
    from llmload.history.page import render_page  # matplotlib: only once there is a history to draw
    from llmload.history.trend import HISTORY_HTML, HISTORY_JSON, build_history, render_text

    history = build_history(args.directories)
    output: Path = args.output or args.directories[0]
    output.mkdir(parents=True, exist_ok=True)
    text = history.model_dump_json(indent=2)
    (output / HISTORY_JSON).write_text(text + "\n", encoding="utf-8")
    render_page(history, output / HISTORY_HTML)
    sys.stdout.write(text + "\n" if args.json else render_text(history))
    if not args.json:
        print(f"\n{output / HISTORY_HTML}, {output / HISTORY_JSON}")
    return 0
