"""Paper-style attention heatmaps (keys on x, queries on y) with guidance and structural outlines."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib import colors as mcolors
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

from anchorlens.capture.maps import AttentionMaps, StackMaps
from anchorlens.figures._roles import GUIDANCE_NAMES, ordered_roles, role_color, role_labels, role_name, role_palette
from anchorlens.figures._style import (
    MAP_CMAP,
    clean_token,
    fonts,
    grid_shape,
    label_fontsize,
    legend_columns,
    max_width,
    new_figure,
    panel_grid,
    pick_ticks,
    runs,
    sized,
    suptitle,
    wrap_to,
)
from anchorlens.figures._ticks import log_ticks, nice_range, set_colorbar_ticks
from anchorlens.roles.kinds import ROLE_NAMES


class StackMapsLike(Protocol):
    """Anything shaped like ``StackMaps`` (probs [L,H,Q,K], layers, heads, roles, tokens)."""

    probs: Any
    layers: list[int]
    heads: list[int]
    q_roles: Any
    k_roles: Any
    q_tokens: list[str]
    k_tokens: list[str]


@dataclass
class AveragedStackMaps(StackMaps):
    """Mean of aligned ``StackMaps`` of several examples; tokens that differ become ``<role>``."""

    example_ids: list[Any] = field(default_factory=list)
    n_examples: int = 1


Selector = None | int | Literal["mean"]
MapsInput = StackMapsLike | AttentionMaps


def _as_stack(m: MapsInput, stack: str | None) -> tuple[StackMapsLike, str | None, Any]:
    """(stack maps, stack name, example id or ids) of one input."""
    if isinstance(m, AttentionMaps):
        name = stack or m.default_stack
        if name not in m.stacks:
            raise ValueError(f"stack {name!r} not captured; available: {', '.join(m.stacks)}")
        return m.stacks[name], name, m.example_id
    ids = getattr(m, "example_ids", None)
    return m, stack, ids


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return np.asarray(x)


def _role_values(x: Any) -> list[Any]:
    """A maps' role sequence as plain values (the ints of its role tensor), for comparing and averaging."""
    return list(x.tolist() if hasattr(x, "tolist") else x)


def _roles(x: Any, maps: Any = None) -> list[str]:
    """Role labels of a maps' role sequence: its ids named by the maps' own ``role_names`` (the run's roles, those a
    task added included), else built-in Role ints or names as given."""
    values = x.tolist() if hasattr(x, "tolist") else list(x)
    names = getattr(maps, "role_names", None)
    if names is not None and all(isinstance(v, int) and 0 <= v < len(names) for v in values):
        return [names[v] for v in values]
    return role_labels(values)


def _select(values: np.ndarray, axis_ids: Sequence[int], sel: Selector, what: str) -> tuple[np.ndarray, str]:
    """Mean over (or pick one of) the first axis; returns array without that axis and a description."""
    ids = list(axis_ids)
    if sel is None or sel == "mean":
        if len(ids) == 1:
            return values[0], f"{what} {ids[0]}"
        lo, hi = min(ids), max(ids)
        contiguous = sorted(ids) == list(range(lo, hi + 1))
        span = f" ({lo}–{hi})" if contiguous else f" ({', '.join(map(str, ids))})" if len(ids) <= 6 else ""
        return values.mean(axis=0), f"{what} mean over {len(ids)} {what}s{span}"
    if isinstance(sel, (int, np.integer)) and int(sel) in ids:
        return values[ids.index(int(sel))], f"{what} {int(sel)}"
    raise ValueError(f"{what} {sel!r} was not captured; choose 'mean' or one of {ids}")


def _reduce(sm: StackMapsLike, layer: Selector, head: Selector) -> tuple[np.ndarray, str, str]:
    """[Q, K] map after layer and head selection, with both descriptions."""
    probs = _np(sm.probs).astype(np.float64)
    if probs.ndim != 4:
        raise ValueError(f"probs must be [layers, heads, queries, keys]; got shape {probs.shape}")
    per_layer, ldesc = _select(probs, sm.layers, layer, "layer")  # [H, Q, K]
    qk, hdesc = _select(per_layer, sm.heads, head, "head")
    return qk, ldesc, hdesc


def _example_desc(ids: Any) -> str:
    if ids is None:
        return ""
    if isinstance(ids, (list, tuple)):
        if len(ids) == 1:
            return f"example {ids[0]}"
        shown = ", ".join(map(str, ids[:6])) + (", …" if len(ids) > 6 else "")
        return f"mean of {len(ids)} aligned examples ({shown})"
    return f"example {ids}"


