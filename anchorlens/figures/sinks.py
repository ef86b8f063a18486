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

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from anchorlens.analyses.evidence_table import NORM, WEIGHT
from anchorlens.analyses.frames import head_means, per_head
from anchorlens.analyses.massive import COUNT as MASSIVE_COUNT
from anchorlens.analyses.massive import MEDIAN, POSITION, TOP
from anchorlens.analyses.sink_battery import (
    ALPHA_FIRST,
    ALPHA_TOP,
    SINK_HEAD,
    SINK_HEAD_ANY,
    SINK_RATE,
    SINK_RATE_ANY,
    eps_label,
)
from anchorlens.analyses.value_mass import NORM_SHARE
from anchorlens.figures._frames import filter_eq
from anchorlens.figures._roles import ordered_roles, role_palette
from anchorlens.figures._style import (
    MAP_CMAP,
    dodge,
    fonts,
    is_print,
    legend_columns,
    max_width,
    new_figure,
    panel_grid,
    series_colors,
    series_markers,
    series_order,
    size_preset,
    sized,
    suptitle,
)
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


@sized
def sink_alpha_grid(frame: pd.DataFrame, *, checkpoint: str | None = None, title: str | None = None) -> Figure:
    """Layer x head heatmap of alpha_h(first key), averaged over examples; colour bar on nice numbers."""
    rows = per_head(_rows(frame, ALPHA_FIRST, checkpoint))
    grid = _mean_by(rows, ["layer", "head"]).unstack("head").sort_index().sort_index(axis=1)
    grid.index = pd.Index([int(v) for v in grid.index], name="layer")
    grid.columns = pd.Index([int(v) for v in grid.columns], name="head")
    lo, hi, ticks = nice_range(0.0, float(np.nanmax(grid.to_numpy(dtype=float))))
    height = max(3.0, 0.28 * grid.shape[0] + 1.4)
    if is_print():  # rows of layers just over the floor font's height apart
        height = min(height, max(2.2, 0.16 * grid.shape[0] + 1.3))
    fig = new_figure(max(4.5, 0.45 * grid.shape[1] + 2.2), height)
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


@sized
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


@sized
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
        title_fontsize=fonts().legend,
    )
    suptitle(fig, title or "which tokens the heads sink on")
    return fig


@sized
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


@sized
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


EVIDENCE_MEASURE_TEXT = {WEIGHT: "by weight (attention probability)", NORM: "by norm ‖α v W_O‖ (Kobayashi et al. 2020)"}


def _evidence_measure_text(measure: str) -> str:
    """Panel title of an evidence-table measure (weight, norm, sink_rate@ε, sink_rate_any@ε, massive_count)."""
    if measure in EVIDENCE_MEASURE_TEXT:
        return EVIDENCE_MEASURE_TEXT[measure]
    name, _, eps = measure.partition("@")
    if name == SINK_RATE:
        return f"first key, ε = {eps}"
    if name == SINK_RATE_ANY:
        return f"any top key, ε = {eps}"
    if name == MASSIVE_COUNT:
        return "massive activations per layer"
    return measure


@sized
def evidence_curves(
    table: pd.DataFrame,
    measures: Sequence[str],
    *,
    key: str = "",
    checkpoints: Sequence[str] | None = None,
    stack: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
) -> Figure:
    """Per-layer rows of the evidence table (``evidence.csv``: input queries, mean over examples with its 95% bootstrap
    CI): one panel per measure, every checkpoint overlaid in its colour with its interval as a band, so the figure
    shows exactly the numbers of the table. ``key``: the key of the measures (``first_token``, ``sink``, an anchor
    role; ``""`` for sink rates and massive counts). ``stack`` defaults to the decoder (or the table's first)."""
    rows = table[table["layer"].notna() & table["measure"].isin(list(measures))]
    rows = rows[rows["key"].fillna("").astype(str) == key]
    if rows.empty:
        raise ValueError(f"no per-layer evidence rows of {', '.join(measures)} for key {key!r}")
    stacks = list(dict.fromkeys(rows["stack"].astype(str)))
    chosen = stack or ("decoder" if "decoder" in stacks else stacks[0])
    rows = rows[rows["stack"].astype(str) == chosen]
    every = series_order(rows["checkpoint"].astype(str), checkpoints)
    colors, markers = series_colors(every), series_markers(every)
    shown = [m for m in measures if (rows["measure"] == m).any()]
    printed = is_print()
    cols = min(len(shown), 2 if printed else 3)
    n_rows = -(-len(shown) // cols)
    if printed:
        fig = new_figure(min(max_width() or 5.5, 2.7 * cols + 0.4), size_preset().panel_height * n_rows + 1.2)
    else:
        fig = new_figure(4.2 * cols + 0.6, 3.0 * n_rows + 1.1)
    axes = panel_grid(fig, len(shown), max_columns=cols, sharey=True)
    layers = rows["layer"].astype(int)
    for idx, (ax, measure) in enumerate(zip(axes, shown)):
        part = rows[rows["measure"] == measure]
        present = [n for n in every if (part["checkpoint"].astype(str) == n).any()]
        for i, name in enumerate(present):
            line = part[part["checkpoint"].astype(str) == name].assign(_l=lambda d: d["layer"].astype(int))
            line = line.sort_values("_l")
            x = line["_l"] + dodge(i, len(present))
            ax.plot(
                x, line["mean"], marker=markers[name], ms=3, color=colors[name], label=name, gid=f"{measure}:{name}"
            )
            ax.fill_between(
                x, line["ci_lo"].astype(float), line["ci_hi"].astype(float), color=colors[name], alpha=0.2, lw=0
            )
        _layer_axis(ax, layers)
        ax.grid(alpha=0.3, lw=0.5)
        ax.set_title(_evidence_measure_text(measure))
        if idx % cols == 0:
            ax.set_ylabel(ylabel or VALUE_LABEL)
        if idx + cols >= len(shown):
            ax.set_xlabel("layer")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    pairs = sorted(zip(handles, labels), key=lambda p: every.index(p[1]))
    ncols = legend_columns([p[1] for p in pairs], fig.get_figwidth() - 0.2)
    fig.legend([p[0] for p in pairs], [p[1] for p in pairs], loc="outside lower center", ncols=ncols, frameon=False)
    ns = sorted({int(v) for v in rows["n"].dropna()})
    over = f"n = {ns[0]} examples" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]} examples"
    suptitle(fig, (title or "Evidence per layer") + f"\n{chosen} stack; mean over {over}, shaded: 95% bootstrap CI")
    return fig
