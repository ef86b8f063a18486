"""A self-contained report.html that reads like a results section, rendered from a jinja2 template.

Order: a short summary (sentences with the main numbers, each linking to its table or figure), the numbered
tables (the headline first, titled by what they show), the numbered figures (captions say what is plotted
over what n), the interactive attention view (:func:`anchorlens.views.attention_view_html`, inline script), and last, folded into a ``<details>`` section, the run details
(the exactness certificate as a layers x checkpoints table, every recorded fact as nested tables). Images and
scripts are inline; nothing is fetched from the network; every value is HTML-escaped.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup, escape

TEMPLATES = Path(__file__).with_name("templates")
HEADLINE_NOTE = (
    "Mean over examples (each example averaged over layers and heads) with 95% bootstrap CI; "
    "Δ is the paired difference to the first checkpoint with Benjamini–Hochberg adjusted q."
)
HEADLINE_TITLE = "Where input queries' attention goes, and the anchor measures, per checkpoint"
VIEW_SLOT = "No interactive attention view: this run kept no attention maps."


@dataclass(frozen=True)
class Table:
    """One numbered table: ``key`` (its anchor, ``table-KEY``), a title saying what it shows, the escaped HTML, a
    note under the title and lines after the table (the n/a reasons)."""

    key: str
    title: str
    html: Markup
    note: str = ""
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plot:
    """One numbered figure: ``key`` (its anchor, ``figure-KEY``), the caption (what is plotted over what n) and
    its PNG (or SVG) bytes."""

    key: str
    caption: str
    data: bytes


@dataclass(frozen=True)
class Sentence:
    """A summary sentence and the tables/figures it cites (``table-KEY`` / ``figure-KEY`` anchors)."""

    text: str
    refs: tuple[str, ...] = ()


@dataclass
class Document:
    """Everything report.html shows, in reading order (:func:`render_document`)."""

    title: str
    lead: list[str] = field(default_factory=list)  # paragraphs under the title: task, inputs, checkpoints
    warnings: list[str] = field(default_factory=list)
    summary: list[Sentence] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Plot] = field(default_factory=list)
    details: list[Table] = field(default_factory=list)  # tables inside the folded run details (the certificate)
    facts: Mapping = field(default_factory=dict)
    view: Markup | None = None  # the interactive attention view; None leaves the marked slot
    view_slot: bool = True  # whether the report has an attention-view section (a slot while ``view`` is None)
    view_note: str = ""  # what the view shows (over which example), above it


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


def _mime(data: bytes) -> str:
    head = data[:256].lstrip()
    return "image/svg+xml" if head.startswith((b"<svg", b"<?xml")) else "image/png"


def grid_html(grid: pd.DataFrame) -> Markup:
    """A grid of formatted cells (the headline table, the task effects) as escaped HTML."""
    return Markup(grid.to_html(escape=True, border=0, na_rep="—"))


def fact_html(value: object) -> Markup:
    """One recorded fact as HTML: a mapping is a nested table, a list of mappings a table with a row per item, a
    list its items joined by ", " (nested lists in parentheses), None a dash; never a Python repr."""
    if isinstance(value, Mapping | list | tuple) and not value:
        return Markup('<span class="missing" title="empty">none</span>')
    if isinstance(value, Mapping):
        rows = "".join(f"<tr><th>{escape(k)}</th><td>{fact_html(v)}</td></tr>" for k, v in value.items())
        return Markup(f'<table class="nested"><tbody>{rows}</tbody></table>')
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, Mapping) for v in value):
            columns = list(dict.fromkeys(k for v in value for k in v))
            head = "".join(f"<th>{escape(c)}</th>" for c in columns)
            body = "".join(
                "<tr>" + "".join(f"<td>{fact_html(v.get(c))}</td>" for c in columns) + "</tr>" for v in value
            )
            return Markup(f'<table class="nested"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
        return Markup(", ").join(
            Markup("(") + fact_html(v) + Markup(")") if isinstance(v, list | tuple) else fact_html(v) for v in value
        )
    if value is None:
        return Markup('<span class="missing" title="not recorded">—</span>')
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) >= 10000:
        return escape(f"{value:,}")
    return escape(value)


def numbering(doc: Document) -> dict[str, str]:
    """Anchor -> "Table N" / "Figure N": tables (then the run details' tables) and figures numbered in order."""
    names = {f"table-{t.key}": f"Table {i}" for i, t in enumerate([*doc.tables, *doc.details], 1)}
    names.update({f"figure-{f.key}": f"Figure {i}" for i, f in enumerate(doc.figures, 1)})
    return names


def citations(refs: Sequence[str], names: Mapping[str, str]) -> list[tuple[str, str]]:
    """(anchor, text) of each citation: ``("table-headline", "Table 1")``; a run of 3+ consecutive figures is one
    range (``Figures 7–12``, anchored at its first); anchors the document lacks (a figure not drawn) are left out."""
    groups: list[list[tuple[str, str, int]]] = []
    for ref in (r for r in refs if r in names):
        kind, _, number = names[ref].partition(" ")
        last = groups[-1][-1] if groups else None
        if last is not None and last[1] == kind == "Figure" and last[2] + 1 == int(number):
            groups[-1].append((ref, kind, int(number)))
        else:
            groups.append([(ref, kind, int(number))])
    out: list[tuple[str, str]] = []
    for group in groups:
        if len(group) > 2:
            out.append((group[0][0], f"{group[0][1]}s {group[0][2]}–{group[-1][2]}"))
        else:
            out += [(ref, names[ref]) for ref, _, _ in group]
    return out


def _refs(refs: Sequence[str], names: Mapping[str, str]) -> Markup:
    """`` (Table 1, Figures 3–5)`` as links to the cited tables and figures (empty without any)."""
    links = [Markup(f'<a href="#{escape(ref)}">{escape(text)}</a>') for ref, text in citations(refs, names)]
    return Markup(" (") + Markup(", ").join(links) + Markup(")") if links else Markup("")


def render_document(doc: Document) -> str:
    """The whole HTML document of ``doc``."""
    names = numbering(doc)
    count = len(doc.tables)
    return (
        environment()
        .get_template("report.html.j2")
        .render(
            title=doc.title,
            lead=doc.lead,
            warnings=doc.warnings,
            summary=[{"text": s.text, "refs": _refs(s.refs, names)} for s in doc.summary],
            tables=[{"number": i, **vars(t)} for i, t in enumerate(doc.tables, 1)],
            figures=[
                {
                    "number": i,
                    "key": f.key,
                    "caption": f.caption,
                    "mime": _mime(f.data),
                    "data": base64.b64encode(f.data).decode("ascii"),
                }  # fmt: skip
                for i, f in enumerate(doc.figures, 1)
            ],
            details=[{"number": count + i, **vars(t)} for i, t in enumerate(doc.details, 1)],
            facts=[(str(k).replace("_", " "), fact_html(v)) for k, v in doc.facts.items()],
            view=doc.view,
            view_note=doc.view_note,
            view_slot=VIEW_SLOT if doc.view_slot else None,
        )
    )


def _title_of(caption: str) -> str:
    """A table's title from a long caption: its first clause (up to the first ': ' or '. ')."""
    cut = min((i for i in (caption.find(": "), caption.find(". ")) if i > 0), default=len(caption))
    return caption[:cut].rstrip(".")


def render_report(
    title: str,
    facts: Mapping,
    grid: pd.DataFrame,
    figures: Sequence[tuple[str, bytes]],
    notes: Sequence[str] = (),
    *,
    tables: Sequence[tuple[str, Markup]] = (),
) -> str:
    """A report from the parts of a simple run (the demo): the headline ``grid`` first (``notes`` after it), then
    ``tables`` ((caption, escaped HTML) pairs, titled by the caption's first clause), the figures ((caption,
    bytes) pairs) and the facts, folded. :func:`render_document` gives the full layout (summary, references)."""
    doc = Document(
        title,
        tables=[
            Table("headline", HEADLINE_TITLE, grid_html(grid), HEADLINE_NOTE, tuple(notes)),
            *(Table(f"t{i}", _title_of(caption), html, caption) for i, (caption, html) in enumerate(tables, 2)),
        ],
        figures=[Plot(f"f{i}", caption, data) for i, (caption, data) in enumerate(figures, 1)],
        facts=facts,
        view_slot=False,
    )
    return render_document(doc)
