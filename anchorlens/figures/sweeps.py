"""Sweep curves: a value (accuracy) with its CI against a swept setting, one line per group."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from anchorlens.figures._labels import COLUMN_UNITS, UNITS, pretty
from anchorlens.figures._style import fonts, new_figure, series_colors, series_markers, series_order, sized, suptitle

_CI_CLAIM = re.compile(r"\s*\(?\s*(with\s+)?95%\s*CI\s*\)?", re.IGNORECASE)
LOG_RATIO = 20.0  # positive numeric x spanning at least this ratio gets a log axis


def _is_integer(values: pd.Series) -> bool:
    v = pd.to_numeric(values, errors="coerce")
    return bool(v.notna().all() and np.allclose(v, np.round(v)))


@sized
def sweep_curve(
    df: pd.DataFrame,
    x: str,
    y: str = "accuracy",
    *,
    lo: str | None = "ci_lo",
    hi: str | None = "ci_hi",
    by: str | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    log_x: bool | None = None,
) -> Figure:
    """``y`` against ``x``, one line per ``by`` value (markers, slight x offsets so overlaps stay visible).

    Error bars are drawn when ``lo``/``hi`` columns exist, and only then does the title say "95% CI".
    Integer settings (k, lengths) get integer ticks at the swept values; ``log_x`` (default: when
    positive values span ≥ 20x, as prompt lengths 1..100 do) uses a log axis. Rows with NaN ``y``
    (e.g. no anchor at k = 0) are not drawn.
    """
    data = df.dropna(subset=[y])
    groups = (
        [(None, data)] if by is None else [(name, data[data[by].astype(str) == name]) for name in series_order(df[by])]
    )
    names = [str(name) for name, _ in groups]
    colors, markers = series_colors(names), series_markers(names)
    numeric = pd.api.types.is_numeric_dtype(df[x])
    xs = pd.to_numeric(df[x], errors="coerce") if numeric else pd.Series(dtype=float)
    if log_x is None:
        log_x = bool(numeric and (xs > 0).all() and xs.max() / xs.min() >= LOG_RATIO)
    fig = new_figure(6.2, 3.8)
    ax = fig.subplots()
    drew_ci = False
    for i, (name, g) in enumerate(groups):
        g = g.sort_values(x)
        if g.empty:
            continue
        xv = g[x].astype(str) if not numeric else g[x].to_numpy(dtype=float)
        if numeric and len(groups) > 1:  # offsets: additive on a linear axis, multiplicative on a log axis
            shift = (i - (len(groups) - 1) / 2) * 0.06
            xv = xv * (1.0 + shift) if log_x else xv + shift * _spacing(xs)
        err = None
        if lo and hi and lo in g.columns and hi in g.columns and g[lo].notna().any():
            err = [(g[y] - g[lo]).clip(lower=0).to_numpy(), (g[hi] - g[y]).clip(lower=0).to_numpy()]
            drew_ci = True
        label = None if name is None else f"{pretty(by or '')} = {name}"
        ax.errorbar(
            xv,
            g[y],
            yerr=err,
            marker=markers[str(name)],
            ms=5,
            capsize=3,
            lw=1.5,
            alpha=0.9,
            color=colors[str(name)],
            label=label,
        )
    if numeric:
        ticks = sorted(set(xs.dropna().tolist()))
        if log_x:
            ax.set_xscale("log")
        if _is_integer(df[x]) or log_x:
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(xlabel or pretty(x))
    unit = COLUMN_UNITS.get(y) or UNITS.get(y)
    ax.set_ylabel(ylabel or pretty(y) + (f" ({unit})" if unit else ""))
    ax.grid(alpha=0.3)
    if by is not None:
        ax.legend(frameon=False, fontsize=fonts().legend)
    text = _CI_CLAIM.sub("", title or f"{pretty(y)} by {pretty(x)}").strip()
    if drew_ci:
        text += "\nerror bars: 95% CI"
    suptitle(fig, text)
    return fig


def _spacing(xs: pd.Series) -> float:
    """Smallest gap between distinct x values (1.0 when there is none)."""
    u = np.unique(xs.dropna().to_numpy(dtype=float))
    return float(np.diff(u).min()) if len(u) > 1 else 1.0
