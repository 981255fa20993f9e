"""How reports print numbers: one dash for a missing value, the same digits in Markdown and HTML."""

from __future__ import annotations


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def percent(fraction: float | None, digits: int = 0) -> str:
    """A 0..1 share as a percent."""
    return "–" if fraction is None else f"{100 * fraction:.{digits}f}%"


def turn_depths(mix: dict[str, float]) -> str:
    """Turn mix as "turn 1 / 2 / 3 / 4 and deeper" percentages."""
    if not mix:
        return "–"

    def share(key: str) -> float:
        return mix.get(key, 0.0)

    deep = sum(v for k, v in mix.items() if k not in ("1", "2", "3"))
    return "/".join(f"{100 * v:.0f}" for v in (share("1"), share("2"), share("3"), deep))
