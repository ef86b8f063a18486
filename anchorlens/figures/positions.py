"""Anchor-position sweeps: metric (and optionally accuracy) against insertion position."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from anchorlens.figures._frames import HeadChoice, filter_eq, is_summary, pick_head, require_single, summarize
from anchorlens.figures._labels import frame_measure_label, measure_text, pretty, single
from anchorlens.figures._style import (
    fonts,
    new_figure,
    position_key,
    series_colors,
    series_markers,
    series_order,
    sized,
    suptitle,
)

_ACCURACY_COLUMNS = ("accuracy", "mean", "value")


def _positions(*frames: pd.DataFrame | None, column: str) -> list[str]:
    seen = {str(v) for f in frames if f is not None for v in f[column].unique()}
    return sorted(seen, key=position_key)


def _accuracy_summary(acc: pd.DataFrame, by: str, column: str) -> pd.DataFrame:
    """Summary rows (by, position, mean[, ci_lo, ci_hi]) from an accuracy frame."""
    value = next((c for c in _ACCURACY_COLUMNS if c in acc.columns), None)
    if value is None or by not in acc.columns or column not in acc.columns:
        raise ValueError(f"accuracy frame needs {by!r}, {column!r} and one of {_ACCURACY_COLUMNS}")
    if value == "mean":
        return acc
    frame = acc.rename(columns={value: "value"})
    if frame.duplicated([by, column]).any():
        return summarize(frame, [by, column])  # per-example correctness -> mean and CI
    return frame.rename(columns={"value": "mean"})


def _errorbars(ax, x: list[float], s: pd.DataFrame, color, **style) -> None:
    if {"ci_lo", "ci_hi"} <= set(s.columns):
        err = [(s["mean"] - s["ci_lo"]).clip(lower=0), (s["ci_hi"] - s["mean"]).clip(lower=0)]
        ax.errorbar(x, s["mean"], yerr=err, color=color, capsize=3, elinewidth=1, **style)
    else:
        ax.plot(x, s["mean"], color=color, **style)


@sized
def position_sweep(
    df: pd.DataFrame,
    metric: str,
    accuracy: pd.DataFrame | None = None,
    *,
    position_col: str = "position",
    by: str = "checkpoint",
    stack: str | None = None,
    head: HeadChoice = "mean",
    layer: int | None = None,
    query_role: str | None = None,
    key_role: str | None = None,
    order: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """``metric`` vs anchor position (named positions, then ints) with CI bars; accuracy on a twin axis."""
    part = filter_eq(df, "metric", metric)
    part = filter_eq(part, "stack", stack)
    part = pick_head(part, head)
    part = filter_eq(part, "layer", layer)
    part = filter_eq(part, "query_role", query_role)
    part = filter_eq(part, "key_role", key_role)
    if position_col not in part.columns:
        raise ValueError(f"no {position_col!r} column; pass position_col=...")
    require_single(part, ["stack", "query_role", "key_role"], f"metric {metric}")
    if is_summary(part) and part.duplicated([by, position_col]).any():
        raise ValueError("several summary rows per position (layers?); pass layer=... or summarise over layers")
    s = summarize(part, [by, position_col])
    s = s.assign(**{position_col: s[position_col].astype(str)})
    acc = _accuracy_summary(accuracy, by, position_col) if accuracy is not None else None
    if acc is not None:
        acc = acc.assign(**{position_col: acc[position_col].astype(str)})
    pos_order = _positions(s, acc, column=position_col)
    xpos = {p: i for i, p in enumerate(pos_order)}
    series = series_order(list(part[by]) + (list(acc[by]) if acc is not None else []), order)
    colors, markers = series_colors(series), series_markers(series)
    dodge = 0.08 if len(series) > 1 else 0.0

    fig = new_figure(max(5.0, 1.1 * len(pos_order) + 3.0), 3.8)
    ax = fig.subplots()
    ax2 = ax.twinx() if acc is not None else None
    for i, name in enumerate(series):
        off = (i - (len(series) - 1) / 2) * dodge
        line = s[s[by].astype(str) == name].sort_values(position_col, key=lambda c: c.map(position_key))
        if not line.empty:
            _errorbars(
                ax,
                [xpos[p] + off for p in line[position_col]],
                line,
                colors[name],
                marker=markers[name],
                ms=5,
                lw=1.6,
                ls="-",
            )
        if ax2 is not None and acc is not None:
            a = acc[acc[by].astype(str) == name].sort_values(position_col, key=lambda c: c.map(position_key))
            if not a.empty:
                _errorbars(
                    ax2, [xpos[p] + off for p in a[position_col]], a, colors[name], marker="s", ms=4, lw=1.2, ls="--"
                )
    ax.set_xticks(range(len(pos_order)), [pretty(p) for p in pos_order], rotation=20 if len(pos_order) > 4 else 0)
    ax.set_xlim(-0.5, len(pos_order) - 0.5)
    ax.set_xlabel("anchor position")
    label = frame_measure_label(part, metric, query_role, key_role)
    text = measure_text(metric, single(part, "query_role", query_role), single(part, "key_role", key_role))
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3, lw=0.5)
    handles = [Line2D([], [], color=colors[n], lw=2, marker=markers[n], label=str(n)) for n in series]
    if ax2 is not None:
        ax2.set_ylabel("accuracy")
        handles += [
            Line2D([], [], color="0.3", ls="-", marker="o", label=text),
            Line2D([], [], color="0.3", ls="--", marker="s", label="accuracy"),
        ]
    fig.legend(handles=handles, loc="outside right center", fontsize=fonts().legend, frameon=False)
    where = ", ".join(
        p
        for p in (f"{stack} stack" if stack else "", f"layer {layer}" if layer is not None else "mean over layers")
        if p
    )
    suptitle(fig, f"{title or text + ' by anchor position'}\n{where}; bars: 95% bootstrap CI")
    return fig
