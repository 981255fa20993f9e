"""The price of a GPU-hour: --gpu-hour-cost, else the entry of the price table (gpu_prices.yaml, with
--gpu-prices FILE over it) whose words are all in the GPU's name. The table in force is written to
run.json, so a report rebuilt later prices the run as it was priced."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from llmload.errors import InputError
from llmload.models import Pricing
from llmload.yamlfile import yaml_entries

TABLE_FILE = "gpu_prices.yaml"
DEFAULT_SOURCE = "llmload's table (llmload/cost/gpu_prices.yaml)"
_WORD = re.compile(r"[a-z0-9]+")


def _read_table(path: Path) -> dict[str, float]:
    """A price file: a mapping of GPU-name words to a positive USD per GPU-hour; a bad entry is named by line."""
    table = {}
    for key, value, line in yaml_entries(path, "GPU names to USD per GPU-hour"):
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise InputError(f"{path}:{line}: {key!r}: the price must be a positive number of USD per GPU-hour")
        if not _WORD.findall(key.lower()):
            raise InputError(f"{path}:{line}: {key!r} names no word of a GPU's name")
        table[key] = float(value)
    return table


def pricing(gpu_hour_usd: float | None, prices_file: str | None) -> Pricing:
    """What the run will be priced by: the flag, and the packaged table with the user's file over it."""
    with resources.as_file(resources.files(__package__) / TABLE_FILE) as packaged:
        table = _read_table(packaged)
    source = DEFAULT_SOURCE
    if prices_file:
        table |= _read_table(Path(prices_file))
        source = f"{prices_file} over {DEFAULT_SOURCE}"
    return Pricing(gpu_hour_usd=gpu_hour_usd, table=table, table_source=source)


def table_entry(name: str, table: dict[str, float]) -> str | None:
    """The table's entry for a GPU named `name`: all its words in the name, the most words winning."""
    words = set(_WORD.findall(name.lower()))
    matches = [key for key in table if set(_WORD.findall(key.lower())) <= words]
    return max(matches, key=lambda key: (len(_WORD.findall(key.lower())), len(key)), default=None)
