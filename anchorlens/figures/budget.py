"""Where input tokens' attention goes, per layer: the sink-aware decomposition as stacked bars per checkpoint.

Each bar splits the attention of input queries at one layer (mean over examples and heads) into the
sink (the first input token), the guidance (instance token, soft prompt or capsule, named by the
checkpoint's own guidance role) and every other key role of the run (structural, content and any
role a task defines), the sink excluded from them; a bar sums to 1. Parts come from the frame's
``key_role`` values; a part no checkpoint has is not drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, MaxNLocator

from anchorlens.analyses.frames import GUIDANCE, INPUT, per_head
from anchorlens.figures._frames import filter_eq
from anchorlens.figures._labels import MASS
from anchorlens.figures._roles import GUIDANCE_NAMES, ordered_roles, role_color, role_palette
from anchorlens.figures._style import fonts, grid_shape, new_figure, panel_grid, series_order, sized, suptitle
from anchorlens.figures._ticks import nice_range, tick_labels

SINK = "sink"
PART_NOTES = {SINK: "sink (first input token)"}


def budget_parts(df: pd.DataFrame) -> list[str]:
    """The parts a bar is split into, in drawing order: sink, guidance, then the other key roles of the run."""
    keys = [str(k) for k in dict.fromkeys(df["key_role"])]
    roles = [k for k in ordered_roles(k for k in keys if k not in (SINK, GUIDANCE)) if k not in GUIDANCE_NAMES]
    return [p for p in (SINK, GUIDANCE) if p in keys] + roles


def budget_table(df: pd.DataFrame, checkpoint: str) -> pd.DataFrame:
    """Layer x part means (over examples and heads) of one checkpoint's input-query decomposition."""
    rows = per_head(df[df["checkpoint"].astype(str) == checkpoint])
    table = rows.groupby(["layer", "key_role"])["value"].mean().unstack("key_role")
    table.index = pd.Index([int(v) for v in table.index], name="layer")
    return table.reindex(columns=budget_parts(df)).fillna(0.0)


def guidance_role(df: pd.DataFrame, checkpoint: str) -> str | None:
    """The guidance role a checkpoint's input queries attend to (None when it has no guidance)."""
    rows = df[(df["checkpoint"].astype(str) == checkpoint) & df["key_role"].isin(GUIDANCE_NAMES)]
    mass = rows.groupby("key_role")["value"].sum()
    mass = mass[mass > 0]
    return str(mass.idxmax()) if len(mass) else None


@sized
def attention_budget(
    df: pd.DataFrame,
    checkpoints: Sequence[str] | None = None,
    *,
    stack: str | None = None,
    title: str | None = None,
) -> Figure:
    """Stacked per-layer bars of where input queries' attention goes, one panel per checkpoint, one y scale (0–1).

    ``df``: tidy metric rows with a ``checkpoint`` column (a compare run's metrics); the
    ``decomposition`` rows of input queries are drawn. Panels follow ``checkpoints`` (default: order
    of appearance) and wrap into rows of at most three.
    """
    part = filter_eq(df, "metric", "decomposition", "metric")
    part = part[part["query_role"] == INPUT]
    if "stack" in part.columns and stack is None and part["stack"].nunique() > 1:
        raise ValueError(f"several stacks ({', '.join(map(str, part['stack'].unique()))}); pass stack=...")
    part = filter_eq(part, "stack", stack)
    names = series_order(part["checkpoint"], checkpoints)
    part = filter_eq(part, "checkpoint", names)
    tables = {n: budget_table(part, n) for n in names}
    shown = [p for p in budget_parts(part) if any(float(t[p].abs().max()) > 0 for t in tables.values())]
    guidance = {n: guidance_role(part, n) for n in names}
    palette = role_palette([*shown, *(g for g in guidance.values() if g)])
    rows, cols = grid_shape(len(names))
    n_layers = max(len(t) for t in tables.values())
    fig = new_figure(max(3.6, 0.16 * n_layers + 1.4) * cols + 1.8, 3.0 * rows + 1.0)
    axes = panel_grid(fig, len(names), sharey=True)
    legend: dict[tuple[int, str], Patch] = {}  # (part index, label): listed top of the stack first
    _, _, yticks = nice_range(0.0, 1.0)
    for i, (ax, name) in enumerate(zip(axes, names)):
        table = tables[name]
        bottom = np.zeros(len(table))
        for k, p in enumerate(shown):
            role = guidance[name] if p == GUIDANCE else p
            if role is None:
                continue  # no guidance in this checkpoint: nothing to stack (its input → guidance is 0)
            label = PART_NOTES.get(p, role if p == GUIDANCE else f"{p} (sink excluded)")
            color = role_color(role, palette)
            values = table[p].to_numpy(dtype=float)
            ax.bar(table.index, values, bottom=bottom, width=0.85, color=color, lw=0, label=label, gid=f"part:{p}")
            bottom += values
            legend.setdefault((k, label), Patch(facecolor=color, label=label))
        ax.set_title(name + (f" (anchor: {guidance[name]})" if guidance[name] else ""), fontsize=fonts().panel)
        ax.set_xlabel("layer")
        lo, hi = int(min(table.index)), int(max(table.index))
        ax.set_xlim(lo - 0.6, hi + 0.6)
        ax.xaxis.set_major_locator(
            FixedLocator([t for t in MaxNLocator(integer=True).tick_values(lo, hi) if lo <= t <= hi])
        )
        ax.set_ylim(0.0, 1.0)
        ax.yaxis.set_major_locator(FixedLocator(yticks))
        ax.set_yticks(yticks, tick_labels(yticks))
        if i % cols == 0:
            ax.set_ylabel(f"share of input queries' attention\n({MASS})")
    handles = [legend[key] for key in sorted(legend, key=lambda kl: (-kl[0], kl[1]))]
    fig.legend(handles=handles, loc="outside right center", fontsize=fonts().legend, frameon=False)
    n = part["example"].nunique() if "example" in part.columns else None
    heads = part["head"].dropna().nunique() if "head" in part.columns else None
    note = ", ".join(x for x in (f"{n} examples" if n else "", f"{heads} heads" if heads else "") if x)
    suptitle(fig, (title or "Where input tokens' attention goes, per layer") + (f"\nmean over {note}" if note else ""))
    return fig