MASK_FACE, MASK_EDGE, MASK_HATCH = "#e4e4e4", "#b0b0b0", "////"  # masked cells: hatched grey
BRACKET_MIN = 3  # runs of at least this many identical guidance tokens get one bracket label


def guidance_runs(tokens: Sequence[str], roles: Sequence[object]) -> list[tuple[int, int]]:
    """(start, length) of runs of >= BRACKET_MIN positions with one guidance role and one token text."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(roles)
    while i < n:
        j = i
        while j + 1 < n and roles[j + 1] == roles[i] and tokens[j + 1] == tokens[i]:
            j += 1
        if role_name(roles[i]) in GUIDANCE_NAMES and j - i + 1 >= BRACKET_MIN:
            out.append((i, j - i + 1))
        i = j + 1
    return out


def tick_plan(
    tokens: Sequence[str], roles: Sequence[object], max_labels: int
) -> tuple[list[int], list[str], list[tuple[int, int]], int]:
    """(tick positions, labels, bracketed runs, step): a run of identical guidance tokens gets one
    label at its middle (``<soft_prompt> ×100``) and a bracket; other positions are thinned as usual."""
    brackets = guidance_runs(tokens, roles)
    inside = {p for start, length in brackets for p in range(start, start + length)}
    rest = [i for i in range(len(roles)) if i not in inside]
    picked, step = pick_ticks([roles[i] for i in rest], max(1, max_labels - len(brackets)))
    ticks = {rest[i]: clean_token(tokens[rest[i]]) for i in picked}
    centres = [start + (length - 1) // 2 for start, length in brackets]
    ticks = {i: t for i, t in ticks.items() if all(abs(i - c) >= step for c in centres)}  # never on a run's label
    for (start, length), centre in zip(brackets, centres):
        ticks[centre] = f"{clean_token(tokens[start])} ×{length}"
    order = sorted(ticks)
    return order, [ticks[i] for i in order], brackets, step


def _bracket(ax: Any, axis: str, start: int, length: int, color: str) -> None:
    """A bracket just outside the axis spanning positions start .. start+length-1."""
    lo, hi = start - 0.5, start + length - 0.5
    if axis == "x":
        tr = blended_transform_factory(ax.transData, ax.transAxes)
        xs, ys = [lo, lo, hi, hi], [-0.004, -0.014, -0.014, -0.004]
    else:
        tr = blended_transform_factory(ax.transAxes, ax.transData)
        xs, ys = [-0.004, -0.014, -0.014, -0.004], [lo, lo, hi, hi]
    ax.add_line(Line2D(xs, ys, transform=tr, color=color, lw=1.2, clip_on=False, gid=f"bracket:{axis}"))


def _style_ticks(
    ax: Any, axis: str, tokens: Sequence[str], roles: Sequence[str], size_in: float, max_labels: int, palette: dict
) -> int:
    """Thinned, cleaned, role-coloured tick labels on one axis (guidance runs bracketed); returns the step."""
    floor = fonts().small  # at most as many labels as fit at the floor size along the axis: none overlap
    fitting = max(2, int(72.0 * size_in / (1.6 * floor)))
    ticks, labels, brackets, step = tick_plan(tokens, roles, min(max_labels, fitting))
    fs = label_fontsize(len(ticks), size_in)
    if axis == "x":
        ax.set_xticks(ticks, labels, rotation=90, fontsize=fs)
        tick_labels = ax.get_xticklabels()
    else:
        ax.set_yticks(ticks, labels, fontsize=fs)
        tick_labels = ax.get_yticklabels()
    for t, i in zip(tick_labels, ticks):
        t.set_color(role_color(roles[i], palette))
        if role_name(roles[i]) in GUIDANCE_NAMES:
            t.set_fontweight("bold")
    for start, length in brackets:
        _bracket(ax, axis, start, length, role_color(roles[start], palette))
    return step


def _outline(ax: Any, k_roles: Sequence[str], q_roles: Sequence[str]) -> None:
    """Thick box around guidance key columns (rows if only queries are guidance); dashed structural boxes."""
    n_q, n_k = len(q_roles), len(k_roles)
    for name in GUIDANCE_NAMES:
        kpos = [i for i, r in enumerate(k_roles) if role_name(r) == name]
        qpos = [i for i, r in enumerate(q_roles) if role_name(r) == name]
        # key columns when the guidance has keys, else its query rows
        boxes = [((s - 0.5, -0.5), n, n_q) for s, n in runs(kpos)] or [((-0.5, s - 0.5), n_k, n) for s, n in runs(qpos)]
        for xy, w, h in boxes:
            ax.add_patch(Rectangle(xy, w, h, fill=False, lw=2.0, ec=role_color(name), zorder=4, gid=f"guidance:{name}"))
    spos = [i for i, r in enumerate(k_roles) if r == "structural"]
    for start, length in runs(spos):
        ax.add_patch(
            Rectangle(
                (start - 0.5, -0.5),
                length,
                n_q,
                fill=False,
                lw=0.7,
                ls=(0, (3, 2)),
                ec=role_color("structural"),
                zorder=3,
                gid="structural",
            )
        )


def _mask_causal(qk: np.ndarray) -> np.ndarray:
    """Square maps whose strictly upper triangle is exactly 0 (causal mask) get it masked (drawn hatched grey)."""
    if qk.shape[0] == qk.shape[1] and qk.shape[0] > 1:
        upper = np.triu(np.ones(qk.shape, bool), k=1)
        if not qk[upper].any():
            return np.ma.masked_array(qk, mask=upper)
    return qk


def _norm(scale: str, vmax: float, positives: np.ndarray) -> mcolors.Normalize:
    if scale == "linear":
        return mcolors.Normalize(vmin=0.0, vmax=vmax)
    if scale == "sqrt":
        return mcolors.PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    if scale == "log":  # whole decades at both ends, so the ticks are 10^k
        lo = float(np.quantile(positives, 0.01)) if positives.size else vmax * 1e-4
        lo = max(lo, vmax * 1e-4)
        return mcolors.LogNorm(
            vmin=10.0 ** math.floor(math.log10(lo)), vmax=10.0 ** math.ceil(math.log10(vmax)), clip=True
        )
    raise ValueError(f"scale must be 'linear', 'sqrt' or 'log'; got {scale!r}")


@sized
def attention_map_figure(
    maps: Mapping[str, MapsInput] | MapsInput,
    *,
    stack: str | None = None,
    layer: Selector = None,
    head: Selector = None,
    title: str | None = None,
    scale: str = "sqrt",
    vmax: float | None = None,
    max_labels: int = 60,
    panel_size: float | None = None,
    cmap: str | mcolors.Colormap = MAP_CMAP,
) -> Figure:
    """One attention heatmap per checkpoint (keys on x, queries on y) on one shared, labelled colour scale.

    Panels wrap into rows of at most three. ``scale``: ``linear``, ``sqrt`` (default: small weights stay
    visible) or ``log``. Masked cells (the causal upper triangle) are hatched grey, never a colour of the
    scale, so tiny attention is not mistaken for the mask.
    """
    if not isinstance(maps, Mapping):
        maps = {"": maps}
    if not maps:
        raise ValueError("no maps given")
    panels = []
    for name, m in maps.items():
        sm, stack_name, ids = _as_stack(m, stack)
        qk, ldesc, hdesc = _reduce(sm, layer, head)
        parts = {
            "stack": f"{stack_name} stack" if stack_name else "",
            "layer": ldesc,
            "head": hdesc,
            "example": _example_desc(ids),
        }
        panels.append((str(name), sm, qk, parts))

    data_max = max(float(np.nanmax(p[2])) if p[2].size else 0.0 for p in panels)
    if vmax is not None:
        top = float(vmax)
    else:  # the scale ends on a nice number above the data (0.97 -> 1.0), never on the raw maximum
        top = nice_range(0.0, data_max if data_max > 0 else 1.0)[1] if scale != "log" else (data_max or 1.0)
    positives = np.concatenate([p[2][p[2] > 0].ravel() for p in panels])
    norm = _norm(scale, top, positives)
    if scale == "log":
        ticks = log_ticks(float(norm.vmin or top * 1e-4), float(norm.vmax or top))
    else:
        ticks = [t for t in nice_range(0.0, top)[2] if t <= top + 1e-12]
    names = ordered_roles(r for _, sm, _, _ in panels for r in _roles(sm.k_roles, sm) + _roles(sm.q_roles, sm))
    palette = role_palette(names)  # roles as the maps name them; built-ins keep their colours

    cmap_obj = (colormaps[cmap] if isinstance(cmap, str) else cmap).with_extremes(bad=(0, 0, 0, 0))
    n = len(panels)
    limit = max_width()
    if limit is not None:  # print: panels share the preset's width (two per row in a column), labels inside it
        rows, cols = grid_shape(n, 2 if limit < 6.0 else 3)
        fitted = (limit - 0.9) / cols
        panel_size = fitted if panel_size is None else min(panel_size, fitted)
        fig = new_figure(panel_size * cols + 0.9, (panel_size + 0.55) * rows + 1.2)
        axis_in = 0.6 * panel_size  # the heatmap's side once token labels and axis titles take their room
    else:
        if panel_size is None:
            longest = max(max(p[2].shape) for p in panels)
            panel_size = float(np.clip(4.0 + longest / 60.0, 4.5, 7.5))
        rows, cols = grid_shape(n)
        fig = new_figure(panel_size * cols + 1.6, (panel_size + 0.9) * rows + 1.0)
        axis_in = panel_size
    axes = panel_grid(fig, n, max_columns=cols)
    shared = {k for k in ("stack", "layer", "head", "example") if len({p[3][k] for p in panels}) == 1}
    image = None
    steps = []
    for ax, (name, sm, qk, parts) in zip(axes, panels):
        q_roles, k_roles = _roles(sm.q_roles, sm), _roles(sm.k_roles, sm)
        shown = _mask_causal(qk)
        ax.grid(False)
        if np.ma.is_masked(shown):  # transparent masked cells show this hatched layer
            ax.add_patch(
                Rectangle(
                    (-0.5, -0.5),
                    qk.shape[1],
                    qk.shape[0],
                    zorder=0,
                    gid="masked",
                    facecolor=MASK_FACE,
                    edgecolor=MASK_EDGE,
                    hatch=MASK_HATCH,
                    lw=0.0,
                )
            )
        image = ax.imshow(shown, cmap=cmap_obj, norm=norm, interpolation="nearest", aspect="auto", zorder=1)
        _outline(ax, k_roles, q_roles)
        steps.append(_style_ticks(ax, "x", sm.k_tokens, k_roles, axis_in, max_labels, palette))
        steps.append(_style_ticks(ax, "y", sm.q_tokens, q_roles, axis_in, max_labels, palette))
        ax.tick_params(length=2, pad=1)
        pad = 4 if limit is not None else 8
        ax.set_xlabel("key position (attended to)", labelpad=pad)
        ax.set_ylabel("query position (attending)", labelpad=pad)
        own = [parts[k] for k in ("stack", "layer", "head", "example") if k not in shared and parts[k]]
        head_text = wrap_to(name, panel_size - 0.2) if limit is not None else name
        ax.set_title(head_text + ("\n" + ", ".join(own) if own else ""), fontsize=fonts().panel)
    assert image is not None
    cbar = fig.colorbar(image, ax=list(axes), shrink=0.8, pad=0.01, aspect=30)
    cbar.set_label(
        "query → key attention (probability)"
        + ("" if scale == "linear" else f", {scale} colour scale")
        + ("\none scale for all panels" if n > 1 else "")
    )
    set_colorbar_ticks(cbar, ticks, log=scale == "log")

    handles: list[Artist] = [
        Line2D([], [], color=palette[r], lw=2.0, label=f"{r} (outlined)") for r in names if r in GUIDANCE_NAMES
    ]
    if "structural" in names:
        handles.append(Line2D([], [], color=palette["structural"], lw=1.0, ls=(0, (3, 2)), label="structural (dashed)"))
    handles += [
        Line2D([], [], color=palette[r], lw=0, marker="s", label=f"{r} (tick colour)")
        for r in names
        if r not in GUIDANCE_NAMES and r != "structural"
    ]
    if any(np.ma.is_masked(_mask_causal(p[2])) for p in panels):
        handles.append(
            Patch(label="masked (causal)", facecolor=MASK_FACE, edgecolor=MASK_EDGE, hatch=MASK_HATCH, lw=0.0)
        )
    if handles:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncols=min(len(handles), 5)
            if limit is None
            else legend_columns([str(h.get_label()) for h in handles], limit - 0.2),
            fontsize=fonts().legend,
            frameon=False,
        )

    caption = ", ".join(
        panels[0][3][k] for k in ("stack", "layer", "head", "example") if k in shared and panels[0][3][k]
    )
    if max(steps) > 1:
        caption += (", " if caption else "") + f"labels ≥ {max(steps)} positions apart (guidance/structural first)"
    suptitle(fig, (title or "Attention maps") + (f"\n{caption}" if caption else ""))
    return fig


def anchor_tokens(maps: Mapping[str, MapsInput], stack: str | None = None) -> dict[str, str]:
    """The key token at position 0 of each checkpoint's map (what "anchor mass" attends to), cleaned."""
    out = {}
    for name, m in maps.items():
        sm, _, _ = _as_stack(m, stack)
        if len(sm.k_tokens):
            out[str(name)] = clean_token(sm.k_tokens[0])
    return out


