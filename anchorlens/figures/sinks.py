"""Figures of the sink battery and of massive activations, one per measure, from a run's metric rows.

- :func:`sink_alpha_grid`: layer x head heatmap of alpha_h(first key) (Gu et al. 2024).
- :func:`sink_rate_curves`: the sink rate per layer for every eps, first-key and any-key sinks, overall rate in
  the legend.
- :func:`sink_top_roles`: per layer, the share of heads whose top key (by received mass) has each role: sinks
  that are not the first token.
- :func:`massive_activations_figure`: per layer, the largest |h| and the thresholds it is flagged against
  (Sun et al. 2024), markers coloured by the role of the token carrying it.
- :func:`value_mass_curves`: per layer, the share of attention a key part gets by weight and by norm
  (||A v W_O||, Kobayashi et al. 2020) side by side.

Each takes the tidy rows of one checkpoint (``checkpoint=`` picks one when the frame has several): per-example rows,
or means over examples with their row counts ``n`` (``compare``'s bounded ``means``), each mean then weighing its
``n`` rows, which gives the same figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from anchorlens.analyses.frames import head_means, per_head
from anchorlens.analyses.massive import MEDIAN, POSITION, TOP
from anchorlens.analyses.sink_battery import ALPHA_FIRST, ALPHA_TOP, SINK_HEAD, SINK_HEAD_ANY, eps_label
from anchorlens.analyses.value_mass import NORM_SHARE
from anchorlens.figures._frames import filter_eq
from anchorlens.figures._roles import ordered_roles, role_palette
from anchorlens.figures._style import MAP_CMAP, new_figure, suptitle
from anchorlens.figures._ticks import nice_range, set_colorbar_ticks
from anchorlens.figures.curves import _layer_axis

ALPHA_LABEL = "α: mean attention the first key receives (attention mass)"
RATE_LABEL = "sink rate (share of heads)"
TOP_ROLE_LABEL = "share of heads whose top key has the role"
MASSIVE_LABEL = "largest |hidden state| (activation magnitude)"
VALUE_LABEL = "share of the attention (0–1)"


def _weighted(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``_w``: the rows each stands for (``n`` of a means frame, else 1; 0 where the value is NaN)."""
    weight = rows["n"].astype(float) if "n" in rows.columns else pd.Series(1.0, index=rows.index)
    value = rows["value"].astype(float)
    return rows.assign(_w=weight.where(value.notna(), 0.0), _wv=(value * weight).where(value.notna(), 0.0))


def _mean_by(rows: pd.DataFrame, by: str | list[str]) -> pd.Series:
    """Mean of ``value`` per ``by`` group, every per-example row counted once (:func:`_weighted`)."""
    sums = _weighted(rows).groupby(by)[["_wv", "_w"]].sum()
    return sums["_wv"] / sums["_w"].where(sums["_w"] > 0)


def _mean(rows: pd.DataFrame) -> float:
    """Mean of ``value`` over the rows, every per-example row counted once."""
    w = _weighted(rows)
    return float(w["_wv"].sum() / w["_w"].sum()) if w["_w"].sum() > 0 else float("nan")


def _shares(rows: pd.DataFrame, by: str, column: str) -> pd.DataFrame:
    """[by x values of ``column``] share of the rows (per-example rows counted once) per ``by`` group."""
    weight = rows["n"].astype(float) if "n" in rows.columns else pd.Series(1.0, index=rows.index)
    sums = weight.groupby([rows[by], rows[column]]).sum().unstack(fill_value=0.0)
    return sums.div(sums.sum(axis=1), axis=0)


def _rows(frame: pd.DataFrame, metric: str | list[str], checkpoint: str | None) -> pd.DataFrame:
    """Rows of ``metric`` (of ``checkpoint`` when given); ValueError when there are none."""
    out = filter_eq(filter_eq(frame, "checkpoint", checkpoint), "metric", metric)
    if out.empty:
        raise ValueError(f"no {metric!r} rows: run the sink_battery / massive_activations reducers")
    return out


