"""Role-to-role attention flow: one query-role x key-role heatmap per checkpoint, shared scale.

Rows and columns are the roles the run has (names and order from the frame, so a task's own roles
appear as they are); a role no checkpoint has is not drawn, and a role one checkpoint lacks reads
``n/a`` there, never 0.00.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure

from anchorlens.figures._frames import HeadChoice, filter_eq, pick_head, value_column
from anchorlens.figures._labels import MASS
from anchorlens.figures._roles import ordered_roles, role_color, role_palette
from anchorlens.figures._style import MAP_CMAP, grid_shape, new_figure, panel_grid, series_order, suptitle
from anchorlens.figures._ticks import nice_range, set_colorbar_ticks

NA_TEXT = "n/a"


def _layer_filter(df: pd.DataFrame, layer: int | str | None) -> tuple[pd.DataFrame, str]:
    if "layer" not in df.columns:
        return df, ""
    layers = sorted(df["layer"].unique().tolist())
    if layer is None or layer == "mean":
        return df, (f"mean over {len(layers)} layers" if len(layers) > 1 else f"layer {layers[0]}")
    return filter_eq(df, "layer", int(layer)), f"layer {int(layer)}"


def present_roles(rows: pd.DataFrame, col: str) -> set[str]:
    """Roles a checkpoint's inputs have: every query role (each position is a query), and key roles that
    receive attention (keys of another sequence, as in cross-attention, are never queries)."""
    return set(rows["query_role"].astype(str)) | set(rows.loc[rows[col].abs() > 0, "key_role"].astype(str))


def absent_roles_blank(rows: pd.DataFrame, col: str, q_order: list[str], k_order: list[str]) -> pd.DataFrame:
    """Query-role x key-role means of one checkpoint; roles its inputs lack are NaN (drawn as n/a)."""
    table = rows.groupby(["query_role", "key_role"])[col].mean().unstack("key_role")
    table = table.reindex(index=q_order, columns=k_order)
    present = present_roles(rows, col)
    table.loc[:, [k for k in k_order if k not in present]] = np.nan
    table.loc[[q for q in q_order if q not in present], :] = np.nan
    return table


def role_flow_heatmaps(
    df: pd.DataFrame,
    *,
    metric: str = "role_flow",
    layer: int | str | None = None,
    stack: str | None = None,
    head: HeadChoice = "mean",
    checkpoints: Sequence[str] | None = None,
    fmt: str = ".2f",
    title: str | None = None,
) -> Figure:
    """One annotated query-role x key-role heatmap per checkpoint, all on one colour scale.

    Panels follow ``checkpoints`` (default: order of appearance) and wrap into rows of at most three.
    Rows and columns are the roles present in at least one checkpoint, built-in roles first in their
    canonical order, then the others as the frame first names them. A role a checkpoint's inputs do
    not have (never a query role there, never attended to) reads n/a there, not 0.00.
    """
    part = filter_eq(df, "metric", metric)
    part = filter_eq(part, "checkpoint", list(checkpoints) if checkpoints else None)
    if "stack" in part.columns and stack is None and part["stack"].nunique() > 1:
        raise ValueError(f"several stacks ({', '.join(map(str, part['stack'].unique()))}); pass stack=...")
    part = filter_eq(part, "stack", stack)
    part = pick_head(part, head)
    part, layer_desc = _layer_filter(part, layer)
    col = value_column(part)
    names = series_order(part["checkpoint"], checkpoints)
    runs = {n: part[part["checkpoint"].astype(str) == n] for n in names}
    present = set().union(*(present_roles(r, col) for r in runs.values()))  # roles no checkpoint has: omitted
    q_order = [r for r in ordered_roles(part["query_role"]) if r in present]
    k_order = [r for r in ordered_roles(part["key_role"]) if r in present]
    palette = role_palette([*q_order, *k_order])
    # Examples and layers are averaged with equal weight; every panel has the same rows and columns.
    tables = [absent_roles_blank(runs[n], col, q_order, k_order) for n in names]
    values = np.concatenate([t.to_numpy(dtype=float).ravel() for t in tables])
    lo, hi, ticks = nice_range(min(0.0, float(np.nanmin(values))), float(np.nanmax(values)) or 1.0)
    cell = 0.62
    rows, cols = grid_shape(len(names))
    fig = new_figure((cell * len(k_order) + 1.0) * cols + 2.4, (cell * len(q_order) + 1.6) * rows + 0.8)
    axes = panel_grid(fig, len(names))
    for i, (ax, name, table) in enumerate(zip(axes, names, tables)):
        sns.heatmap(
            table,
            ax=ax,
            cmap=MAP_CMAP,
            vmin=lo,
            vmax=hi,
            annot=True,
            fmt=fmt,
            cbar=False,
            annot_kws={"fontsize": 8},
            linewidths=0.5,
            linecolor="white",
        )
        ax.set_facecolor("white")  # absent-role cells stay white and read n/a, unlike 0.00 cells
        for r, c in zip(*np.nonzero(np.isnan(table.to_numpy(dtype=float)))):
            ax.text(c + 0.5, r + 0.5, NA_TEXT, ha="center", va="center", fontsize=7, color="0.55", gid="n/a")
        first_col, last_row = i % cols == 0, i + cols >= len(names)
        ax.set_title(str(name), fontsize=10)
        ax.set_xlabel("key role (attended to)" if last_row else "")
        ax.set_ylabel("query role (attending)" if first_col else "")
        ax.tick_params(axis="x", rotation=45, labelbottom=last_row)
        ax.tick_params(axis="y", rotation=0, labelleft=first_col)
        for t in ax.get_xticklabels():
            t.set_color(role_color(t.get_text(), palette))
            t.set_horizontalalignment("right")
        for t in ax.get_yticklabels():
            t.set_color(role_color(t.get_text(), palette))
    mappable = ScalarMappable(norm=mcolors.Normalize(vmin=lo, vmax=hi), cmap=MAP_CMAP)
    cbar = fig.colorbar(mappable, ax=list(axes), shrink=0.85, label=f"query role → key role ({MASS})")
    set_colorbar_ticks(cbar, ticks)
    parts = [
        p
        for p in (
            f"{stack} stack" if stack else "",
            layer_desc,
            "head mean" if head == "mean" else f"head {head}" if head is not None else "",
        )
        if p
    ]
    n = part["example"].nunique() if "example" in part.columns else None
    if n:
        parts.append(f"mean over {n} examples")
    if any(np.isnan(t.to_numpy(dtype=float)).any() for t in tables):
        parts.append(f"{NA_TEXT}: the checkpoint has no such role")
    suptitle(fig, (title or "Role-to-role attention flow") + ("\n" + ", ".join(parts) if parts else ""))
    return fig