def sink_tokens(maps: Mapping[str, MapsInput], stack: str | None = None) -> dict[str, str]:
    """The first input key token of each checkpoint's map (the sink of the decomposition: guidance keys such as an
    ``<instance>`` token before it are skipped), cleaned; :func:`anchor_tokens` gives position 0 instead."""
    out = {}
    for name, m in maps.items():
        sm, _, _ = _as_stack(m, stack)
        first = next((t for t, role in zip(sm.k_tokens, _roles(sm.k_roles, sm)) if role not in GUIDANCE_NAMES), None)
        if first is not None:
            out[str(name)] = clean_token(first)
    return out


def _differences(a: Sequence[int], b: Sequence[int]) -> str:
    if len(a) != len(b):
        return f"lengths {len(a)} vs {len(b)}"
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    return f"position {i} is {role_name(a[i])} vs {role_name(b[i])}"


def average_maps_aligned(maps: Sequence[MapsInput], *, stack: str | None = None) -> AveragedStackMaps:
    """Average maps of several examples only when they share layers, heads and the exact role sequence."""
    if not maps:
        raise ValueError("no maps to average")
    items = [_as_stack(m, stack) for m in maps]
    ref, _, ref_id = items[0]
    ref_q, ref_k = _role_values(ref.q_roles), _role_values(ref.k_roles)
    ref_shape = tuple(_np(ref.probs).shape)
    hint = (
        "averaging positions that play different parts would mix them; pick one example "
        "(e.g. maps[0]) or only examples with the same template and field lengths"
    )
    for idx, (sm, _, ex_id) in enumerate(items[1:], start=1):
        who = f"example {ex_id}" if ex_id is not None else f"maps[{idx}]"
        if list(sm.layers) != list(ref.layers) or list(sm.heads) != list(ref.heads):
            raise ValueError(f"cannot average {who}: it has other layers/heads than maps[0]")
        for side, mine, theirs in (
            ("query", _role_values(sm.q_roles), ref_q),
            ("key", _role_values(sm.k_roles), ref_k),
        ):
            if mine != theirs:
                raise ValueError(
                    f"cannot average {who} with maps[0]: {side} roles differ ({_differences(theirs, mine)}); {hint}"
                )
        if tuple(getattr(sm, "role_names", ())) != tuple(getattr(ref, "role_names", ())):
            raise ValueError(f"cannot average {who} with maps[0]: they come from runs with other role tables")
        for attr in ("q_fields", "k_fields"):  # field names, when a maps object carries them
            if getattr(sm, attr, None) is not None and list(getattr(sm, attr)) != list(getattr(ref, attr, [])):
                raise ValueError(f"cannot average {who} with maps[0]: {attr} differ; {hint}")
        if tuple(_np(sm.probs).shape) != ref_shape:
            raise ValueError(f"cannot average {who}: probs shape {tuple(_np(sm.probs).shape)} vs {ref_shape}")

    # Already-averaged inputs count with their number of examples.
    weights = np.array([float(getattr(sm, "n_examples", 1)) for sm, _, _ in items])
    stacked = np.stack([_np(sm.probs).astype(np.float64) for sm, _, _ in items])
    mean = np.tensordot(weights / weights.sum(), stacked, axes=1)
    probs = torch.from_numpy(mean).to(torch.float32)

    def tokens(side: str, roles: list[int]) -> list[str]:
        seqs = [list(getattr(sm, f"{side}_tokens")) for sm, _, _ in items]
        names = names_q if side == "q" else names_k
        return [seqs[0][i] if all(s[i] == seqs[0][i] for s in seqs) else f"<{names[i]}>" for i in range(len(roles))]

    names_q, names_k = _roles(ref.q_roles, ref), _roles(ref.k_roles, ref)

    ids: list[Any] = []
    for i, (_, _, ex_id) in enumerate(items):
        if isinstance(ex_id, (list, tuple)):
            ids.extend(ex_id)
        else:
            ids.append(ex_id if ex_id is not None else i)
    return AveragedStackMaps(
        probs=probs,
        layers=list(ref.layers),
        heads=list(ref.heads),
        q_roles=torch.as_tensor(ref_q, dtype=torch.long),
        k_roles=torch.as_tensor(ref_k, dtype=torch.long),
        q_tokens=tokens("q", ref_q),
        k_tokens=tokens("k", ref_k),
        role_names=tuple(getattr(ref, "role_names", ROLE_NAMES)),
        example_ids=ids,
        n_examples=int(weights.sum()),
    )
