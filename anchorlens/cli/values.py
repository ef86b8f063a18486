"""Parsers for numeric flags, so a bad value is refused with a message naming the value and the range.

``typer.Option(..., min=1)`` lets click answer ``'abc' is not a valid integer`` or ``0 is not in the
range x>=1`` in a usage box; these parsers say ``'abc' is not a whole number; give one of at least 1``
and go through :mod:`anchorlens.cli.oneline` as one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import typer


def _number(kind: type, text: object, what: str) -> float:
    """``text`` as ``kind`` (int or float); BadParameter naming the value otherwise."""
    if isinstance(text, kind) and not isinstance(text, bool):
        return text  # type: ignore[return-value]
    try:
        value = kind(str(text).strip())
    except ValueError:
        raise typer.BadParameter(f"{str(text)!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise typer.BadParameter(f"{str(text)!r} is not a finite number")
    return value


def at_least(low: int) -> Callable[[str], int]:
    """A parser for a whole number of at least ``low`` (``--n``, ``--batch-size``, ``--steps`` ...)."""

    def parse(text: str) -> int:
        value = int(_number(int, text, f"a whole number; give one of at least {low}"))
        if value < low:
            raise typer.BadParameter(f"{value} is below {low}; give a whole number of at least {low}")
        return value

    parse.__name__ = f"integer_at_least_{low}"
    parse.low = low  # type: ignore[attr-defined]  # read by the usage-error walk of the tests
    return parse


def non_negative(text: str) -> float:
    """A parser for a number of at least 0 (``--epochs``)."""
    value = float(_number(float, text, "a number; give one of at least 0"))
    if value < 0:
        raise typer.BadParameter(f"{value:g} is below 0; give a number of at least 0")
    return value


non_negative.low = 0  # type: ignore[attr-defined]


def whole_number(text: str) -> int:
    """A parser for any whole number (``--seed``)."""
    return int(_number(int, text, "a whole number"))


def positive(text: str) -> float:
    """A parser for a number above 0 (``--lr``)."""
    value = float(_number(float, text, "a number; give one above 0"))
    if value <= 0:
        raise typer.BadParameter(f"{value:g} is not above 0; give a positive number (e.g. 3e-3)")
    return value


positive.low = 0  # type: ignore[attr-defined]