def _eps_of(frame: pd.DataFrame) -> list[float]:
    """The thresholds of the ``sink_head@eps`` rows, ascending."""
    prefix = SINK_HEAD + "@"
    return sorted({float(m[len(prefix) :]) for m in frame["metric"].unique() if str(m).startswith(prefix)})


def sink_alpha_grid(frame: pd.DataFrame, *, checkpoint: str | None = None, title: str | None = None) -> Figure:
    """Layer x head heatmap of alpha_h(first key), averaged over examples; colour bar on nice numbers."""
    rows = per_head(_rows(frame, ALPHA_FIRST, checkpoint))
    grid = _mean_by(rows, ["layer", "head"]).unstack("head").sort_index().sort_index(axis=1)
    grid.index = pd.Index([int(v) for v in grid.index], name="layer")
    grid.columns = pd.Index([int(v) for v in grid.columns], name="head")
    lo, hi, ticks = nice_range(0.0, float(np.nanmax(grid.to_numpy(dtype=float))))
    fig = new_figure(max(4.5, 0.45 * grid.shape[1] + 2.2), max(3.0, 0.28 * grid.shape[0] + 1.4))
    ax = fig.subplots()
    sns.heatmap(
        grid,
        ax=ax,
        cmap=MAP_CMAP,
        vmin=lo,
        vmax=hi,
        annot=grid.size <= 160,
        fmt=".2f",
        linewidths=0.3,
        linecolor="white",
        cbar_kws={"label": ALPHA_LABEL, "shrink": 0.9},
    )
    set_colorbar_ticks(ax.collections[0].colorbar, ticks)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    roles = ", ".join(ordered_roles(rows["key_role"].unique()))
    suptitle(fig, title or f"attention sink on the first key ({roles}), Gu et al. 2024")
    return fig


def sink_rate_curves(frame: pd.DataFrame, *, checkpoint: str | None = None, title: str | None = None) -> Figure:
    """Sink rate per layer for every eps: first-key sinks (solid) and any-key sinks (dashed); overall rate in the
    legend."""
    heads = per_head(_rows(frame, [m for m in frame["metric"].unique() if "@" in str(m)], checkpoint))
    eps_values = _eps_of(heads)
    if not eps_values:
        raise ValueError("no sink_head@eps rows: run the sink_battery reducer")
    fig = new_figure(5.6, 3.4)
    ax = fig.subplots()
    colors = sns.color_palette("mako", n_colors=len(eps_values) + 1)
    for i, eps in enumerate(eps_values):
        for metric, style, what in ((SINK_HEAD, "-", "first key"), (SINK_HEAD_ANY, "--", "any top key")):
            part = heads[heads["metric"] == eps_label(metric, eps)]
            if part.empty:
                continue
            curve = _mean_by(part, "layer").sort_index()
            label = f"ε = {eps:g}, {what} (overall {_mean(part):.2f})"
            ax.plot(curve.index, curve.to_numpy(), style, marker="o", ms=3, color=colors[i], label=label, gid=label)
    _layer_axis(ax, heads["layer"])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel(RATE_LABEL)
    ax.legend(loc="best", frameon=False)
    suptitle(fig, title or "sink heads: α > ε (Gu et al. 2024)")
    return fig


def sink_top_roles(
    frame: pd.DataFrame, *, rank: int = 1, checkpoint: str | None = None, title: str | None = None
) -> Figure:
    """Per layer, stacked bars: the share of (example, head) cells whose rank-``rank`` key by received mass has each
    role (role colours of the run)."""
    rows = per_head(_rows(frame, f"{ALPHA_TOP}{rank}", checkpoint))
    shares = _shares(rows, "layer", "key_role").sort_index()
    roles = ordered_roles(shares.columns)
    palette = role_palette(roles)
    fig = new_figure(5.6, 3.4)
    ax = fig.subplots()
    bottom = np.zeros(len(shares))
    layers = [int(v) for v in shares.index]
    for role in roles:
        height = shares[role].to_numpy(dtype=float)
        for x, y0, hgt in zip(layers, bottom, height, strict=True):
            ax.bar(x, hgt, bottom=y0, color=palette[role], width=0.8, gid=f"role:{role}")
        bottom = bottom + height
    _layer_axis(ax, pd.Series(layers))
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.set_ylabel(TOP_ROLE_LABEL)
    ax.legend(
        handles=[Patch(color=palette[r], label=r) for r in reversed(roles)],
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        frameon=False,
        title=f"key ranked {rank}\nby received mass",
        title_fontsize=8,
    )
    suptitle(fig, title or "which tokens the heads sink on")
    return fig


