"""Shared look of every figure: the theme, series palettes, colormaps, token labels, figure creation.

Figures are made with ``matplotlib.figure.Figure`` plus an Agg canvas, never through pyplot, so
importing this package never switches the backend (a Jupyter inline backend stays as it is),
nothing is registered with pyplot (no duplicate display, no leaked figures) and ``plt.show`` is
never needed. In Jupyter the returned figure displays as the cell's value.

One seaborn theme for every figure is set here, once, when the package is imported.
"""

from __future__ import annotations

import functools
import math
import re
import textwrap
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec

import matplotlib as mpl
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.text import Text

from anchorlens.errors import UsageError
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
# Fonts a reader can edit and journals accept: TrueType (Type 42) in PDF/PS, never Type 3 bitmaps.
mpl.rcParams["pdf.fonttype"] = 42
mpl.rcParams["ps.fonttype"] = 42
# SVG keeps text as text (searchable, editable in Inkscape/Illustrator); viewers without DejaVu Sans
# fall back to a similar sans-serif, which is fine for a figure whose text fits with room to spare.
mpl.rcParams["svg.fonttype"] = "none"


@dataclass(frozen=True)
class FontScheme:
    """The font sizes (points at print size) every figure uses: one scheme per size preset."""

    title: float  # figure title (suptitle)
    panel: float  # panel titles
    label: float  # axis labels, colour-bar labels
    tick: float  # tick labels, token labels (upper bound; long token lists shrink towards ``small``)
    legend: float  # legend entries (legend titles use ``label``)
    note: float  # annotations inside panels, captions
    small: float  # the floor: no text of any figure is smaller


@dataclass(frozen=True)
class FigureSize:
    """A size preset: the widest a figure may be (inches, None for no limit) and its font scheme."""

    name: str
    max_width: float | None
    fonts: FontScheme
    panel_height: float  # height of one row of panels (inches)
    description: str


_SCREEN_FONTS = FontScheme(title=11.0, panel=10.0, label=9.0, tick=8.0, legend=8.0, note=7.5, small=6.0)
_PRINT_FONTS = FontScheme(title=8.0, panel=7.5, label=7.0, tick=6.5, legend=6.5, note=6.0, small=6.0)
FIGURE_SIZES: dict[str, FigureSize] = {
    "screen": FigureSize("screen", None, _SCREEN_FONTS, 2.9, "sized for a screen or the HTML report (default)"),
    "column": FigureSize("column", 5.5, _PRINT_FONTS, 1.9, "at most 5.5 in wide, text ≥ 6 pt at print size"),
    "page": FigureSize("page", 7.0, _PRINT_FONTS, 2.2, "at most 7.0 in wide, text ≥ 6 pt at print size"),
}
DEFAULT_FIGURE_SIZE = "screen"
_CURRENT_SIZE: ContextVar[str] = ContextVar("anchorlens_figure_size", default=DEFAULT_FIGURE_SIZE)


def size_preset(name: str | None = None) -> FigureSize:
    """The preset called ``name`` (default: the current one); UsageError naming the valid ones."""
    key = current_figure_size() if name is None else str(name).strip().lower()
    if key not in FIGURE_SIZES:
        raise UsageError(f"unknown figure size {name!r}; use one of: {', '.join(FIGURE_SIZES)}")
    return FIGURE_SIZES[key]


def current_figure_size() -> str:
    """Name of the size preset figures are built at now (``"screen"`` unless inside :func:`figure_size`)."""
    return _CURRENT_SIZE.get()


@contextmanager
def figure_size(name: str) -> Iterator[FigureSize]:
    """Build every figure inside the ``with`` block at preset ``name`` (``screen``, ``column``, ``page``).

    ``with figure_size("column"): fig = layer_curves(...)`` gives a figure at most 5.5 in wide whose
    text is at least 6 pt when printed at that width. Unknown names raise UsageError before the block runs.
    """
    preset = size_preset(name)
    token = _CURRENT_SIZE.set(preset.name)
    try:
        yield preset
    finally:
        _CURRENT_SIZE.reset(token)


def fonts() -> FontScheme:
    """The font scheme of the current size preset."""
    return size_preset().fonts


def is_print() -> bool:
    """Whether figures are built for print now (a preset with a width limit: ``column`` or ``page``)."""
    return size_preset().max_width is not None


def max_width() -> float | None:
    """The current preset's width limit in inches (None on screen)."""
    return size_preset().max_width


def font_rc(preset: FigureSize) -> dict[str, Any]:
    """matplotlib rc of a preset's font scheme (and thinner lines for print)."""
    f = preset.fonts
    rc: dict[str, Any] = {
        "font.size": f.label,
        "axes.titlesize": f.panel,
        "axes.labelsize": f.label,
        "xtick.labelsize": f.tick,
        "ytick.labelsize": f.tick,
        "legend.fontsize": f.legend,
        "legend.title_fontsize": f.label,
        "figure.titlesize": f.title,
    }
    if preset.max_width is not None:
        rc.update({"axes.linewidth": 0.6, "lines.linewidth": 1.2, "lines.markersize": 3.5, "patch.linewidth": 0.5})
        rc.update(
            {"xtick.major.width": 0.6, "ytick.major.width": 0.6, "xtick.major.size": 2.5, "ytick.major.size": 2.5}
        )
    return rc


