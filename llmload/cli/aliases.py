"""A flag's old spelling kept working while it is retired: the value is taken, and a warning on stderr
names the spelling to use instead."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


class DeprecatedAlias(argparse.Action):
    """Stores the value like `store`; the first spelling is the name, any other warns that it is old."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            print(
                f"llmload: warning: {option_string} is deprecated, use {self.option_strings[0]}",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)
