"""Role-to-role attention flow: one query-role x key-role heatmap per checkpoint, shared scale."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure

from anchorlens.figures._frames import HeadChoice, filter_eq, pick_head, value_column
from anchorlens.figures._style import (
    MAP_CMAP,
    end_ticks,
    grid_shape,
    new_figure,
    ordered_roles,
    panel_grid,
    role_color,
    series_order,
    suptitle,
)


def _layer_filter(df: pd.DataFrame, layer: int | str | None) -> tuple[pd.DataFrame, str]:
    if "layer" not in df.columns:
        return df, ""
    layers = sorted(df["layer"].unique().tolist())
    if layer is None or layer == "mean":
        return df, (f"mean over {len(layers)} layers" if len(layers) > 1 else f"layer {layers[0]}")
    return filter_eq(df, "layer", int(layer)), f"layer {int(layer)}"


def absent_roles_blank(rows: pd.DataFrame, col: str, q_order: list[str], k_order: list[str]) -> pd.DataFrame:
    """Query-role x key-role means of one checkpoint; roles its inputs lack are NaN.

    A role is present when it occurs as a query role (every position is a query) or receives
    non-zero attention; rows of absent query roles and columns of absent key roles become NaN.
    """
    table = rows.groupby(["query_role", "key_role"])[col].mean().unstack("key_role")
    table = table.reindex(index=q_order, columns=k_order)
    present = set(rows["query_role"]) | set(rows.loc[rows[col].abs() > 0, "key_role"])
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
    A role a checkpoint's inputs do not have (never a query role there, never attended to) is left
    blank, not drawn as 0.00.
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
    q_order = ordered_roles(part["query_role"].unique())
    k_order = ordered_roles(part["key_role"].unique())
    # Examples and layers are averaged with equal weight; every panel has the same rows and columns.
    tables = [absent_roles_blank(part[part["checkpoint"].astype(str) == n], col, q_order, k_order) for n in names]
    values = np.concatenate([t.to_numpy(dtype=float).ravel() for t in tables])
    lo = min(0.0, float(np.nanmin(values)))
    hi = float(np.nanmax(values)) or 1.0
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
        ax.set_facecolor("white")  # blank (absent role) cells stay white, unlike 0.00 cells
        first_col, last_row = i % cols == 0, i + cols >= len(names)
        ax.set_title(str(name), fontsize=10)
        ax.set_xlabel("key role (attended to)" if last_row else "")
        ax.set_ylabel("query role (attending)" if first_col else "")
        ax.tick_params(axis="x", rotation=45, labelbottom=last_row)
        ax.tick_params(axis="y", rotation=0, labelleft=first_col)
        for t in ax.get_xticklabels():
            t.set_color(role_color(t.get_text()))
            t.set_horizontalalignment("right")
        for t in ax.get_yticklabels():
            t.set_color(role_color(t.get_text()))
    mappable = ScalarMappable(norm=mcolors.Normalize(vmin=lo, vmax=hi), cmap=MAP_CMAP)
    cbar = fig.colorbar(mappable, ax=list(axes), shrink=0.85, label="attention mass (blank: role absent)")
    end_ticks(cbar, lo, hi)
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
    suptitle(fig, (title or "Role-to-role attention flow") + ("\n" + ", ".join(parts) if parts else ""))
    return fig
