"""StreamingLLM-style attention maps (Xiao et al. 2024, Fig. 2): chosen layers averaged over many inputs.

One row per checkpoint, one column per chosen layer; each panel is the attention probability of query position
``i`` (y) to key position ``j`` (x), averaged over heads and over examples aligned by position from the first
token (:mod:`anchorlens.analyses.mean_maps`). The sink is the bright first input column. Cells no example could
see (the causal upper triangle, a knockout) are hatched n/a, never a colour of the scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib import colors as mcolors
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from anchorlens.analyses.mean_maps import MeanMaps
from anchorlens.figures._roles import GUIDANCE_NAMES, POOLED_COLORS, role_color
from anchorlens.figures._style import (
    MAP_CMAP,
    clean_token,
    fonts,
    legend_columns,
    new_figure,
    runs,
    size_preset,
    sized,
    suptitle,
)
from anchorlens.figures._ticks import nice_range, set_colorbar_ticks

MASK_FACE, MASK_EDGE, MASK_HATCH = "#e4e4e4", "#b0b0b0", "////"  # n/a cells: hatched grey (as attention_map_figure)
SINK_COLOR = POOLED_COLORS["sink"]
SCREEN_PANEL = 2.2  # inches per panel without a width limit
CBAR_ROOM = 1.2  # inches the colour bar and the row labels take


def _norm(scale: str, top: float) -> mcolors.Normalize:
    if scale == "linear":
        return mcolors.Normalize(vmin=0.0, vmax=top)
    if scale == "sqrt":
        return mcolors.PowerNorm(gamma=0.5, vmin=0.0, vmax=top)
    raise ValueError(f"scale must be 'linear' or 'sqrt'; got {scale!r}")


def _layers(maps: Mapping[str, MeanMaps], layers: Sequence[int] | None) -> list[int]:
    """The layers to draw: ``layers``, or those every checkpoint averaged; ValueError for one some lack."""
    common = [layer for layer in next(iter(maps.values())).layers if all(layer in m.layers for m in maps.values())]
    if layers is None:
        if not common:
            raise ValueError("the checkpoints' mean maps share no layer")
        return common
    missing = [(name, layer) for layer in layers for name, m in maps.items() if layer not in m.layers]
    if missing:
        name, layer = missing[0]
        raise ValueError(f"layer {layer} was not averaged for {name}; averaged layers: {maps[name].layers}")
    return list(layers)


def _count_text(values: Mapping[str, int], what: str) -> str:
    """``8 examples`` when every checkpoint has the same number, else ``8 (base), 6 (instance) examples``."""
    distinct = set(values.values())
    if len(distinct) == 1:
        return f"{distinct.pop()} {what}"
    return ", ".join(f"{v} ({k})" for k, v in values.items()) + f" {what}"


def _guidance_columns(m: MeanMaps, width: int) -> list[tuple[str, int, int]]:
    """(role, start, length) of runs of aligned key positions that are the same guidance role in every example."""
    out = []
    for role in GUIDANCE_NAMES:
        positions = [j for j in range(width) if m.key_role(j) == role]
        out += [(role, start, length) for start, length in runs(positions)]
    return out


@sized
def streaming_maps_figure(
    maps: Mapping[str, MeanMaps],
    *,
    layers: Sequence[int] | None = None,
    scale: str = "sqrt",
    vmax: float | None = None,
    title: str | None = None,
    cmap: str | mcolors.Colormap = MAP_CMAP,
) -> Figure:
    """Mean attention maps, one row per checkpoint (``maps``: name -> :class:`MeanMaps`), one column per layer.

    Every panel shares one colour scale (``scale``: ``sqrt``, the default, keeps small weights visible, or
    ``linear``). The sink column (the first input token, the same aligned position in every example) is marked
    with a triangle above it; inserted guidance columns a square (a bar over a run) in their role's colour; rows below a dashed line are
    averaged over fewer examples (shorter inputs end before them). The figure respects the current size preset
    (:func:`~anchorlens.figures.figure_size`).
    """
    if not maps:
        raise ValueError("no mean maps given")
    empty = [name for name, m in maps.items() if m.n_examples == 0]
    if empty:
        raise ValueError(f"no example was averaged for {empty[0]}")
    chosen = _layers(maps, layers)
    names = list(maps)
    means = {name: maps[name].mean() for name in names}
    panels = {(name, layer): means[name][maps[name].layers.index(layer)] for name in names for layer in chosen}
    data_max = max(float(np.nanmax(p)) if np.isfinite(p).any() else 0.0 for p in panels.values())
    top = float(vmax) if vmax is not None else nice_range(0.0, data_max if data_max > 0 else 1.0)[1]
    norm = _norm(scale, top)
    cmap_obj = (colormaps[cmap] if isinstance(cmap, str) else cmap).with_extremes(bad=(0, 0, 0, 0))

    preset, font = size_preset(), fonts()
    rows, cols = len(names), len(chosen)
    width = preset.max_width if preset.max_width is not None else SCREEN_PANEL * cols + CBAR_ROOM
    panel = (width - CBAR_ROOM) / cols
    fig = new_figure(width, rows * (panel + 0.25) + 1.1)
    grid = fig.subplots(rows, cols, squeeze=False)
    image = None
    shorter = False
    guidance_seen: list[str] = []
    sink_tokens: set[str | None] = set()
    for r, name in enumerate(names):
        m = maps[name]
        sink = m.sink_position
        if sink is not None:
            sink_tokens.add(m.sink_token)
        for c, layer in enumerate(chosen):
            ax = grid[r][c]
            qk = panels[(name, layer)]
            n_q, n_k = qk.shape
            ax.grid(False)
            ax.add_patch(
                Rectangle(
                    (-0.5, -0.5),
                    n_k,
                    n_q,
                    zorder=0,
                    gid="n/a",
                    facecolor=MASK_FACE,
                    edgecolor=MASK_EDGE,
                    hatch=MASK_HATCH,
                    lw=0.0,
                )  # fmt: skip
            )
            image = ax.imshow(
                np.ma.masked_invalid(qk), cmap=cmap_obj, norm=norm, interpolation="nearest", aspect="auto", zorder=1
            )
            marks = blended_transform_factory(ax.transData, ax.transAxes)
            for role, start, length in _guidance_columns(m, n_k):  # marks above the columns, not over the data
                centre = start + (length - 1) / 2
                ax.plot([centre], [1.02], marker="s", ms=3.5, color=role_color(role), transform=marks,
                        clip_on=False, zorder=5, gid=f"guidance:{role}")  # fmt: skip
                if length >= 3:
                    ax.add_line(
                        Line2D(
                            [start - 0.5, start + length - 0.5],
                            [1.02, 1.02],
                            transform=marks,
                            lw=1.5,
                            color=role_color(role),
                            clip_on=False,
                            zorder=5,
                        )  # fmt: skip
                    )
                guidance_seen += [role] if role not in guidance_seen else []
            if sink is not None:
                ax.plot([sink], [1.06], marker="v", ms=4, color=SINK_COLOR, transform=marks, clip_on=False,
                        zorder=5, gid="sink")  # fmt: skip
            full = m.complete_queries
            if full < n_q:
                ax.axhline(full - 0.5, color="#555555", lw=0.6, ls=(0, (3, 2)), zorder=4, gid="fewer")
                shorter = True
            ax.set_xlim(-0.5, n_k - 0.5)
            ax.set_ylim(n_q - 0.5, -0.5)
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(MaxNLocator(nbins=3, integer=True))
            ax.tick_params(labelsize=font.tick, length=2, pad=1)
            if r == 0:
                ax.set_title(f"layer {layer}", fontsize=font.panel, pad=8)
            if r == rows - 1:
                ax.set_xlabel("key position", fontsize=font.label)
            if c == 0:
                ax.set_ylabel(f"{name}\nquery position", fontsize=font.label)
    assert image is not None
    heads = _count_text({n: maps[n].heads for n in names}, "heads")
    examples = _count_text({n: maps[n].n_examples for n in names}, "examples")
    cbar = fig.colorbar(image, ax=grid.ravel().tolist(), shrink=0.9, pad=0.02, aspect=25)
    scale_note = "" if scale == "linear" else f", {scale} scale"
    cbar.set_label(
        f"query → key attention (probability){scale_note},\nmean over {heads} and {examples}", fontsize=font.label
    )
    set_colorbar_ticks(cbar, [t for t in nice_range(0.0, top)[2] if t <= top + 1e-12])
    cbar.ax.tick_params(labelsize=font.tick)

    handles: list[Artist] = []
    if sink_tokens:
        token = next(iter(sink_tokens)) if len(sink_tokens) == 1 else None
        text = f"sink: first input token {clean_token(token)!r}" if token else "sink: first input token"
        handles.append(Line2D([], [], color=SINK_COLOR, lw=0, marker="v", ms=4, label=text))
    handles += [
        Line2D([], [], color=role_color(g), lw=0, marker="s", ms=3.5, label=f"{g} (inserted guidance)")
        for g in guidance_seen
    ]
    handles.append(Patch(label="n/a: masked", facecolor=MASK_FACE, edgecolor=MASK_EDGE, hatch=MASK_HATCH, lw=0))
    if shorter:
        fewer = "below: fewer examples (shorter inputs)"
        handles.append(Line2D([], [], color="#555555", lw=0.6, ls=(0, (3, 2)), label=fewer))
    labels = [str(h.get_label()) for h in handles]
    ncols = min(2, legend_columns(labels, width))
    fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=font.legend, frameon=False)
    suptitle(
        fig,
        title or "Attention maps averaged over examples, aligned by position from the first token",
        fontsize=font.title,
    )
    return fig
