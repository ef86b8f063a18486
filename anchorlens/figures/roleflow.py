"""Role-to-role attention flow: one query-role x key-role heatmap per checkpoint, shared scale."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure

from anchorlens.figures._frames import filter_eq, pick_head, value_column
from anchorlens.figures._style import MAP_CMAP, new_figure, ordered_roles, role_color, suptitle


def _layer_filter(df: pd.DataFrame, layer: int | str | None) -> tuple[pd.DataFrame, str]:
    if "layer" not in df.columns:
        return df, ""
    layers = sorted(df["layer"].unique().tolist())
    if layer is None or layer == "mean":
        return df, (f"mean over {len(layers)} layers" if len(layers) > 1 else f"layer {layers[0]}")
    return filter_eq(df, "layer", int(layer)), f"layer {int(layer)}"


def role_flow_heatmaps(
    df: pd.DataFrame,
    *,
    metric: str = "role_flow",
    layer: int | str | None = None,
    stack: str | None = None,
    head: int | None = -1,
    checkpoints: Sequence[str] | None = None,
    fmt: str = ".2f",
    title: str | None = None,
) -> Figure:
    """One annotated query-role x key-role heatmap per checkpoint, all on one colour scale."""
    part = filter_eq(df, "metric", metric)
    part = filter_eq(part, "checkpoint", list(checkpoints) if checkpoints else None)
    if "stack" in part.columns and stack is None and part["stack"].nunique() > 1:
        raise ValueError(f"several stacks ({', '.join(map(str, part['stack'].unique()))}); pass stack=...")
    part = filter_eq(part, "stack", stack)
    part = pick_head(part, head)
    part, layer_desc = _layer_filter(part, layer)
    col = value_column(part)
    names = list(checkpoints) if checkpoints else sorted(part["checkpoint"].unique(), key=str)
    q_order = ordered_roles(part["query_role"].unique())
    # Examples and layers are averaged with equal weight; each panel shows the key roles it has.
    tables = []
    for n in names:
        rows = part[part["checkpoint"] == n]
        tables.append(rows.groupby(["query_role", "key_role"])[col].mean().unstack("key_role")
                      .reindex(index=q_order, columns=ordered_roles(rows["key_role"].unique())))
    values = np.concatenate([t.to_numpy(dtype=float).ravel() for t in tables])
    lo = min(0.0, float(np.nanmin(values)))
    hi = float(np.nanmax(values)) or 1.0
    cell = 0.75
    widths = [cell * t.shape[1] + 0.4 for t in tables]
    fig = new_figure(sum(widths) + 2.2, cell * len(q_order) + 2.6)
    axes = fig.subplots(1, len(names), squeeze=False, sharey=True, width_ratios=widths)[0]
    for i, (ax, name, table) in enumerate(zip(axes, names, tables)):
        sns.heatmap(table, ax=ax, cmap=MAP_CMAP, vmin=lo, vmax=hi, annot=True, fmt=fmt, cbar=False,
                    annot_kws={"fontsize": 8}, linewidths=0.5, linecolor="white")
        ax.set_title(str(name), fontsize=10)
        ax.set_xlabel("key role (attended to)")
        ax.set_ylabel("query role (attending)" if i == 0 else "")
        ax.tick_params(axis="x", rotation=45)
        ax.tick_params(axis="y", rotation=0, labelleft=(i == 0))
        for t in ax.get_xticklabels():
            t.set_color(role_color(t.get_text()))
            t.set_horizontalalignment("right")
        for t in ax.get_yticklabels():
            t.set_color(role_color(t.get_text()))
    mappable = ScalarMappable(norm=mcolors.Normalize(vmin=lo, vmax=hi), cmap=MAP_CMAP)
    fig.colorbar(mappable, ax=list(axes), shrink=0.85, label="attention mass")
    parts = [p for p in (f"{stack} stack" if stack else "", layer_desc,
                         "head mean" if head == -1 else f"head {head}" if head is not None else "") if p]
    n = part["example"].nunique() if "example" in part.columns else None
    if n:
        parts.append(f"mean over {n} examples")
    suptitle(fig, (title or "Role-to-role attention flow") + ("\n" + ", ".join(parts) if parts else ""))
    return fig
