"""Jinja templates (lm-evaluation-harness ``doc_to_text``) rendered with a role for every character.

Literal text of the template is ``structural``; the output of each ``{{ expression }}`` is ``content`` tagged
with the first field the expression reads (``{{ question.strip() }}`` -> ``question``); an expression that
reads no field (``{{ "Answer:" }}``) is structural. Statements (``{% if %}``, ``{% for %}``) work as in Jinja:
each expression's output is wrapped in private-use sentinel characters while rendering, and the spans are read
off the output, so loops and conditions cost nothing extra. Undefined fields are errors (StrictUndefined).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from anchorlens.roles.scheme import RoleScheme
from anchorlens.roles.table import BUILTIN_ROLES
from anchorlens.roles.templates import CONTENT, STRUCTURAL, Field, Literal, Rendered, Segment, Span, TemplateError

_OPEN, _MID, _CLOSE = "\ue010", "\ue011", "\ue012"
_MARKED = re.compile(f"{_OPEN}(\\d+){_MID}(.*?){_CLOSE}", re.DOTALL)
_FUNC = "__anchorlens_mark"
MAX_RANGE = 10_000  # items a template's range() may give
MAX_OUTPUT = 1_000_000  # characters a render may give, and the longest string or list a ``*`` may build
MAX_POWER_BITS = 4_096  # bits an integer ``**`` may give


def _bounded_range(*args: int) -> range:
    """``range`` refusing more than MAX_RANGE items (SecurityError)."""
    from jinja2.exceptions import SecurityError

    out = range(*args)
    if len(out) > MAX_RANGE:
        raise SecurityError(f"range() of {len(out)} items is over the limit of {MAX_RANGE}")
    return out


def _bounded_binop(operator: str, left: Any, right: Any) -> None:
    """SecurityError for a ``*`` building a sequence over MAX_OUTPUT items or an integer ``**`` over the bit limit."""
    from jinja2.exceptions import SecurityError

    def count(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    if operator == "*":
        for seq, n in ((left, count(right)), (right, count(left))):
            if isinstance(seq, (str, list, tuple)) and n is not None and len(seq) * n > MAX_OUTPUT:
                raise SecurityError(f"repeating a sequence {n} times is over the limit of {MAX_OUTPUT} items")
    if operator == "**" and count(left) is not None and count(right) is not None:
        if right > 0 and max(1, abs(left).bit_length()) * right > MAX_POWER_BITS:
            raise SecurityError(f"{left} ** {right} is over the limit of {MAX_POWER_BITS} bits")


def jinja_environment() -> Any:
    """A sandboxed Jinja environment with undefined names as errors and the harness's ``regex_replace`` filter,
    bounded: range() of at most MAX_RANGE items, ``*`` repetition and renders of at most MAX_OUTPUT characters
    (:meth:`JinjaTemplate.render`), integer powers of at most MAX_POWER_BITS bits (SecurityError beyond)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _bounded_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

    env = Bounded(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = lambda s, pattern, repl: re.sub(pattern, repl, s)
    env.globals["range"] = _bounded_range
    return env


def bounded_render(template: Any, values: Mapping[str, Any]) -> str:
    """``template.render(**values)`` refusing output over MAX_OUTPUT characters (SecurityError)."""
    from jinja2.exceptions import SecurityError

    pieces: list[str] = []
    size = 0
    for piece in template.generate(**values):
        size += len(piece)
        if size > MAX_OUTPUT:
            raise SecurityError(f"the rendered text is over the limit of {MAX_OUTPUT} characters")
        pieces.append(piece)
    return "".join(pieces)


def jinja_message(err: BaseException) -> str:
    """One line for a Jinja or expression failure: its kind and first line (``UndefinedError: 'x' is undefined``)."""
    text = getattr(err, "message", None) or str(err) or "failed"
    return f"{type(err).__name__}: {str(text).strip().splitlines()[0] if str(text).strip() else 'failed'}"


@dataclass(frozen=True)
class JinjaTemplate:
    """A Jinja template whose literal text is structural and whose expressions are content (module docstring)."""

    name: str
    source: str
    _expr_fields: tuple[str | None, ...] = field(default=(), compare=False, repr=False)

    needs_scalars: ClassVar[bool] = False  # expressions read lists and objects too (``{{ choices[0] }}``)

    @classmethod
    def parse(cls, source: str, name: str = "jinja") -> JinjaTemplate:
        """Parse and check a template; TemplateError (one line) on a syntax error."""
        import jinja2
        from jinja2 import meta

        env = jinja_environment()
        try:
            tokens = list(env.lex(source))
            env.parse(source)
        except jinja2.TemplateSyntaxError as err:
            raise TemplateError(f"template {name!r}: Jinja syntax error on line {err.lineno}: {err.message}") from None
        fields: list[str | None] = []
        data = meta.find_undeclared_variables(env.parse(source))  # not {% set %} or loop variables
        for expr in _expressions(tokens):
            names = meta.find_undeclared_variables(env.parse("{{ " + expr + " }}")) & data
            order = sorted(names, key=lambda n: m.start() if (m := re.search(rf"\b{re.escape(n)}\b", expr)) else 0)
            fields.append(order[0] if order else None)
        return cls(name, source, tuple(fields))

    @cached_property
    def _compiled(self) -> Any:
        """The template with every expression wrapped in the marking function."""
        env = jinja_environment()
        tokens = list(env.lex(self.source))
        out: list[str] = []
        k = 0
        inside = False
        buf: list[str] = []
        for _line, kind, value in tokens:
            if kind == "variable_begin":
                inside, buf = True, []
                out.append(value)
            elif kind == "variable_end":
                out.append(f" {_FUNC}({k}, ({''.join(buf)})) ")
                out.append(value)
                inside, k = False, k + 1
            elif inside:
                buf.append(value)
            else:
                out.append(value)
        env.globals[_FUNC] = lambda i, v: f"{_OPEN}{i}{_MID}{v}{_CLOSE}"
        return env.from_string("".join(out))

    @property
    def fields(self) -> tuple[str, ...]:
        """Fields the expressions read, in order of first appearance."""
        return tuple(dict.fromkeys(f for f in self._expr_fields if f is not None))

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles a render can give: structural and content."""
        return (STRUCTURAL, CONTENT)

    @property
    def segments(self) -> tuple[Segment, ...]:
        """A static outline: the literal text between expressions and one field per expression reading a field."""
        out: list[Segment] = []
        k = 0
        for _line, kind, value in jinja_environment().lex(self.source):
            if kind == "data":
                out.append(Literal(value))
            elif kind == "variable_end":
                f = self._expr_fields[k] if k < len(self._expr_fields) else None
                if f is not None:
                    out.append(Field(f))
                k += 1
        return tuple(out)

    @property
    def spec(self) -> str:
        """The Jinja source."""
        return self.source

    @property
    def scheme(self) -> RoleScheme:
        """The built-in roles (a Jinja template adds none)."""
        return RoleScheme(BUILTIN_ROLES)

    def render(self, example: Mapping[str, Any]) -> Rendered:
        """Render ``example``; TemplateError names an undefined field or a failing expression."""
        import jinja2

        try:
            marked = bounded_render(self._compiled, example)
        except jinja2.UndefinedError as err:
            raise TemplateError(
                f"template {self.name!r}: {err.message}; the example has: {', '.join(map(str, example))}"
            ) from None
        except Exception as err:  # an expression failing on this example's values, a sandbox limit
            raise TemplateError(f"template {self.name!r}: {jinja_message(err)}") from None
        return _spans(marked, self._expr_fields)


def _expressions(tokens: list[tuple[int, str, str]]) -> list[str]:
    """The source of every ``{{ ... }}`` expression, in order."""
    out: list[str] = []
    buf: list[str] | None = None
    for _line, kind, value in tokens:
        if kind == "variable_begin":
            buf = []
        elif kind == "variable_end" and buf is not None:
            out.append("".join(buf))
            buf = None
        elif buf is not None:
            buf.append(value)
    return out


def _spans(marked: str, fields: tuple[str | None, ...]) -> Rendered:
    """The rendered text and its spans from output whose expression values are wrapped in sentinels."""
    pieces: list[str] = []
    spans: list[Span] = []
    pos = 0
    last = 0

    def add(text: str, role: str, name: str, slot: bool) -> None:
        nonlocal pos
        if text:
            pieces.append(text)
            spans.append(Span(pos, pos + len(text), role, name, slot))
            pos += len(text)

    for m in _MARKED.finditer(marked):
        literal = marked[last : m.start()]
        add(literal, STRUCTURAL, Literal(literal).name, False)
        k, value = int(m.group(1)), m.group(2)
        f = fields[k] if k < len(fields) else None
        if f is None:
            add(value, STRUCTURAL, Literal(value).name if value else "", False)
        else:
            add(value, CONTENT, f, True)
        last = m.end()
    tail = marked[last:]
    add(tail, STRUCTURAL, Literal(tail).name, False)
    return Rendered("".join(pieces), tuple(spans))
