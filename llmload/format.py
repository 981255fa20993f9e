"""How every table prints numbers: one dash for a missing value, the same digits everywhere."""

from __future__ import annotations


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def figure(value: float, *, sign: bool = False) -> str:
    """A measured figure in a sentence: three significant digits, and thousands written out in full
    (6,270, never 6.27e+03)."""
    if abs(value) >= 1000:
        return f"{value:{'+' if sign else ''},.0f}"
    return f"{value:{'+' if sign else ''}.3g}"


def percent(fraction: float | None, digits: int = 0) -> str:
    """A 0..1 share as a percent."""
    return "–" if fraction is None else f"{100 * fraction:.{digits}f}%"
