"""report.html and summary.md of a compare run read like a results section: summary with links, the headline
table first, numbered tables and figure captions, run details folded, no Python reprs; checked by parsing them."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from anchorlens.reports.html import Document, Plot, Sentence, Table, citations, fact_html, render_document
from anchorlens.reports.results import exactness_grid

VOID = {"img", "br", "meta", "hr", "input", "link", "source", "col", "area", "base", "embed", "wbr"}


class Outline(HTMLParser):
    """What a reader sees, in order: headings, tables (with the ids around them), captions, links, text."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.ids: list[str] = []
        self.tables: list[list[str]] = []  # the ids enclosing each <table class=dataframe>, in order
        self.headings: list[tuple[str, str]] = []
        self.captions: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []
        self._grab: list[str] | None = None
        self.details_ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.append(attrs["id"])
            if any(t == "details" for t, _ in self.stack):
                self.details_ids.append(attrs["id"])
        if tag == "table" and "dataframe" in (attrs.get("class") or ""):
            self.tables.append([i for _, i in self.stack if i])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        if tag in ("h2", "h3", "figcaption"):
            self._grab = []
        if tag not in VOID:
            self.stack.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        if tag in ("h2", "h3", "figcaption") and self._grab is not None:
            text = "".join(self._grab).strip()
            if tag == "figcaption":
                self.captions.append(text)
            else:
                self.headings.append((tag, text))
            self._grab = None
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if any(tag in ("script", "style") for tag, _ in self.stack):
            return  # code, not text a reader sees
        self.text.append(data)
        if self._grab is not None:
            self._grab.append(data)


