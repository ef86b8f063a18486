"""Templates: structural text with field slots, rendered into text plus role spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from anchorlens.roles.kinds import Role
from anchorlens.roles.scheme import RoleScheme
from anchorlens.roles.table import RoleTable


class TemplateError(KeyError):
    """An example lacks a field its template needs."""

    def __str__(self) -> str:
        """The plain message (KeyError would quote it)."""
        return str(self.args[0]) if self.args else ""


class TemplateSyntaxError(ValueError):
    """A compact template string is malformed (unbalanced or empty braces)."""


STRUCTURAL = Role.STRUCTURAL.label
CONTENT = Role.CONTENT.label


@dataclass(frozen=True)
class Literal:
    """Text written by the template itself; its role is ``structural`` unless the template names another."""

    text: str
    role: str = STRUCTURAL

    @property
    def name(self) -> str:
        """Short name used as the ``field`` of structural spans: the stripped text, or its escape if blank."""
        stripped = self.text.strip()
        return stripped if stripped else self.text.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class Field:
    """A slot filled from the example (role ``content`` unless named); dotted names (``target.span1_text``) reach
    into nested rows."""

    name: str
    role: str = CONTENT


Segment = Literal | Field


@dataclass(frozen=True)
class Span:
    """Characters ``[start, end)`` of a rendered text, with their role name and field (or segment name).

    ``slot``: the text was filled from data (a field, a system prompt, a demonstration's answer), not written by
    a template; when a token straddles both, the filled text decides its role (see :mod:`anchorlens.roles.tokenize`).
    """

    start: int
    end: int
    role: str
    field: str
    slot: bool = False


@dataclass(frozen=True)
class Rendered:
    """A filled template: the text and spans that tile it exactly, in order."""

    text: str
    spans: tuple[Span, ...]

    def field_text(self, name: str) -> str:
        """Text of the (first) filled span of field ``name``; KeyError when absent."""
        for span in self.spans:
            if span.slot and span.field == name:
                return self.text[span.start : span.end]
        raise KeyError(name)

    @property
    def roles(self) -> tuple[str, ...]:
        """The role names of the spans, in order of first appearance."""
        return tuple(dict.fromkeys(span.role for span in self.spans))

    def shifted(self, offset: int) -> tuple[Span, ...]:
        """The spans moved ``offset`` characters to the right."""
        return tuple(replace(span, start=span.start + offset, end=span.end + offset) for span in self.spans)

    def with_role(self, role: str, slot_role: str | None = None) -> Rendered:
        """The same text with every literal span given ``role`` and every filled span ``slot_role`` (default
        ``role``); fields are kept (a demonstration's ``premise`` stays tagged ``premise``)."""
        spans = tuple(replace(s, role=(slot_role or role) if s.slot else role) for s in self.spans)
        return Rendered(self.text, spans)

    @classmethod
    def join(cls, parts: Sequence[Rendered | str]) -> Rendered:
        """Concatenate rendered parts; a plain string becomes a structural literal span."""
        pieces: list[str] = []
        spans: list[Span] = []
        pos = 0
        for part in parts:
            if isinstance(part, str):
                part = literal(part)
            pieces.append(part.text)
            spans.extend(part.shifted(pos))
            pos += len(part.text)
        return cls("".join(pieces), tuple(spans))


def literal(text: str, role: str = STRUCTURAL, field: str | None = None, slot: bool = False) -> Rendered:
    """A one-span rendered text (no span when ``text`` is empty)."""
    if not text:
        return Rendered("", ())
    return Rendered(text, (Span(0, len(text), role, Literal(text).name if field is None else field, slot),))


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
    """Split a compact template (``"premise: {premise}\\nanswer:"``; ``{{``/``}}`` escape braces; ``{field:role}``
    gives a field a role of its own) into segments."""
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
            name, colon, role = (part.strip() for part in spec[i + 1 : end].partition(":"))
            if not name or "{" in name or (colon and not role):
                raise TemplateSyntaxError(f"bad field name {spec[i : end + 1]!r} in template {spec!r}")
            if buf:
                segments.append(Literal("".join(buf)))
                buf = []
            segments.append(Field(name, role) if role else Field(name))
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

    needs_scalars: ClassVar[bool] = True  # fields are filled as text: each must be a string or a number

    def __post_init__(self) -> None:
        """Accept any iterable of segments; store a tuple."""
        object.__setattr__(self, "segments", tuple(self.segments))

    @classmethod
    def parse(cls, spec: str, name: str = "custom") -> Template:
        """Build a template from a compact string; braces mark fields, ``{{`` and ``}}`` escape."""
        return cls(name, parse_segments(spec))

    @property
    def roles(self) -> tuple[str, ...]:
        """The role names the template's segments give, in order of first appearance."""
        return tuple(dict.fromkeys(seg.role for seg in self.segments))

    @property
    def scheme(self) -> RoleScheme:
        """The role scheme of this template alone: the built-in roles and the template's own, no token rules."""
        return RoleScheme(RoleTable.with_roles(r for r in self.roles if r not in RoleTable().names))

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
                parts.append("{" + seg.name + ("" if seg.role == CONTENT else ":" + seg.role) + "}")
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
                slot = True
            else:
                text, slot = seg.text, False
            if text:
                pieces.append(text)
                spans.append(Span(pos, pos + len(text), seg.role, seg.name, slot))
                pos += len(text)
        return Rendered("".join(pieces), tuple(spans))


RAW_TEMPLATE = Template("raw", (Field("text"),))
