"""Writing figures to disk (never silently overwriting) and to PNG bytes for HTML reports."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

_KNOWN_FORMATS = {"png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp"}


def save_figure(
    fig: Figure,
    path_without_suffix: str | Path,
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Save ``fig`` once per format as ``<path>.<format>``; FileExistsError unless ``overwrite``."""
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
    for target in targets:
        fig.savefig(target, dpi=dpi, format=target.suffix[1:], bbox_inches="tight")
    return targets


def figure_to_png_bytes(fig: Figure, dpi: int = 150) -> bytes:
    """PNG bytes of ``fig`` (e.g. to embed as base64 in HTML)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()