def massive_activations_figure(
    frame: pd.DataFrame,
    *,
    abs_threshold: float = 100.0,
    ratio: float = 1000.0,
    checkpoint: str | None = None,
    title: str | None = None,
) -> Figure:
    """Per layer: the largest |h| (mean over examples, log scale), the absolute threshold and ``ratio`` x the median
    |h|; markers coloured by the role of the token that most often carries the largest entry."""
    rows = head_means(_rows(frame, [f"{TOP}1", f"{POSITION}1", MEDIAN], checkpoint))
    top = rows[rows["metric"] == f"{TOP}1"]
    median = _mean_by(rows[rows["metric"] == MEDIAN], "layer").sort_index()
    peak = _mean_by(top, "layer").sort_index()
    role = _shares(top, "layer", "query_role").idxmax(axis=1).reindex(peak.index)
    palette = role_palette(role.unique())
    fig = new_figure(5.6, 3.4)
    ax = fig.subplots()
    layers = [int(v) for v in peak.index]
    ax.plot(layers, peak.to_numpy(), "-", color="#555555", lw=1, zorder=1)
    for x, y, r in zip(layers, peak.to_numpy(), role.to_numpy(), strict=True):
        ax.scatter([x], [y], color=palette[r], s=28, zorder=2, gid=f"role:{r}")
    ax.plot(layers, (ratio * median).to_numpy(), ":", color="#2b2b2b", label=f"{ratio:g} × median |h|")
    ax.axhline(abs_threshold, ls="--", color="#2b2b2b", lw=1, label=f"|h| = {abs_threshold:g}")
    ax.set_yscale("log")
    _layer_axis(ax, pd.Series(layers))
    ax.set_xlabel("layer")
    ax.set_ylabel(MASSIVE_LABEL)
    handles = [Line2D([], [], marker="o", ls="", color=palette[r], label=f"top token: {r}") for r in palette]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], loc="best", frameon=False)
    suptitle(fig, title or "massive activations (Sun et al. 2024)")
    return fig


def value_mass_curves(
    frame: pd.DataFrame,
    *,
    key_role: str = "first_token",
    query_role: str = "all",
    checkpoint: str | None = None,
    title: str | None = None,
) -> Figure:
    """Per layer (mean over examples and heads): the share of ``query_role``'s attention ``key_role`` gets by weight
    (``role_flow``, or ``first_token_mass`` for ``first_token``) and by norm (``norm_share``), in the key's colour."""
    part = filter_eq(filter_eq(frame, "checkpoint", checkpoint), "query_role", query_role)
    part = per_head(part)
    norm = part[(part["metric"] == NORM_SHARE) & (part["key_role"] == key_role)]
    if key_role == "first_token":
        weight = part[part["metric"] == "first_token_mass"]
    else:
        weight = part[(part["metric"] == "role_flow") & (part["key_role"] == key_role)]
    if norm.empty or weight.empty:
        raise ValueError(
            f"no weight and norm rows for {query_role} → {key_role}: run value_mass beside role_flow / first_token"
        )
    color = role_palette([key_role])[key_role] if key_role != "first_token" else "#2b2b2b"
    fig = new_figure(5.6, 3.4)
    ax = fig.subplots()
    for rows, style, what in ((weight, "-", "by weight"), (norm, "--", "by norm ||A v W_O||")):
        curve = _mean_by(rows, "layer").sort_index()
        ax.plot(curve.index, curve.to_numpy(), style, marker="o", ms=3, color=color, label=what, gid=what)
    _layer_axis(ax, part["layer"])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"{query_role} queries → {key_role}: {VALUE_LABEL}")
    ax.legend(loc="best", frameon=False)
    suptitle(fig, title or f"{key_role}: weight vs value-aware mass (Kobayashi et al. 2020)")
    return fig
