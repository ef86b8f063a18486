"""Templates: structural text with field slots, rendered into text plus role spans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from anchorlens.roles.kinds import Role


class TemplateError(KeyError):
    """An example lacks a field its template needs."""

    def __str__(self) -> str:
        """The plain message (KeyError would quote it)."""
        return str(self.args[0]) if self.args else ""


class TemplateSyntaxError(ValueError):
    """A compact template string is malformed (unbalanced or empty braces)."""


@dataclass(frozen=True)
class Literal:
    """Structural text written by the template itself."""

    text: str

    @property
    def name(self) -> str:
        """Short name used as the ``field`` of structural spans: the stripped text, or its escape if blank."""
        stripped = self.text.strip()
        return stripped if stripped else self.text.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class Field:
    """A slot filled from the example; dotted names (``target.span1_text``) reach into nested rows."""

    name: str


Segment = Literal | Field


@dataclass(frozen=True)
class Span:
    """Characters ``[start, end)`` of a rendered text, with their role and field (or segment name)."""

    start: int
    end: int
    role: Role
    field: str


@dataclass(frozen=True)
class Rendered:
    """A filled template: the text and spans that tile it exactly, in order."""

    text: str
    spans: tuple[Span, ...]

    def field_text(self, name: str) -> str:
        """Text of the (first) content span of field ``name``; KeyError when absent."""
        for span in self.spans:
            if span.role == Role.CONTENT and span.field == name:
                return self.text[span.start : span.end]
        raise KeyError(name)


def lookup(example: Mapping[str, Any], name: str) -> Any:
    """Value of field ``name``: a direct key first, then a dotted path through nested mappings."""
    if name in example:
        return example[name]
    node: Any = example
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(name)
        node = node[part]
    return node


def parse_segments(spec: str) -> tuple[Segment, ...]:
    """Split a compact template (``"premise: {premise}\\nanswer:"``; ``{{``/``}}`` escape braces) into segments."""
    segments: list[Segment] = []
    buf: list[str] = []
    i, n = 0, len(spec)
    while i < n:
        ch = spec[i]
        if ch == "{" and spec.startswith("{{", i):
            buf.append("{")
            i += 2
        elif ch == "}" and spec.startswith("}}", i):
            buf.append("}")
            i += 2
        elif ch == "{":
            end = spec.find("}", i + 1)
            if end < 0:
                raise TemplateSyntaxError(f"unclosed '{{' at position {i} in template {spec!r}")
            name = spec[i + 1 : end].strip()
            if not name or "{" in name:
                raise TemplateSyntaxError(f"bad field name {spec[i : end + 1]!r} in template {spec!r}")
            if buf:
                segments.append(Literal("".join(buf)))
                buf = []
            segments.append(Field(name))
            i = end + 1
        elif ch == "}":
            raise TemplateSyntaxError(f"single '}}' at position {i} in template {spec!r}; write '}}}}'")
        else:
            buf.append(ch)
            i += 1
    if buf:
        segments.append(Literal("".join(buf)))
    return tuple(segments)


@dataclass(frozen=True)
class Template:
    """A named sequence of literal (structural) and field (content) segments."""

    name: str
    segments: tuple[Segment, ...]

    def __post_init__(self) -> None:
        """Accept any iterable of segments; store a tuple."""
        object.__setattr__(self, "segments", tuple(self.segments))

    @classmethod
    def parse(cls, spec: str, name: str = "custom") -> Template:
        """Build a template from a compact string; braces mark fields, ``{{`` and ``}}`` escape."""
        return cls(name, parse_segments(spec))

    @property
    def fields(self) -> tuple[str, ...]:
        """Field names in order of first appearance."""
        seen: dict[str, None] = {}
        for seg in self.segments:
            if isinstance(seg, Field):
                seen.setdefault(seg.name, None)
        return tuple(seen)

    @property
    def spec(self) -> str:
        """The compact string form (inverse of ``parse``)."""
        parts = []
        for seg in self.segments:
            if isinstance(seg, Field):
                parts.append("{" + seg.name + "}")
            else:
                parts.append(seg.text.replace("{", "{{").replace("}", "}}"))
        return "".join(parts)

    def render(self, example: Mapping[str, Any]) -> Rendered:
        """Fill the fields from ``example`` (numbers are ``str()``'d); TemplateError names a missing or list/object field."""
        pieces: list[str] = []
        spans: list[Span] = []
        pos = 0
        for seg in self.segments:
            if isinstance(seg, Field):
                try:
                    value = lookup(example, seg.name)
                except KeyError:
                    have = ", ".join(sorted(map(str, example))) or "nothing"
                    raise TemplateError(
                        f"template {self.name!r} needs field {seg.name!r}; the example has: {have}"
                    ) from None
                if isinstance(value, (Mapping, list, tuple, set)):
                    kind = "an object" if isinstance(value, Mapping) else "a list"
                    raise TemplateError(
                        f"template {self.name!r}: field {seg.name!r} must be a string or number, got {kind}"
                    )
                text = value if isinstance(value, str) else str(value)
                role, label = Role.CONTENT, seg.name
            else:
                text, role, label = seg.text, Role.STRUCTURAL, seg.name
            if text:
                pieces.append(text)
                spans.append(Span(pos, pos + len(text), role, label))
                pos += len(text)
        return Rendered("".join(pieces), tuple(spans))


RAW_TEMPLATE = Template("raw", (Field("text"),))
