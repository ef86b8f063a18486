"""Sweep curves: a value (accuracy) with its CI against a swept setting, one line per group."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from anchorlens.figures._style import new_figure, series_colors


def sweep_curve(df: pd.DataFrame, x: str, y: str = "accuracy", *, lo: str | None = "ci_low", hi: str | None = "ci_high",
                by: str | None = None, title: str | None = None, xlabel: str | None = None, ylabel: str | None = None) -> Figure:
    """``y`` (with [lo, hi] error bars when given) against ``x``; one line per ``by`` value."""
    groups = [(None, df)] if by is None else [(name, g) for name, g in df.groupby(by, sort=True)]
    colors = series_colors([str(name) for name, _ in groups])
    fig = new_figure(6.0, 3.6)
    ax = fig.subplots()
    for name, g in groups:
        g = g.sort_values(x)
        color = colors[str(name)]
        err = None
        if lo in g.columns and hi in g.columns:
            err = [(g[y] - g[lo]).clip(lower=0).to_numpy(), (g[hi] - g[y]).clip(lower=0).to_numpy()]
        ax.errorbar(g[x].astype(str) if g[x].dtype == object else g[x], g[y], yerr=err, marker="o", capsize=3,
                    color=color, label=None if name is None else f"{by} = {name}")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    ax.grid(alpha=0.3)
    if by is not None:
        ax.legend(frameon=False, fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return fig
