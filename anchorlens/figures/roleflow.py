"""Role-to-role attention flow: one query-role x key-role heatmap per checkpoint, shared scale.

Rows and columns are the roles the run has (names and order from the frame, so a task's own roles
appear as they are); a role no checkpoint has is not drawn, and a role one checkpoint lacks reads
``n/a`` there, never 0.00. The template's field groups (``content:<field>``) follow the roles, past a
line: they split ``content`` (a row's field-group cells sum to its content cell), so a row sums to 1 over the
roles only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from anchorlens.figures._frames import HeadChoice, filter_eq, pick_head, value_column
from anchorlens.figures._labels import MASS
from anchorlens.figures._roles import ordered_roles, role_color, role_palette
from anchorlens.figures._style import (
    MAP_CMAP,
    fonts,
    grid_shape,
    is_print,
    max_width,
    new_figure,
    panel_grid,
    series_order,
    sized,
    suptitle,
    wrap_to,
)
from anchorlens.figures._ticks import nice_range, set_colorbar_ticks
from anchorlens.roles.table import is_field_group

NA_TEXT = "n/a"
ABSENT_REASON = "the checkpoint has no such role"
EMPTY_REASON = "no value (no visible key of the role, or fixed by the mask)"
NA_FACE, NA_EDGE, NA_HATCH = "#efefef", "#b0b0b0", "////"  # n/a cells: hatched light grey, as masked map cells


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


def fixed_cells(rows: pd.DataFrame, q_order: list[str], k_order: list[str]) -> pd.DataFrame:
    """Query-role x key-role reason a cell is fixed (every row of it flagged in ``fixed``, e.g. by the causal
    mask), else ""; all "" when the frame has no ``fixed`` column."""
    empty = pd.DataFrame("", index=q_order, columns=k_order)
    if "fixed" not in rows.columns or rows.empty:
        return empty
    flags = rows.assign(_f=rows["fixed"].fillna("").astype(str).replace("nan", ""))
    flagged = flags.groupby(["query_role", "key_role"])["_f"].agg(lambda v: v.iloc[0] if (v != "").all() else "")
    table = flagged.unstack("key_role").reindex(index=q_order, columns=k_order)
    return table.fillna("").astype(str)


def absent_roles_blank(rows: pd.DataFrame, col: str, q_order: list[str], k_order: list[str]) -> pd.DataFrame:
    """Query-role x key-role means of one checkpoint; roles its inputs lack are NaN (drawn as n/a)."""
    table = rows.groupby(["query_role", "key_role"])[col].mean().unstack("key_role")  # NaN rows (empty) skipped
    table = table.reindex(index=q_order, columns=k_order)
    present = present_roles(rows, col)
    table.loc[:, [k for k in k_order if k not in present]] = np.nan
    table.loc[[q for q in q_order if q not in present], :] = np.nan
    return table


def _field_lines(ax: Axes, q_order: list[str], k_order: list[str]) -> None:
    """A line before the first field-group row and column (``content:<field>``: parts of content, not roles)."""
    for order, draw in ((q_order, ax.axhline), (k_order, ax.axvline)):
        first = next((i for i, r in enumerate(order) if is_field_group(r)), None)
        if first:
            draw(first, color="0.2", lw=1.2, gid="field-groups")


@sized
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
    # Examples and layers are averaged with equal weight (NaN rows, empty queries, left out); every panel has the
    # same rows and columns. Cells the mask fixes are n/a: never a colour of the scale, never in its range.
    tables, reasons = [], []
    for checkpoint in names:
        table = absent_roles_blank(runs[checkpoint], col, q_order, k_order)
        fixed = fixed_cells(runs[checkpoint], q_order, k_order)
        tables.append(table.mask(fixed != ""))
        reasons.append(fixed)
    values = np.concatenate([t.to_numpy(dtype=float).ravel() for t in tables])
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 1.0
    lo, hi, ticks = nice_range(min(0.0, float(finite.min()) if finite.size else 0.0), top or 1.0)
    rows, cols = grid_shape(len(names))
    if is_print():
        cell = min(0.34, ((max_width() or 5.5) - 1.6) / max(1, cols * len(k_order) + 1.2 * cols))
        fig = new_figure((cell * len(k_order) + 0.5) * cols + 1.3, (cell * len(q_order) + 0.9) * rows + 1.0)
    else:
        cell = 0.62
        fig = new_figure((cell * len(k_order) + 1.0) * cols + 2.4, (cell * len(q_order) + 1.6) * rows + 0.8)
    axes = panel_grid(fig, len(names))
    notes: dict[str, list[str]] = {}
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
            annot_kws={"fontsize": fonts().note},
            linewidths=0.5,
            linecolor="white",
        )
        ax.set_facecolor("white")  # n/a cells: hatched grey and "n/a", unlike 0.00 cells
        for r, c in zip(*np.nonzero(np.isnan(table.to_numpy(dtype=float)))):
            have = present_roles(runs[name], col)
            absent = q_order[r] not in have or k_order[c] not in have
            why = reasons[i].iat[r, c] or (ABSENT_REASON if absent else EMPTY_REASON)
            notes.setdefault(why, [])
            cell_name = f"{q_order[r]} → {k_order[c]}"
            if why != ABSENT_REASON and cell_name not in notes[why] and len(notes[why]) < 4:
                notes[why].append(cell_name)
            ax.add_patch(
                Rectangle(
                    (c, r), 1, 1, facecolor=NA_FACE, edgecolor=NA_EDGE, hatch=NA_HATCH, lw=0.0, zorder=0.5, gid="n/a"
                )
            )
            ax.text(c + 0.5, r + 0.5, NA_TEXT, ha="center", va="center", fontsize=fonts().note, color="0.25", gid="n/a")
        _field_lines(ax, q_order, k_order)
        first_col, last_row = i % cols == 0, i + cols >= len(names)
        ax.set_title(
            wrap_to(str(name), fig.get_figwidth() / cols - 0.3) if is_print() else str(name), fontsize=fonts().panel
        )
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
    for reason, cells in notes.items():  # hatched n/a, with the reason
        parts.append(f"hatched {NA_TEXT}: {reason}" + (f" ({', '.join(cells)})" if cells else ""))
    suptitle(fig, (title or "Role-to-role attention flow") + ("\n" + ", ".join(parts) if parts else ""))
    return fig
