"""Layer x head grids: mean metric value per head, and paired differences with significance marks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure

from anchorlens.analyses.frames import per_head
from anchorlens.figures._frames import filter_eq, require_single, value_column
from anchorlens.figures._labels import frame_measure_label, measure_text, single
from anchorlens.figures._style import (
    DIFF_CMAP,
    MAP_CMAP,
    fonts,
    grid_shape,
    max_width,
    new_figure,
    panel_grid,
    series_order,
    sized,
    suptitle,
    wrap_to,
)
from anchorlens.figures._ticks import nice_range, set_colorbar_ticks

_ANNOTATE_MAX_CELLS = 160
# (minuend, subtrahend) columns naming what ``diff`` compares: compare_frames gives checkpoint - baseline.
_PAIR_COLUMNS = (("checkpoint", "baseline"), ("checkpoint_a", "checkpoint_b"), ("a", "b"))


def _prepare(
    df: pd.DataFrame, metric: str, stack: str | None, query_role: str | None, key_role: str | None
) -> tuple[pd.DataFrame, list]:
    """Rows of one metric, per-head only (head >= 0), role filters applied; and the stacks left."""
    out = filter_eq(df, "metric", metric)
    out = filter_eq(out, "stack", stack)
    out = filter_eq(out, "query_role", query_role)
    out = filter_eq(out, "key_role", key_role)
    out = per_head(out)
    if out.empty:
        raise ValueError(f"no per-head rows (head >= 0) for metric {metric!r}")
    require_single(out, ["query_role", "key_role"], f"metric {metric}")
    stacks = list(dict.fromkeys(out["stack"])) if "stack" in out.columns else [None]
    return out, stacks


def _grid(part: pd.DataFrame, column: str) -> pd.DataFrame:
    """Layer (rows) x head (columns) table of the mean of ``column``, labelled by integer layer and head."""
    grid = part.groupby(["layer", "head"])[column].mean().unstack("head").sort_index().sort_index(axis=1)
    grid.index = pd.Index([int(v) for v in grid.index], name="layer")
    grid.columns = pd.Index([int(v) for v in grid.columns], name="head")  # nullable heads unstack as floats
    return grid


def _scale(lo: float, hi: float, vmin: float | None, vmax: float | None) -> tuple[float, float, list[float]]:
    """Colour limits and ticks: nice numbers around the data, or the given limits with nice ticks inside."""
    if vmin is None and vmax is None:
        return nice_range(lo, hi)
    low, high = float(lo if vmin is None else vmin), float(hi if vmax is None else vmax)
    _, _, ticks = nice_range(low, high)
    inside = [t for t in ticks if low - 1e-12 <= t <= high + 1e-12]
    return low, high, inside or [low, high]


def _roles_of(part: pd.DataFrame, query_role: str | None, key_role: str | None) -> tuple[str | None, str | None]:
    """The query and key role a per-head figure shows (read from its rows when not given)."""
    return single(part, "query_role", query_role), single(part, "key_role", key_role)


def _fits_numbers(grid: pd.DataFrame, width_in: float) -> bool:
    """Whether cells are few and wide enough to print a 4-character number at the scheme's floor size."""
    cell_pt = 72.0 * width_in / max(1, grid.shape[1])
    return grid.size <= _ANNOTATE_MAX_CELLS and cell_pt >= 4 * 0.6 * fonts().small


def _print_width(width: float, columns: int, reserve: float = 1.2) -> float:
    """A panel's width, within the print preset's limit when figures are built for print."""
    limit = max_width()
    return width if limit is None else min(width, (limit - reserve) / max(1, columns))


def _print_height(height: float, layers: int) -> float:
    """A grid's height: at a print size, rows of layers just over the floor font's height apart (no taller)."""
    return height if max_width() is None else min(height, max(2.2, 0.16 * layers + 1.3))


def _cell_fontsize(grid: pd.DataFrame, width_in: float) -> float:
    """Cell annotation size: what fits four characters per cell, within the scheme's note size and floor."""
    f = fonts()
    return max(f.small, min(f.note, 0.55 * 72.0 * width_in / max(1, grid.shape[1]) / 4.5))


def _heatmap(ax: Any, g: pd.DataFrame, lo: float, hi: float, width: float, annotate: bool | None, **extra: Any) -> None:
    """One layer x head heatmap on the shared [lo, hi] scale, annotated when small (or as ``annotate`` says)."""
    show = annotate if annotate is not None else _fits_numbers(g, width)
    sns.heatmap(
        g,
        ax=ax,
        cmap=MAP_CMAP,
        vmin=lo,
        vmax=hi,
        annot=show,
        fmt=_fmt(lo, hi),
        annot_kws={"fontsize": _cell_fontsize(g, width)},
        linewidths=0.3,
        linecolor="white",
        **extra,
    )