class Cells(HTMLParser):
    """The rows of cell texts of the first table in a piece of HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None
        self.depth = 0
        self.done = False

    def handle_starttag(self, tag, attrs):
        if self.done:
            return
        self.depth += tag == "table"
        if tag == "tr" and self.depth == 1:
            self.rows.append([])
        if tag in ("td", "th") and self.depth == 1:
            self.cell = []

    def handle_endtag(self, tag):
        if self.done:
            return
        if tag in ("td", "th") and self.cell is not None and self.depth == 1:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None
        if tag == "table":
            self.depth -= 1
            self.done = self.depth == 0

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def first_table(html: str) -> dict[str, dict[str, str]]:
    """row label -> column -> cell text of the first table of ``html``."""
    parsed = Cells()
    parsed.feed(html)
    header, *rows = parsed.rows
    return {row[0]: dict(zip(header[1:], row[1:])) for row in rows}


def outline(html: str) -> Outline:
    parsed = Outline()
    parsed.feed(html)
    return parsed


@pytest.fixture(scope="module")
def report(compare_run: Path) -> tuple[Path, Outline, str]:
    html = (compare_run / "report.html").read_text()
    return compare_run, outline(html), html


def test_the_first_table_is_the_headline_and_tables_are_numbered_and_titled(report):
    run, parsed, _ = report
    assert parsed.tables[0][-1] == "table-headline"
    titles = [text for tag, text in parsed.headings if text.startswith("Table ")]
    numbers = [int(re.match(r"Table (\d+): ", t).group(1)) for t in titles]  # type: ignore[union-attr]
    assert numbers == list(range(1, len(titles) + 1))
    assert all(len(t.split(": ", 1)[1]) > 20 for t in titles)  # titled by what they show, not "Table 1" alone
    assert titles[0].startswith("Table 1: Where input queries' attention goes")
    assert titles[1].startswith("Table 2: Task effects")  # task effects right after the headline
    sections = ("summary", "table-headline", "table-effects", "figures", "attention-view", "run-details")
    assert [i for i in parsed.ids if i in sections] == list(sections)


def test_figure_captions_are_numbered_in_order_and_state_n(report):
    run, parsed, _ = report
    assert parsed.captions, "no figure captions"
    for i, caption in enumerate(parsed.captions, 1):
        assert caption.startswith(f"Figure {i}: "), caption
        assert "n = " in caption, caption
    examples = json.loads((run / "facts.json").read_text())["examples"]
    curves = next(c for c in parsed.captions if "Per-layer means" in c)
    assert f"n = {examples} examples" in curves and "4 layers" in curves  # tiny-llama: 4 layers x 4 heads
    pngs = {p.stem for p in (run / "figures").glob("*.png")}
    assert {i.removeprefix("figure-") for i in parsed.ids if i.startswith("figure-")} == pngs


def test_summary_links_resolve_and_quote_the_headline_numbers(report):
    run, parsed, html = report
    assert parsed.links and set(parsed.links) <= set(parsed.ids)
    assert "table-headline" in parsed.links and "table-effects" in parsed.links
    summary = html[html.index('<section id="summary">') : html.index("</section>")]
    head = pd.read_csv(run / "headline.csv", keep_default_na=False, na_values=[""])
    sink = head[head["name"] == "sink"].set_index("checkpoint")
    for checkpoint, row in sink.iterrows():  # the numbers the summary quotes are the run's own
        assert f"{checkpoint} {row['mean']:.3f} [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}]" in summary


def test_run_details_are_folded_and_hold_the_exactness_table_not_dicts(report):
    run, parsed, html = report
    assert "table-exactness" in parsed.details_ids
    text = "".join(parsed.text)
    assert "{'" not in text and "['" not in text and "None" not in text  # no Python reprs anywhere
    facts = json.loads((run / "facts.json").read_text())
    details = html[html.index('<details id="run-details">') :]
    exact = first_table(details)
    for name, record in facts["exactness"].items():
        for entry in record["per_layer"]:
            assert exact[f"layer {entry['layer']}"][name] == f"{entry['max_abs_diff']:.1e}"
        assert exact["verdict"][name].startswith("within")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing from the network


def test_summary_md_follows_the_report_order(report):
    run, parsed, _ = report
    md = (run / "summary.md").read_text()
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads == ["## Summary", "## Headline", "## Task effects", "## Figures", "## Run details"]
    titles = [line for line in md.splitlines() if line.startswith("**Table ")]
    assert titles[0].startswith("**Table 1: Where input queries' attention goes")
    assert titles[1].startswith("**Table 2: Task effects") and titles[2].startswith("**Table 3: Exactness")
    assert md.index("## Headline") < md.index("| metric | base | instance |") < md.index("## Task effects")
    assert "Exactness of instance: max |Δ|" in md[md.index("## Run details") :]
    for i, line in enumerate([ln for ln in md.splitlines() if ln.startswith("- Figure ")], 1):
        stem = re.search(r"\(figures/([^)]+)\.png\)\)$", line).group(1)  # type: ignore[union-attr]
        assert line.startswith(f"- Figure {i}: ") and (run / "figures" / f"{stem}.png").is_file()
    assert "{'" not in md


def test_citations_name_ranges_of_figures_and_skip_what_is_not_drawn():
    names = {"table-headline": "Table 1", **{f"figure-f{i}": f"Figure {i}" for i in range(1, 8)}}
    refs = ["table-headline", "figure-f2", "figure-f3", "figure-f4", "figure-f6", "figure-missing", "figure-f7"]
    assert citations(refs, names) == [
        ("table-headline", "Table 1"),
        ("figure-f2", "Figures 2–4"),
        ("figure-f6", "Figure 6"),
        ("figure-f7", "Figure 7"),
    ]


def test_facts_render_as_tables_and_lists_never_as_reprs():
    html = str(fact_html({"labels": [["entailment", " yes"], ["no", " no"]], "rows": [{"a": 1}, {"b": None}], "e": {}}))
    assert "(entailment,  yes), (no,  no)" in html and "[" not in html and "{" not in html
    assert html.count('<table class="nested">') == 2 and ">none<" in html
    assert "1,234,567" in str(fact_html(1234567))


def test_a_document_without_a_view_keeps_a_marked_slot():
    doc = Document(
        "t",
        summary=[Sentence("x", ("table-a", "figure-p"))],
        tables=[Table("a", "A table of things", "<table class='dataframe'></table>")],  # type: ignore[arg-type]
        figures=[Plot("p", "a plot over n = 3 examples", b"\x89PNG")],
    )
    html = render_document(doc)
    assert "anchorlens:attention-view slot" in html and 'id="attention-view"' in html
    assert '<a href="#table-a">Table 1</a>, <a href="#figure-p">Figure 1</a>' in html


def test_exactness_grid_is_layers_by_checkpoints():
    record = {
        "max_abs_diff": 3e-7,
        "threshold": 1e-4,
        "exact": True,
        "examples": 2,
        "dtype": "float32",
        "per_layer": [
            {"stack": "decoder", "layer": 0, "max_abs_diff": 1e-7},
            {"stack": "decoder", "layer": 1, "max_abs_diff": 3e-7},
        ],
    }
    grid = exactness_grid({"base": record, "ko": None}, ["base", "ko"])
    assert list(grid.index) == ["layer 0", "layer 1", "all layers", "threshold", "verdict"]
    assert grid.at["layer 1", "base"] == "3.0e-07" and grid.at["verdict", "base"] == "within, 2 examples"
    assert grid.at["layer 0", "ko"] == "—" and grid.at["verdict", "ko"] == "not certified (not run)"
    assert exactness_grid({}, ["base"]).empty
    # the kernel plan's row: its largest difference and what it compared, or why it did not run
    checked = {**record, "plans": {"kernel": {"max_abs_diff": 2.1e-6, "compared": ["key_sums", "score_sums"]}}}
    refused = {**record, "plans": {"kernel": {"max_abs_diff": None, "unavailable": "soft-caps"}}}
    unused = {**record, "plans": {"kernel": {"max_abs_diff": None, "not_applicable": "materialised"}}}
    grid = exactness_grid({"a": checked, "b": refused, "c": unused}, ["a", "b", "c"])
    assert list(grid.index) == ["layer 0", "layer 1", "all layers", "kernel plan", "threshold", "verdict"]
    assert grid.loc["kernel plan"].tolist() == ["2.1e-06 (key_sums, score_sums)", "refused", "not used"]


def test_the_interactive_view_is_embedded_after_the_figures_with_inline_script_only(report):
    run, parsed, html = report
    view = html[html.index('<section id="attention-view">') : html.index('<details id="run-details">')]
    assert "anchorlens-view" in view and "<script" in view and "attention-view slot" not in view
    assert not re.search(r"<script[^>]*\bsrc\s*=", html)  # every script inline: nothing is fetched
    assert html.count("<script") == view.count("<script")  # the view is the only script of the report
    assert "example 0" in view
