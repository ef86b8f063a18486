"""Per-layer metric curves with confidence bands, one line per checkpoint."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator

from anchorlens.figures._frames import HeadChoice, filter_eq, pick_head, require_single, summarize, value_column
from anchorlens.figures._labels import frame_measure_label, measure_text, single
from anchorlens.figures._roles import GUIDANCE_NAMES
from anchorlens.figures._style import (
    dodge,
    fonts,
    is_print,
    legend_columns,
    max_width,
    new_figure,
    series_colors,
    series_markers,
    series_order,
    size_preset,
    sized,
    suptitle,
)

_ANCHOR_METRICS = ("anchor_mass", "first_token_mass")


def _layer_axis(ax, layers: pd.Series) -> None:
    """Whole-number layer ticks inside the drawn layers (no tick at -1 or past the last layer)."""
    lo, hi = int(layers.min()), int(layers.max())
    ax.set_xlim(lo - 0.5, hi + 0.5)
    ticks = [int(t) for t in MaxNLocator(integer=True).tick_values(lo, hi) if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))


@sized
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
    sinks: Mapping[str, str] | None = None,
    present: Mapping[str, set[str]] | None = None,
) -> Figure:
    """Per-layer mean with 95% CI band, one line per ``by`` value; rows per metric, columns per stack.

    ``summary_df`` may be a summary (``mean, ci_lo, ci_hi, n``) or raw tidy rows (``value``), which are
    summarised over examples (percentile bootstrap) here. Lines follow ``order`` (default: order of first
    appearance, i.e. the ``--ckpt`` order), each checkpoint in its colour of that order. ``anchors`` maps each
    series to the token at position 0 (see :func:`anchor_tokens`): the anchor-mass axis and the legend then say
    which token it is; ``sinks`` maps each series to its sink token (:func:`sink_tokens`, the first input token),
    named ``(sink: …)`` in the legend. Axis labels name each measure and its unit from the rows' metric and roles;
    ``labels`` (metric -> axis label) overrides them, e.g. for headline rows whose ``metric`` column holds their label.

    A series with no value for a measure is left out of that panel, never drawn as 0, and the caption says
    why: its rows are NaN or flagged ``fixed`` (the mask fixes them), or the measure reads guidance keys
    and ``present`` (checkpoint -> its roles) shows the checkpoint has none (``n/a: no guidance``).

    At a print size (:func:`figure_size` ``column``/``page``) several metrics wrap into two columns of
    panels, each panel titled by its measure and its y axis by the unit, the legend below the panels.
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
    missing = _missing_series(df, metrics, by, present)
    s = summarize(df, facet + [by, "layer"])
    if s.duplicated(facet + [by, "layer"]).any():
        raise ValueError("several summary rows per layer; filter the frame (e.g. by head or role) first")

    axis, texts, units = {}, {}, {}
    for m in metrics:  # axis text from each metric's rows: measure and unit (roles read from the rows)
        rows = df[df["metric"] == m] if "metric" in df.columns else df
        axis[m] = (labels or {}).get(m) or frame_measure_label(rows, m, query_role, key_role)
        given = m if labels and m in labels else None
        texts[m] = given or measure_text(m, single(rows, "query_role", query_role), single(rows, "key_role", key_role))
        units[m] = _unit(axis[m], texts[m])
    every = series_order(df[by], order)
    present_names = set(map(str, s[by]))
    series = [n for n in every if n in present_names]
    colors, markers = series_colors(every), series_markers(every)  # by position in the full order: fixed colours
    printed = is_print()
    panels = [(m, st) for m in metrics for st in stacks]
    if printed and len(stacks) == 1 and len(metrics) > 1:
        n_r, n_c = -(-len(metrics) // 2), 2
    else:
        n_r, n_c = len(metrics), len(stacks)
    if printed:
        limit = max_width() or 5.5
        fig = new_figure(min(limit, 2.75 * n_c + 0.3), size_preset().panel_height * n_r + 1.1)
    else:
        fig = new_figure(4.2 * n_c + 1.8, 2.9 * n_r + 0.6)
    grid = fig.subplots(n_r, n_c, squeeze=False, sharex=True)
    flat = [grid[i // n_c][i % n_c] for i in range(n_r * n_c)]
    for ax in flat[len(panels) :]:
        ax.remove()
    notes: dict[str, set[str]] = {}
    for idx, (m, st) in enumerate(panels):
        ax = flat[idx]
        r, c = (
            (idx // n_c, idx % n_c)
            if printed and n_c == 2 and len(stacks) == 1
            else (metrics.index(m), stacks.index(st))
        )
        part = s[s["metric"] == m] if "metric" in s.columns else s
        if st is not None:
            part = part[part["stack"] == st]
        for i, name in enumerate(series):
            reason = missing.get((m, name))
            if reason:
                notes.setdefault(reason, set()).add(name)
                continue
            line = part[part[by].astype(str) == name].sort_values("layer")
            line = line[line["mean"].notna()]
            if line.empty:
                continue
            x = line["layer"] + dodge(i, len(series))  # side by side, so equal lines both show
            label = _series_label(name, anchors, sinks)
            ms, lw = (3.0, 1.1) if printed else (4.0, 1.6)
            ax.plot(x, line["mean"], marker=markers[name], ms=ms, lw=lw, color=colors[name], label=label, gid=label)
            if {"ci_lo", "ci_hi"} <= set(line.columns):
                ax.fill_between(x, line["ci_lo"], line["ci_hi"], color=colors[name], alpha=0.2, lw=0)
        _layer_axis(ax, s["layer"])
        ax.grid(alpha=0.3, lw=0.5)
        anchor_note = "\n(attention to position 0)" if m in _ANCHOR_METRICS and anchors else ""
        if printed and len(panels) > 1:
            ax.set_title(_wrap(texts[m] + (f" ({st} stack)" if st is not None and len(stacks) > 1 else ""), 40))
            ax.set_ylabel(_wrap(units[m] + anchor_note, 28))
        else:
            if n_r * n_c > 1:
                ax.set_title(
                    texts[m] + (f" ({st} stack)" if st is not None and n_c > 1 else ""), fontsize=fonts().panel
                )
            if c == 0:
                ax.set_ylabel(axis[m] + anchor_note)
        if r == n_r - 1 or (printed and idx + n_c >= len(panels)):
            ax.set_xlabel("layer")
            ax.xaxis.set_tick_params(labelbottom=True)
    handles, labels_ = [], []
    for ax in flat[: len(panels)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels_:
                handles.append(h)
                labels_.append(lab)
    order_of = {_series_label(n, anchors, sinks): i for i, n in enumerate(every)}
    pairs = sorted(zip(handles, labels_), key=lambda p: order_of.get(p[1], len(order_of)))
    handles, labels_ = [p[0] for p in pairs], [p[1] for p in pairs]
    if printed:  # below the panels, as many columns as fit: never over a title or a label
        ncols = legend_columns(labels_, fig.get_figwidth() - 0.2)
        fig.legend(handles, labels_, loc="outside lower center", ncols=ncols, title=by, frameon=False)
    else:  # right of the panels, vertically centred: never over the title or the data
        fig.legend(
            handles,
            labels_,
            loc="outside right center",
            title=by,
            fontsize=fonts().legend,
            title_fontsize=fonts().label,
            frameon=False,
        )
    ns = sorted({int(v) for v in s["n"].dropna()}) if "n" in s.columns else []
    note = "shaded: 95% bootstrap CI" + (f" over n = {ns[0]} examples" if len(ns) == 1 else " over examples")
    for reason, names in notes.items():
        note += f"; n/a: {reason} ({', '.join(n for n in series if n in names)}, not drawn)"
    suptitle(fig, (title or "Per-layer " + ", ".join(texts[m] for m in metrics)) + f"\n{note}")
    return fig


def _series_label(name: str, anchors: Mapping[str, str] | None, sinks: Mapping[str, str] | None) -> str:
    """Legend entry of a series: its name, its sink token and/or its anchor token when known."""
    extra = []
    if sinks and name in sinks:
        extra.append(f"sink: {sinks[name]}")
    if anchors and name in anchors:
        extra.append(f"anchor: {anchors[name]}")
    return name + (f" ({'; '.join(extra)})" if extra else "")


def _unit(axis_label: str, text: str) -> str:
    """The unit part of an axis label (``input → sink (attention mass)`` -> ``attention mass``)."""
    rest = axis_label[len(text) :].strip() if axis_label.startswith(text) else ""
    return rest[1:-1] if rest.startswith("(") and rest.endswith(")") else (rest or axis_label)


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _missing_series(
    df: pd.DataFrame, metrics: list[str], by: str, present: Mapping[str, set[str]] | None
) -> dict[tuple[str, str], str]:
    """(metric, series) -> why it has no value: all NaN, fixed by the mask, or guidance keys it has not got."""
    out: dict[tuple[str, str], str] = {}
    col = value_column(df)
    for (m, name), rows in df.groupby(["metric" if "metric" in df.columns else by, by], sort=False):
        m, name = str(m) if "metric" in df.columns else metrics[0], str(name)
        if "fixed" in rows.columns and rows["fixed"].fillna("").astype(str).str.len().gt(0).all():
            out[(m, name)] = str(rows["fixed"].iloc[0])
        elif rows[col].isna().all():
            out[(m, name)] = "no value"
        elif present is not None and name in present and _reads_guidance(rows):
            if not any(g in present[name] for g in GUIDANCE_NAMES):
                out[(m, name)] = "no guidance"
    return out


def _reads_guidance(rows: pd.DataFrame) -> bool:
    """Whether the rows measure attention to guidance keys (pooled ``guidance`` or a guidance role)."""
    if "key_role" not in rows.columns:
        return False
    keys = set(rows["key_role"].dropna().astype(str))
    return bool(keys) and keys <= {"guidance", *GUIDANCE_NAMES}