@sized
def head_grid(
    df: pd.DataFrame,
    metric: str,
    checkpoint: str,
    *,
    stack: str | None = None,
    query_role: str | None = None,
    key_role: str | None = None,
    annotate: bool | None = None,
    title: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> Figure:
    """Layer x head heatmap of the mean ``metric`` of one checkpoint (one panel per stack).

    Pass ``vmin``/``vmax`` (e.g. from :func:`head_range` over every checkpoint) so separate figures of
    several checkpoints share one colour scale; both ends are labelled on the colour bar.
    """
    part = filter_eq(df, "checkpoint", checkpoint)
    part, stacks = _prepare(part, metric, stack, query_role, key_role)
    col = value_column(part)
    grids = [_grid(part[part["stack"] == st] if st is not None else part, col) for st in stacks]
    data_lo = float(min(np.nanmin(g.to_numpy(dtype=float)) for g in grids))
    data_hi = float(max(np.nanmax(g.to_numpy(dtype=float)) for g in grids))
    lo, hi, ticks = _scale(data_lo, data_hi, vmin, vmax)
    label = frame_measure_label(part, metric, query_role, key_role)
    width = _print_width(max(4.5, 0.45 * max(g.shape[1] for g in grids) + 1.8), len(grids), 0.0)
    height = _print_height(max(3.0, 0.28 * max(g.shape[0] for g in grids) + 1.4), max(g.shape[0] for g in grids))
    fig = new_figure(width * len(grids), height)
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, st, g in zip(axes, stacks, grids):
        _heatmap(ax, g, lo, hi, width, annotate, cbar_kws={"label": label, "shrink": 0.9})
        set_colorbar_ticks(ax.collections[0].colorbar, ticks)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.tick_params(axis="y", rotation=0)
        ax.set_title(f"{st} stack" if st is not None else "", fontsize=fonts().panel)
    n = part["example"].nunique() if "example" in part.columns else None
    note = f"mean over {n} examples" if n else "mean"
    what = measure_text(metric, *_roles_of(part, query_role, key_role))
    suptitle(fig, f"{title or what + ' per head'} — {checkpoint}\n{note}")
    return fig


def _fmt(lo: float, hi: float) -> str:
    """Cell number format with enough decimals to tell cells of a narrow range apart."""
    span = abs(hi - lo)
    return ".2f" if span >= 0.05 or span == 0 else ".3f" if span >= 0.005 else ".2e"


def head_range(
    df: pd.DataFrame,
    metric: str,
    checkpoints: Sequence[str] | None = None,
    *,
    query_role: str | None = None,
    key_role: str | None = None,
) -> tuple[float, float]:
    """(min, max) of the per-(layer, head) means of ``metric`` over the given checkpoints: one shared scale."""
    part = filter_eq(df, "checkpoint", list(checkpoints) if checkpoints else None)
    part, _ = _prepare(part, metric, None, query_role, key_role)
    col = value_column(part)
    keys = [c for c in ("checkpoint", "stack", "layer", "head") if c in part.columns]
    means = part.groupby(keys)[col].mean()
    return float(means.min()), float(means.max())


@sized
def head_grids(
    df: pd.DataFrame,
    metric: str,
    checkpoints: Sequence[str] | None = None,
    *,
    stack: str | None = None,
    query_role: str | None = None,
    key_role: str | None = None,
    annotate: bool | None = None,
    title: str | None = None,
) -> Figure:
    """Layer x head heatmaps of several checkpoints in one figure: a wrapped grid (≤ 3 per row), one
    colour scale with labelled ends, checkpoints in the given order (default: order of appearance)."""
    names = series_order(df["checkpoint"], checkpoints)
    part = filter_eq(df, "checkpoint", names)
    part, stacks = _prepare(part, metric, stack, query_role, key_role)
    if len(stacks) > 1:
        raise ValueError(f"several stacks ({', '.join(map(str, stacks))}); pass stack=...")
    col = value_column(part)
    grids = [_grid(part[part["checkpoint"].astype(str) == n], col) for n in names]
    lo, hi, ticks = nice_range(*head_range(part, metric, names))
    label = frame_measure_label(part, metric, query_role, key_role)
    rows, cols = grid_shape(len(names))
    width = _print_width(max(3.2, 0.45 * max(g.shape[1] for g in grids) + 1.0), cols)
    height = max(2.4, 0.28 * max(g.shape[0] for g in grids) + 1.0)
    if max_width() is not None:  # print: rows of layers at least the floor font's height apart, no more
        height = min(height, max(1.6, 0.16 * max(g.shape[0] for g in grids) + 0.7))
    fig = new_figure(width * cols + 1.2, height * rows + 1.0)
    axes = panel_grid(fig, len(names), sharex=False, sharey=False)
    for ax, name, g in zip(axes, names, grids):
        _heatmap(ax, g, lo, hi, width, annotate, cbar=False)
        ax.set_title(wrap_to(name, fig.get_figwidth() / cols - 0.4) if max_width() else name, fontsize=fonts().panel)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.tick_params(axis="y", rotation=0)
    cbar = fig.colorbar(
        ScalarMappable(norm=mcolors.Normalize(lo, hi), cmap=MAP_CMAP),
        ax=axes,
        shrink=0.85,
        label=label + ("\none scale for all panels" if len(names) > 1 else ""),
    )
    set_colorbar_ticks(cbar, ticks)
    n = part["example"].nunique() if "example" in part.columns else None
    where = f"{stacks[0]} stack, " if stacks[0] is not None else ""
    heading = title or measure_text(metric, *_roles_of(part, query_role, key_role)) + " per head"
    suptitle(fig, f"{heading}\n{where}mean over {n} examples" if n else heading)
    return fig


@sized
def head_diff_grid(
    compare_df: pd.DataFrame,
    metric: str,
    *,
    checkpoint: str | None = None,
    stack: str | None = None,
    query_role: str | None = None,
    key_role: str | None = None,
    alpha: float = 0.05,
    annotate: bool | None = None,
    title: str | None = None,
    bound: float | None = None,
) -> Figure:
    """Layer x head heatmap of paired differences (diverging, centred at 0); ``*`` marks q < alpha.

    ``bound`` fixes the scale to [-bound, bound] (e.g. the largest |diff| over every checkpoint, so
    separate figures share one scale); default: this checkpoint's largest |diff|.

    Takes ``compare_frames`` output (checkpoint, baseline, diff = checkpoint - baseline, q_value; pass
    ``checkpoint=`` when it holds several) or any frame with ``diff`` and ``q``.
    """
    frame = filter_eq(compare_df, "checkpoint", checkpoint) if "baseline" in compare_df.columns else compare_df
    part, stacks = _prepare(frame, metric, stack, query_role, key_role)
    if "baseline" in part.columns:
        require_single(part, ["checkpoint", "baseline"], "comparison")
    qcol = next((c for c in ("q", "q_value") if c in part.columns), None)
    if "diff" not in part.columns or qcol is None:
        raise ValueError(f"comparison frame needs 'diff' and 'q' (or 'q_value'); got {list(part.columns)}")
    diffs = [_grid(part[part["stack"] == st] if st is not None else part, "diff") for st in stacks]
    qs = [_grid(part[part["stack"] == st] if st is not None else part, qcol) for st in stacks]
    pair = next(
        ((part[a].iloc[0], part[b].iloc[0]) for a, b in _PAIR_COLUMNS if a in part.columns and b in part.columns), None
    )
    if bound is None:
        bound = float(max(np.nanmax(np.abs(g.to_numpy(dtype=float))) for g in diffs)) or 1e-12
    _, bound, ticks = nice_range(-bound, bound, symmetric=True)
    label = "Δ " + frame_measure_label(part, metric, query_role, key_role)
    width = _print_width(max(4.5, 0.5 * max(g.shape[1] for g in diffs) + 1.8), len(diffs), 0.0)
    height = _print_height(max(3.0, 0.28 * max(g.shape[0] for g in diffs) + 1.4), max(g.shape[0] for g in diffs))
    fig = new_figure(width * len(diffs), height)
    axes = fig.subplots(1, len(diffs), squeeze=False)[0]
    for ax, st, d, q in zip(axes, stacks, diffs, qs):
        sig = q.reindex_like(d).to_numpy(dtype=float) < alpha
        show = annotate if annotate is not None else _fits_numbers(d, width - 1.2)
        sns.heatmap(
            d,
            ax=ax,
            cmap=DIFF_CMAP,
            vmin=-bound,
            vmax=bound,
            annot=False,
            linewidths=0.3,
            linecolor="white",
            cbar_kws={"label": label, "shrink": 0.9},
        )
        set_colorbar_ticks(ax.collections[0].colorbar, ticks)
        fs = _cell_fontsize(d, width)
        values = d.to_numpy(dtype=float)
        for i in range(d.shape[0]):
            for j in range(d.shape[1]):
                if np.isnan(values[i, j]):
                    continue
                strong = abs(values[i, j]) > 0.6 * bound
                color = "white" if strong else "black"
                if show:
                    ax.text(
                        j + 0.5,
                        i + 0.5,
                        f"{values[i, j]:{_fmt(-bound, bound)}}" + ("*" if sig[i, j] else ""),
                        ha="center",
                        va="center",
                        fontsize=fs,
                        color=color,
                    )
                elif sig[i, j]:
                    ax.text(
                        j + 0.5, i + 0.5, "*", ha="center", va="center", fontsize=fs + 4, fontweight="bold", color=color
                    )
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.tick_params(axis="y", rotation=0)
        if st is not None:
            ax.set_title(f"{st} stack", fontsize=fonts().panel)
    versus = f"\nΔ = {pair[0]} − {pair[1]}" if pair else ""
    suptitle(
        fig,
        f"{title or 'Paired difference in ' + measure_text(metric, *_roles_of(part, query_role, key_role))}{versus}"
        f"\n* q < {alpha:g} (Benjamini–Hochberg adjusted)",
    )
    return fig