def finish_figure(fig: Figure, preset: FigureSize) -> Figure:
    """Hold a built figure to its preset: no text under the scheme's floor, no wider than the preset's limit.

    Every text (titles, labels, tick labels of every axis and colour bar, legend entries, annotations) below
    ``fonts.small`` is raised to it; tick label sizes are set explicitly on each axis, so ticks matplotlib
    creates when it draws keep them. A figure still wider than the limit is narrowed to it.
    """
    floor = preset.fonts.small
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels(which="both") if t.get_text()]
            size = min((t.get_fontsize() for t in labels), default=preset.fonts.tick)
            axis.set_tick_params(which="both", labelsize=max(float(size), floor))
    for text in fig.findobj(Text):
        if isinstance(text, Text) and float(text.get_fontsize()) < floor:
            text.set_fontsize(floor)
    limit = preset.max_width
    if limit is not None and fig.get_figwidth() > limit + 1e-9:
        fig.set_size_inches(limit, fig.get_figheight())
    fig._anchorlens_size = preset.name  # type: ignore[attr-defined]  # save_figure picks the print dpi from it
    return fig


P = ParamSpec("P")


def sized(build: Callable[P, Figure]) -> Callable[P, Figure]:
    """Decorator of every public figure function: built with the current preset's fonts, then :func:`finish_figure`."""

    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Figure:
        preset = size_preset()
        with mpl.rc_context(font_rc(preset)):  # type: ignore[arg-type]  # keys are rc names
            fig = build(*args, **kwargs)
            return finish_figure(fig, preset)

    return wrapper


# Checkpoint (series) colours: Paul Tol's "muted" scheme, disjoint from every role colour (the colorblind
# palette and its dark variant, see _roles.py), so a checkpoint line never reads as a role. A checkpoint's
# colour is fixed by its position in the checkpoint order (``--ckpt`` order), the same in every figure.
CHECKPOINT_COLORS: tuple[str, ...] = (
    "#332288",  # indigo
    "#882255",  # wine
    "#44aa99",  # teal
    "#999933",  # olive
    "#aa4499",  # purple
    "#88ccee",  # cyan
    "#661100",  # brown
    "#6699cc",  # steel blue
    "#ddcc77",  # sand
    "#117733",  # dark green
)
SERIES_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
MAX_COLUMNS = 3  # multi-panel figures wrap into rows of at most this many panels
ROLE_COLORS: dict[str, str] = BUILTIN_COLORS  # the built-in roles' fixed colours (other roles: role_palette)
MAP_CMAP = "mako_r"  # perceptually uniform sequential; 0 is near-white
DIFF_CMAP = "vlag"  # diverging, used symmetric around 0
NAMED_POSITIONS: tuple[str, ...] = ("first", "after_structural", "middle", "last")


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout Figure with its own Agg canvas, unknown to pyplot.

    Under a print preset a figure wider than its limit is narrowed to it, its height by the square root
    of that factor (panels keep room for their text, which does not shrink with the figure).
    """
    limit = max_width()
    if limit is not None and width > limit:
        height *= math.sqrt(limit / width)
        width = limit
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    engine = fig.get_layout_engine()
    if limit is not None and isinstance(engine, ConstrainedLayoutEngine):  # print: thinner margins
        engine.set(w_pad=0.02, h_pad=0.02, wspace=0.03, hspace=0.03)
    return fig


def wrap_to(text: str, width_in: float, fontsize: float | None = None) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``fontsize`` (default: the panel-title size);
    long names without spaces (checkpoint specs) break after ``,`` ``:`` or ``+``."""
    size = fonts().panel if fontsize is None else fontsize
    chars = max(8, int(width_in * 72.0 / (0.58 * size)))
    if len(text) <= chars:
        return text
    spaced = re.sub(r"([,:+])(?=\S)", r"\1 ", text)
    lines = textwrap.wrap(spaced, chars, break_long_words=True)
    return "\n".join(line.replace(", ", ",").replace(": ", ":").replace("+ ", "+") for line in lines)


def legend_columns(labels: Sequence[str], width_in: float, fontsize: float | None = None, most: int = 6) -> int:
    """How many legend columns of ``labels`` fit side by side in ``width_in`` inches (a handle and gap each)."""
    size = fonts().legend if fontsize is None else fontsize
    longest = max((len(str(t)) for t in labels), default=1) * 0.6 * size + 3.2 * size  # text, handle, spacing
    return max(1, min(len(labels), most, int(width_in * 72.0 // longest)))


def suptitle(fig: Figure, text: str, fontsize: float | None = None) -> None:
    """Figure title in the scheme's title size, each line wrapped to the figure width so it is never clipped."""
    fontsize = fonts().title if fontsize is None else fontsize
    chars = max(20, int(fig.get_figwidth() * 72.0 / (0.55 * fontsize)))
    lines = [w for line in text.split("\n") for w in (textwrap.wrap(line, chars) or [""])]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


def series_colors(names: Sequence[str]) -> dict[str, str]:
    """Colour per series (checkpoint) by its position in ``names`` (pass the full checkpoint order, so a
    checkpoint keeps its colour in every figure); never a role colour."""
    return {n: CHECKPOINT_COLORS[i % len(CHECKPOINT_COLORS)] for i, n in enumerate(names)}


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


def label_fontsize(
    n_labels: int, length_in: float, largest: float | None = None, smallest: float | None = None
) -> float:
    """Font size (points) that fits ``n_labels`` along ``length_in`` inches without overlap (within the scheme's
    tick size and floor by default)."""
    largest = fonts().tick if largest is None else largest
    smallest = fonts().small if smallest is None else smallest
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
