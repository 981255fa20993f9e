"""`python -m llmload.sim ARGS`: `llmload sim ARGS`, what SimProcess starts."""

import sys

from llmload.cli import main

sys.exit(main(["sim", *sys.argv[1:]]))
