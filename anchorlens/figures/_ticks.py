"""Colour scales on nice numbers: limits and ticks from matplotlib's nice-number locator, never raw data ends.

A colour bar whose ends are the data's minimum and maximum reads ``6.65e-10`` or ``0.000561``; here
the scale is widened to the locator's ticks around the data (``0 … 1`` in steps of 0.2), so every
tick is a round number and the data stay inside the bar.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.ticker import LogLocator, MaxNLocator

NBINS = 5
STEPS = (1, 2, 2.5, 5, 10)


def nice_range(
    lo: float, hi: float, *, nbins: int = NBINS, symmetric: bool = False
) -> tuple[float, float, list[float]]:
    """(low, high, ticks): nice limits that contain [lo, hi] and the ticks between them.

    ``symmetric``: limits ±b around 0 (difference maps). A constant range is widened so the bar has a span.
    """
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if symmetric:
        bound = max(abs(lo), abs(hi)) or 1.0
        lo, hi = -bound, bound
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        pad = abs(hi) * 0.1 or 0.1
        lo, hi = lo - pad, hi + pad
    locator = MaxNLocator(nbins=nbins + 2 if symmetric else nbins, steps=list(STEPS), symmetric=symmetric)
    ticks = [float(t) for t in locator.tick_values(lo, hi)]
    low = max(t for t in ticks if t <= lo + 1e-12 * abs(lo or 1))
    high = min(t for t in ticks if t >= hi - 1e-12 * abs(hi or 1))
    inside = [_clean(t) for t in ticks if low - 1e-12 <= t <= high + 1e-12]
    return _clean(low), _clean(high), inside


def log_ticks(lo: float, hi: float) -> list[float]:
    """Decade ticks (1e-3, 1e-2 ...) within [lo, hi] for a log colour scale (the decades around it if none is inside)."""
    ticks = [float(t) for t in LogLocator(base=10).tick_values(lo, hi) if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
    if ticks:
        return ticks
    return [10.0 ** math.floor(math.log10(lo)), 10.0 ** math.ceil(math.log10(hi))]


def _clean(value: float) -> float:
    """Round away float noise (0.30000000000000004 -> 0.3); -0.0 -> 0.0."""
    out = float(np.round(value, 12))
    return 0.0 if out == 0 else out


def tick_format(ticks: list[float]) -> str:
    """A format with as many decimals as the tick step needs (0.2 -> '{:.1f}', 0.25 -> '{:.2f}', 5 -> '{:.0f}')."""
    finite = sorted(t for t in ticks if math.isfinite(t))
    steps = [b - a for a, b in zip(finite, finite[1:]) if b - a > 0]
    step = min(steps) if steps else (abs(finite[0]) if finite and finite[0] else 1.0)
    decimals = 0
    while decimals < 10 and abs(round(step, decimals) - step) > 1e-9 * max(1.0, abs(step)):
        decimals += 1
    return f"{{:.{decimals}f}}"


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels of nice ticks: the same decimals for all, a true minus sign, no '-0'."""
    fmt = tick_format(ticks)
    out = []
    for t in ticks:
        text = "0" if float(fmt.format(t)) == 0 else fmt.format(t)
        out.append(text.replace("-", "−"))
    return out


def set_colorbar_ticks(cbar: Any, ticks: list[float], *, log: bool = False) -> None:
    """Put ``ticks`` on a colour bar with their nice labels (decades as 10^k on a log scale)."""
    if log:
        labels = [f"$10^{{{int(round(math.log10(t)))}}}$" if t > 0 else "0" for t in ticks]
    else:
        labels = tick_labels(ticks)
    cbar.set_ticks(ticks, labels=labels)
    cbar.minorticks_off()
