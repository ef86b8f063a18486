"""report.html: rendered from the jinja2 template, self-contained, dicts as tables, everything escaped."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import pandas as pd

from anchorlens.figures import figure_to_png_bytes
from anchorlens.figures._style import new_figure
from anchorlens.reports.html import render_report

FACTS = {
    "base": "tiny-llama",
    "base_fingerprint": {"model_type": "llama", "num_layers": 4, "hash": "13207f84b133"},
    "trainable_parameters": {"base": 0, "prompt:n=10": 640, "big": 1234567},
    "examples": 8,
    "checkpoints": ["base", "prompt:n=10"],
}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _png() -> bytes:
    fig = new_figure(2, 2)
    fig.subplots().plot([0, 1], [0, 1])
    return figure_to_png_bytes(fig, dpi=30)


def _render() -> str:
    grid = pd.DataFrame({"anchor mass": ["0.088 [0.08, 0.09]", "<b>x</b>"]}, index=["base", "prompt:n=10"])
    return render_report(
        "compare: base vs <instance>", FACTS, grid, [("map of <soft_prompt> ×10", _png())], notes=["a & b"]
    )


def test_report_is_self_contained_and_has_no_python_reprs():
    html = _render()
    parsed = _Tags()
    parsed.feed(html)
    tags = [t for t, _ in parsed.tags]
    assert "script" not in tags and "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing from the network
    assert "link" not in tags  # no external stylesheet
    assert "{'" not in html and "['" not in html  # no dict or list reprs
    imgs = [a for t, a in parsed.tags if t == "img"]
    assert len(imgs) == 1 and imgs[0]["src"].startswith("data:image/png;base64,")
    assert base64.b64decode(imgs[0]["src"].split(",", 1)[1]).startswith(b"\x89PNG")


def test_nested_dicts_are_tables_and_values_escaped():
    html = _render()
    parsed = _Tags()
    parsed.feed(html)
    nested = [a for t, a in parsed.tags if t == "table" and a.get("class") == "nested"]
    assert len(nested) == 2  # base_fingerprint and trainable_parameters
    text = "".join(parsed.text)
    assert "model_type" in text and "13207f84b133" in text and "1,234,567" in text
    assert "base, prompt:n=10" in text  # a list as text, not ['base', ...]
    assert "&lt;instance&gt;" in html and "<instance>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html  # table cells escaped
    assert "a &amp; b" in html
    assert "<b>Figure 1:</b> map of &lt;soft_prompt&gt; ×10" in html


def test_a_fact_that_was_not_recorded_is_a_dash_not_none():
    grid = pd.DataFrame({"x": ["1"]}, index=["base"])
    html = render_report("t", {"base_provenance": {"repo_id": None, "spec": "smollm2-135m"}, "seed": None}, grid, [])
    assert "None" not in html
    assert html.count('<span class="missing" title="not recorded">—</span>') == 2
