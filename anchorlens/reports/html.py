"""A self-contained report.html rendered from a jinja2 template: inline images, tables; no script, CDN or network."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

TEMPLATES = Path(__file__).with_name("templates")
HEADLINE_NOTE = (
    "Mean over examples (each example averaged over layers and heads) with 95% bootstrap CI; "
    "Δ is the paired difference to the first checkpoint with Benjamini–Hochberg adjusted q."
)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The report templates, autoescaped (every value is HTML-escaped unless marked safe)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _image(png_or_svg: bytes, caption: str) -> dict[str, str]:
    """Caption, MIME type and base64 data of one embedded figure (PNG, or SVG when it starts like one)."""
    head = png_or_svg[:256].lstrip()
    mime = "image/svg+xml" if head.startswith((b"<svg", b"<?xml")) else "image/png"
    return {"caption": caption, "mime": mime, "data": base64.b64encode(png_or_svg).decode("ascii")}


def grid_html(grid: pd.DataFrame) -> Markup:
    """A grid of formatted cells (the headline table, the task effects) as escaped HTML."""
    return Markup(grid.to_html(escape=True, border=0, na_rep="—"))


def render_report(
    title: str,
    facts: Mapping,
    grid: pd.DataFrame,
    figures: Sequence[tuple[str, bytes]],
    notes: Sequence[str] = (),
    *,
    tables: Sequence[tuple[str, Markup]] = (),
) -> str:
    """The whole HTML document: facts (nested dicts as nested tables), the headline grid, embedded figures,
    then ``tables`` ((caption, already-escaped HTML) pairs)."""
    return (
        environment()
        .get_template("report.html.j2")
        .render(
            title=title,
            facts=dict(facts),
            grid_html=grid_html(grid),
            headline_note=HEADLINE_NOTE,
            notes=list(notes),
            figures=[_image(data, caption) for caption, data in figures],
            tables=[{"caption": caption, "html": html} for caption, html in tables],
        )
    )
