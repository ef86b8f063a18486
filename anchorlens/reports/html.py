"""A self-contained report.html: inline PNGs (base64) and tables; no scripts, CDN or network."""
from __future__ import annotations

import base64
import html
from typing import Sequence

import pandas as pd

_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:.5em 0}figcaption{color:#555;font-size:13px}
code{background:#f6f6f6;padding:1px 4px}"""


def img_tag(png: bytes, alt: str) -> str:
    """An <img> with the PNG embedded as a data URI."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def render_report(title: str, facts: dict, grid: pd.DataFrame, figures: Sequence[tuple[str, bytes]], notes: Sequence[str] = ()) -> str:
    """The whole HTML document as a string."""
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<table>{rows}</table>",
        "<h2>Headline</h2>",
        "<p>Mean over examples (each example averaged over layers and heads) with 95% bootstrap CI; "
        "Δ is the paired difference to the first checkpoint with BH-adjusted q.</p>",
        grid.to_html(escape=True),
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        "<h2>Figures</h2>",
    ]
    for caption, png in figures:
        parts.append(f"<figure>{img_tag(png, caption)}<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)
