"""The server's settings as flags of llmload's own commands (`capacity`, `sim`, `sim calibrate`),
generated from ServeConfig and vLLM's option table: a setting llmload models is one ServeConfig
field, and every command takes it with vLLM's spelling, aliases and reading of values."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from llmload.models import ServeConfig
from llmload.server.serve_config import read_serve_config
from llmload.server.vllm_options import vllm_options

SERVING_FLAGS = "serving_flags"  # the argparse destination holding the setting flags as typed
# Fields that name the model rather than size the server: each command names its model its own way.
_NOT_FLAGS = {"model", "served_model_name", "not_modelled", "origins"}
_METAVARS = {"int": "N", "float": "X", "optional human_readable_int": "BYTES", "human_readable_int_or_auto": "TOKENS"}


class _Typed(argparse.Action):
    """Keeps a setting flag as typed (`--max-num-seqs 8`), for the reader to read as vLLM reads it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[str] | None,
        option_string: str | None = None,
    ) -> None:
        typed = [str(option_string)] if self.nargs == 0 else [str(option_string), str(values)]
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), typed])


def add_serving_arguments(parser: argparse.ArgumentParser, title: str) -> None:
    """--vllm-config, --vllm-args, and one flag per modelled vLLM setting (both forms of a switch)."""
    group = parser.add_argument_group(f"{title} (read as vLLM reads them; a flag wins over --vllm-args, "
                                      "which wins over --vllm-config)")  # fmt: skip
    group.add_argument("--vllm-config", type=Path, metavar="FILE.yaml", help="a `vllm serve --config` YAML file")
    group.add_argument("--vllm-args", metavar='"vllm serve ..."', help="a `vllm serve` command line")
    parser.set_defaults(**{SERVING_FLAGS: []})
    options = vllm_options()
    for field, info in ServeConfig.model_fields.items():
        if field in _NOT_FLAGS:
            continue
        name = field.replace("_", "-")
        option = options.options[name]
        spellings = options.spellings(name)
        about = f"vLLM's --{name}" + (f": {info.description}" if info.description else "")
        if option.is_switch:
            group.add_argument(
                *spellings, dest=SERVING_FLAGS, action=_Typed, nargs=0, help=f"{about} (--no-{name}: off)"
            )
            group.add_argument(f"--no-{name}", dest=SERVING_FLAGS, action=_Typed, nargs=0, help=argparse.SUPPRESS)
        else:
            metavar = "|".join(option.choices) if option.choices else _METAVARS.get(option.type, "VALUE")
            group.add_argument(*spellings, dest=SERVING_FLAGS, action=_Typed, metavar=metavar, help=about)


def serving_config(args: argparse.Namespace) -> ServeConfig:
    """--vllm-config, --vllm-args and the setting flags as one configuration (nothing given: vLLM's defaults)."""
    return read_serve_config(args.vllm_config, args.vllm_args, getattr(args, SERVING_FLAGS))


def serving_files_given(args: argparse.Namespace) -> bool:
    """A `vllm serve` configuration was given (rather than single settings): it says which model is served."""
    return args.vllm_config is not None or args.vllm_args is not None
