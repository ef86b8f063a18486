"""Per-layer metric curves with confidence bands, one line per checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator

from anchorlens.figures._frames import HeadChoice, filter_eq, pick_head, require_single, summarize
from anchorlens.figures._labels import frame_measure_label, measure_text, single
from anchorlens.figures._style import dodge, new_figure, series_colors, series_markers, series_order, suptitle

_ANCHOR_METRICS = ("anchor_mass", "first_token_mass")


def _layer_axis(ax, layers: pd.Series) -> None:
    """Whole-number layer ticks inside the drawn layers (no tick at -1 or past the last layer)."""
    lo, hi = int(layers.min()), int(layers.max())
    ax.set_xlim(lo - 0.5, hi + 0.5)
    ticks = [int(t) for t in MaxNLocator(integer=True).tick_values(lo, hi) if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))


def layer_curves(
    summary_df: pd.DataFrame,
    metric: str | Sequence[str],
    *,
    by: str = "checkpoint",
    stack: str | None = None,
    head: HeadChoice = "mean",
    query_role: str | None = None,
    key_role: str | None = None,
    order: Sequence[str] | None = None,
    title: str | None = None,
    anchors: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Figure:
    """Per-layer mean with 95% CI band, one line per ``by`` value; rows per metric, columns per stack.

    ``summary_df`` may be a summary (``mean, ci_lo, ci_hi, n``) or raw tidy rows (``value``), which are
    summarised over examples (percentile bootstrap) here. Lines follow ``order`` (default: order of first
    appearance, i.e. the ``--ckpt`` order). ``anchors`` maps each series to the token at position 0
    (see :func:`anchor_tokens`): the anchor-mass axis and the legend then say which token it is.
    Axis labels name each measure and its unit from the rows' metric and roles; ``labels`` (metric ->
    axis label) overrides them, e.g. for headline rows whose ``metric`` column holds their label.
    """
    metrics = [metric] if isinstance(metric, str) else list(metric)
    df = filter_eq(summary_df, "metric", metrics)
    df = filter_eq(df, "stack", stack)
    df = pick_head(df, head)
    df = filter_eq(df, "query_role", query_role)
    df = filter_eq(df, "key_role", key_role)
    if by not in df.columns or "layer" not in df.columns:
        raise ValueError(f"need columns {by!r} and 'layer'; got {list(df.columns)}")
    stacks = list(dict.fromkeys(df["stack"])) if "stack" in df.columns else [None]
    facet = [c for c in ("metric", "stack") if c in df.columns]
    for m in metrics:
        part = df[df["metric"] == m] if "metric" in df.columns else df
        require_single(part, ["query_role", "key_role"], f"metric {m}")
    s = summarize(df, facet + [by, "layer"])
    if s.duplicated(facet + [by, "layer"]).any():
        raise ValueError("several summary rows per layer; filter the frame (e.g. by head or role) first")

    axis, texts = {}, {}
    for m in metrics:  # axis text from each metric's rows: measure and unit (roles read from the rows)
        rows = df[df["metric"] == m] if "metric" in df.columns else df
        axis[m] = (labels or {}).get(m) or frame_measure_label(rows, m, query_role, key_role)
        given = m if labels and m in labels else None
        texts[m] = given or measure_text(m, single(rows, "query_role", query_role), single(rows, "key_role", key_role))
    present = set(map(str, s[by]))
    series = [n for n in series_order(df[by], order) if n in present]
    colors, markers = series_colors(series), series_markers(series)
    n_r, n_c = len(metrics), len(stacks)
    fig = new_figure(4.2 * n_c + 1.8, 2.9 * n_r + 0.6)
    axes = fig.subplots(n_r, n_c, squeeze=False, sharex=True)
    for r, m in enumerate(metrics):
        for c, st in enumerate(stacks):
            ax = axes[r][c]
            part = s[s["metric"] == m] if "metric" in s.columns else s
            if st is not None:
                part = part[part["stack"] == st]
            for i, name in enumerate(series):
                line = part[part[by].astype(str) == name].sort_values("layer")
                if line.empty:
                    continue
                x = line["layer"] + dodge(i, len(series))  # side by side, so equal lines both show
                label = name + (f" (anchor: {anchors[name]})" if anchors and name in anchors else "")
                ax.plot(x, line["mean"], marker=markers[name], ms=4, lw=1.6, color=colors[name], label=label)
                if {"ci_lo", "ci_hi"} <= set(line.columns):
                    ax.fill_between(x, line["ci_lo"], line["ci_hi"], color=colors[name], alpha=0.2, lw=0)
            _layer_axis(ax, s["layer"])
            ax.grid(alpha=0.3, lw=0.5)
            if n_r * n_c > 1:
                ax.set_title(texts[m] + (f" ({st} stack)" if st is not None and n_c > 1 else ""), fontsize=10)
            if c == 0:
                anchor_note = "\n(attention to position 0)" if m in _ANCHOR_METRICS and anchors else ""
                ax.set_ylabel(axis[m] + anchor_note)
            if r == n_r - 1:
                ax.set_xlabel("layer")
    handles, labels = axes[0][0].get_legend_handles_labels()
    # Right of the panels, vertically centred: never over the title or the data.
    fig.legend(handles, labels, loc="outside right center", title=by, fontsize=8, title_fontsize=9, frameon=False)
    ns = sorted({int(v) for v in s["n"].dropna()}) if "n" in s.columns else []
    note = "shaded: 95% bootstrap CI" + (f" over n = {ns[0]} examples" if len(ns) == 1 else " over examples")
    suptitle(fig, (title or "Per-layer " + ", ".join(texts[m] for m in metrics)) + f"\n{note}")
    return fig
