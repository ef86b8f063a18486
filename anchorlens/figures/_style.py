"""Shared look of every figure: the theme, series palettes, colormaps, token labels, figure creation.

Figures are made with ``matplotlib.figure.Figure`` plus an Agg canvas, never through pyplot, so
importing this package never switches the backend (a Jupyter inline backend stays as it is),
nothing is registered with pyplot (no duplicate display, no leaked figures) and ``plt.show`` is
never needed. In Jupyter the returned figure displays as the cell's value.

One seaborn theme for every figure is set here, once, when the package is imported.
"""

from __future__ import annotations

import math
import re
import textwrap
import unicodedata
from collections.abc import Iterable, Sequence

import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from anchorlens.figures._roles import BUILTIN_COLORS, GUIDANCE_NAMES, role_name

THEME: dict = {
    "context": "paper",
    "style": "ticks",
    "font_scale": 1.1,
    "rc": {
        "axes.titlesize": 10,
        "axes.labelsize": 9,
        "legend.fontsize": 8,
        "savefig.dpi": 150,
        "figure.dpi": 100,
        "axes.spines.top": False,
        "axes.spines.right": False,
    },
}
sns.set_theme(**THEME)

# Series (checkpoint) colours: the colorblind palette reordered so neighbours differ in hue and
# lightness (orange and vermillion, alike for many readers, are never the first five together).
_SERIES_ORDER = (0, 1, 2, 4, 5, 9, 7, 3, 6, 8)
SERIES_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
MAX_COLUMNS = 3  # multi-panel figures wrap into rows of at most this many panels
ROLE_COLORS: dict[str, str] = BUILTIN_COLORS  # the built-in roles' fixed colours (other roles: role_palette)
MAP_CMAP = "mako_r"  # perceptually uniform sequential; 0 is near-white
DIFF_CMAP = "vlag"  # diverging, used symmetric around 0
NAMED_POSITIONS: tuple[str, ...] = ("first", "after_structural", "middle", "last")


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout Figure with its own Agg canvas, unknown to pyplot."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def suptitle(fig: Figure, text: str, fontsize: float = 11.0) -> None:
    """Figure title, each line wrapped to the figure width so it is never clipped."""
    chars = max(20, int(fig.get_figwidth() * 72.0 / (0.55 * fontsize)))
    lines = [w for line in text.split("\n") for w in (textwrap.wrap(line, chars) or [""])]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


def series_colors(names: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """Colorblind-safe colour per series (checkpoint), in the given order."""
    pal = sns.color_palette("colorblind", 10)
    return {n: pal[_SERIES_ORDER[i % len(_SERIES_ORDER)]] for i, n in enumerate(names)}


def series_markers(names: Sequence[str]) -> dict[str, str]:
    """One marker per series, so lines stay distinguishable without colour."""
    return {n: SERIES_MARKERS[i % len(SERIES_MARKERS)] for i, n in enumerate(names)}


def series_order(values: Iterable[object], order: Sequence[str] | None = None) -> list[str]:
    """Series names in ``order`` when given, else in order of first appearance (e.g. ``--ckpt`` order)."""
    seen = list(dict.fromkeys(str(v) for v in values))
    if order is None:
        return seen
    wanted = [str(o) for o in order]
    return wanted + [v for v in seen if v not in wanted]


def dodge(i: int, n: int, width: float = 0.12) -> float:
    """Offset of series ``i`` of ``n`` so identical lines side by side stay visible (0 for one series)."""
    return 0.0 if n <= 1 else (i - (n - 1) / 2) * width / (n - 1)


def grid_shape(n: int, max_columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """(rows, columns) of a grid holding ``n`` panels, at most ``max_columns`` wide."""
    cols = max(1, min(n, max_columns))
    return math.ceil(max(n, 1) / cols), cols


def panel_grid(fig: Figure, n: int, max_columns: int = MAX_COLUMNS, **kw) -> list:
    """``n`` axes in a wrapped grid (row-major); unused cells removed."""
    rows, cols = grid_shape(n, max_columns)
    axes = fig.subplots(rows, cols, squeeze=False, **kw).ravel().tolist()
    for ax in axes[n:]:
        ax.remove()
    return axes[:n]


_REPLACE = {
    "\n": "⏎",
    "\r": "⏎",
    "\t": "⇥",
    "Ċ": "⏎",  # byte-level BPE newline
    "ĉ": "⇥",  # byte-level BPE tab
    "Ġ": " ",  # byte-level BPE space
    "▁": " ",  # sentencepiece space
}


def clean_token(token: str, max_len: int = 14, mathtext: bool = True) -> str:
    """Printable one-line tick label: BPE markers to spaces, newlines to ⏎; ``$`` escaped for matplotlib's mathtext unless ``mathtext=False`` (HTML)."""
    text = "".join(_REPLACE.get(ch, ch) for ch in str(token))
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] != "C")
    if text.strip() == "":
        return "␣" if text else "∅"
    if len(text) > max_len:
        text = text[: max_len - 1] + "…"
    return text.replace("$", r"\$") if mathtext else text


def pick_ticks(roles: Sequence[object], max_labels: int = 60) -> tuple[list[int], int]:
    """Positions to label, at least ``step`` apart (so at most ~``max_labels``); guidance, then
    structural, then special tokens are chosen first, content fills the gaps. Returns (ticks, step)."""
    n = len(roles)
    step = max(1, math.ceil(n / max(1, max_labels)))
    if step == 1:
        return list(range(n)), 1
    rank = {**{g: 0 for g in GUIDANCE_NAMES}, "structural": 1, "special": 2}
    order = sorted(range(n), key=lambda i: (rank.get(role_name(roles[i]), 3), i % step != 0, i))
    taken: list[int] = []
    for i in order:
        if all(abs(i - j) >= step for j in taken):
            taken.append(i)
    return sorted(taken), step


def label_fontsize(n_labels: int, length_in: float, largest: float = 8.0, smallest: float = 4.0) -> float:
    """Font size (points) that fits ``n_labels`` along ``length_in`` inches without overlap."""
    if n_labels <= 0:
        return largest
    return max(smallest, min(largest, 0.8 * 72.0 * length_in / n_labels))


def runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs ``(start, length)`` in sorted integer positions."""
    out: list[tuple[int, int]] = []
    for p in sorted(positions):
        if out and p == out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out


def position_key(value: object) -> tuple[int, float, str]:
    """Sort key: named positions (first, after_structural, middle, last), then ints, then other text."""
    text = str(value)
    if text in NAMED_POSITIONS:
        return (0, float(NAMED_POSITIONS.index(text)), "")
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        return (1, float(int(text)), "")
    return (2, 0.0, text)
