"""Templates: parsing, rendering, spans and errors."""

from __future__ import annotations

import pytest

from anchorlens.roles import (
    RAW_TEMPLATE,
    Field,
    Literal,
    Span,
    Template,
    TemplateError,
    TemplateSyntaxError,
)

RTE_SPEC = "premise: {premise}\nhypothesis: {hypothesis}\nanswer:"


def _assert_tiles(rendered) -> None:
    """Spans are non-empty, contiguous and cover the whole text."""
    pos = 0
    for span in rendered.spans:
        assert span.start == pos < span.end
        pos = span.end
    assert pos == len(rendered.text)


def test_parse_splits_literals_and_fields():
    t = Template.parse(RTE_SPEC, name="rte")
    assert t.name == "rte"
    assert t.segments == (
        Literal("premise: "),
        Field("premise"),
        Literal("\nhypothesis: "),
        Field("hypothesis"),
        Literal("\nanswer:"),
    )
    assert t.fields == ("premise", "hypothesis")
    assert t.spec == RTE_SPEC
    assert Template.parse(t.spec).segments == t.segments


def test_parse_escaped_braces_are_literal_text():
    t = Template.parse("set {{x}}: {a}}}")
    assert t.segments == (Literal("set {x}: "), Field("a"), Literal("}"))
    assert t.render({"a": 1}).text == "set {x}: 1}"
    assert Template.parse(t.spec).segments == t.segments


@pytest.mark.parametrize("spec", ["a {b", "a } b", "a {} b", "{ }"])
def test_parse_rejects_malformed(spec):
    with pytest.raises(TemplateSyntaxError):
        Template.parse(spec)


def test_render_spans_roles_and_fields():
    t = Template.parse(RTE_SPEC, name="rte")
    r = t.render({"premise": "A dog ran.", "hypothesis": "It moved.", "label": "entailment"})
    assert r.text == "premise: A dog ran.\nhypothesis: It moved.\nanswer:"
    _assert_tiles(r)
    assert r.spans == (
        Span(0, 9, "structural", "premise:"),
        Span(9, 19, "content", "premise", True),
        Span(19, 32, "structural", "hypothesis:"),
        Span(32, 41, "content", "hypothesis", True),
        Span(41, 49, "structural", "answer:"),
    )
    assert r.field_text("premise") == "A dog ran."
    with pytest.raises(KeyError):
        r.field_text("label")


def test_render_stringifies_values_and_drops_empty_spans():
    t = Template.parse("q: {q}{empty}\nn: {n} {flag}")
    r = t.render({"q": "why", "empty": "", "n": 3, "flag": True})
    assert r.text == "q: why\nn: 3 True"
    _assert_tiles(r)
    assert [s.field for s in r.spans] == ["q:", "q", "n:", "n", " ", "flag"]


def test_whitespace_only_literal_is_named_by_its_escape():
    assert Literal("\n").name == "\\n"
    assert Literal("  ").name == "  "
    assert Literal(" \nanswer: ").name == "answer:"


def test_missing_field_names_field_and_template():
    t = Template.parse(RTE_SPEC, name="rte")
    with pytest.raises(TemplateError) as info:
        t.render({"premise": "x"})
    assert isinstance(info.value, KeyError)
    msg = str(info.value)
    assert "'hypothesis'" in msg and "'rte'" in msg and "premise" in msg


def test_dotted_fields_reach_nested_and_flat_rows():
    t = Template.parse("text: {text}\nspan1: {target.span1_text}")
    nested = t.render({"text": "He sat.", "target": {"span1_text": "He"}})
    flat = t.render({"text": "He sat.", "target.span1_text": "He"})
    assert nested == flat
    assert nested.spans[-1] == Span(21, 23, "content", "target.span1_text", True)
    with pytest.raises(TemplateError):
        t.render({"text": "x", "target": {"span2_text": "it"}})


def test_raw_template_is_all_content():
    r = RAW_TEMPLATE.render({"text": "just text."})
    assert r.text == "just text."
    assert r.spans == (Span(0, 10, "content", "text", True),)
    assert RAW_TEMPLATE.fields == ("text",)


@pytest.mark.parametrize("value, kind", [(["a", "b"], "a list"), ({"x": 1}, "an object"), (("a",), "a list")])
def test_render_refuses_lists_and_objects_instead_of_their_repr(value, kind):
    t = Template.parse("q: {q}", name="t")
    with pytest.raises(TemplateError, match=f"template 't': field 'q' must be a string or number, got {kind}"):
        t.render({"q": value})
