"""Writing figures to disk (never silently overwriting) and to PNG bytes for HTML reports.

By default every figure is written three times: PNG (to look at), PDF (TrueType fonts, pdf.fonttype 42, never
Type 3: journals and editors accept it and the text stays selectable) and SVG (text kept as text,
svg.fonttype ``none``: searchable and editable in Inkscape or Illustrator, and the smallest file; a viewer
without DejaVu Sans shows a similar sans-serif). Figures built at a print size (``figure_size("column")``)
get a 300 dpi PNG, others 150 dpi.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib as mpl
from matplotlib.figure import Figure

_KNOWN_FORMATS = {"png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp"}
DEFAULT_FORMATS: tuple[str, ...] = ("png", "pdf", "svg")
SCREEN_DPI, PRINT_DPI = 150, 300


def is_print_figure(fig: Figure) -> bool:
    """Whether ``fig`` was built at a print size preset (``column``, ``page``)."""
    return getattr(fig, "_anchorlens_size", "screen") in ("column", "page")


def default_dpi(fig: Figure) -> int:
    """300 dpi for a figure built at a print size preset, 150 otherwise."""
    return PRINT_DPI if is_print_figure(fig) else SCREEN_DPI


def _pad(fig: Figure) -> float:
    """Margin of the tight bounding box: none for print figures (their width is the preset's promise; the layout
    keeps its own margins inside it), matplotlib's 0.1 in otherwise."""
    return 0.0 if is_print_figure(fig) else 0.1


def save_figure(
    fig: Figure,
    path_without_suffix: str | Path,
    formats: Sequence[str] = DEFAULT_FORMATS,
    dpi: int | None = None,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Save ``fig`` once per format as ``<path>.<format>`` (default PNG, PDF and SVG; ``dpi`` default: 300 for a
    print-size figure, else 150); FileExistsError unless ``overwrite``."""
    base = Path(path_without_suffix)
    if base.suffix.lstrip(".").lower() in _KNOWN_FORMATS:
        base = base.with_suffix("")
    if not formats:
        raise ValueError("no formats given")
    targets = [base.with_name(f"{base.name}.{fmt.lstrip('.').lower()}") for fmt in formats]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"refusing to overwrite {', '.join(existing)}; pass overwrite=True")
    base.parent.mkdir(parents=True, exist_ok=True)
    resolution = default_dpi(fig) if dpi is None else dpi
    with mpl.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}):
        for target in targets:
            fig.savefig(target, dpi=resolution, format=target.suffix[1:], bbox_inches="tight", pad_inches=_pad(fig))
    return targets


def figure_to_png_bytes(fig: Figure, dpi: int | None = None) -> bytes:
    """PNG bytes of ``fig`` (e.g. to embed as base64 in HTML); ``dpi`` as :func:`save_figure`."""
    buf = io.BytesIO()
    fig.savefig(
        buf, format="png", dpi=default_dpi(fig) if dpi is None else dpi, bbox_inches="tight", pad_inches=_pad(fig)
    )
    return buf.getvalue()
