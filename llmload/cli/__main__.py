"""`python -m llmload.cli ARGS`: the `llmload` command."""

import sys

from llmload.cli import main

sys.exit(main())
