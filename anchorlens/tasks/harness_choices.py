"""lm-evaluation-harness choices and targets: ``doc_to_choice`` and ``doc_to_target`` as the harness reads them.

``doc_to_choice`` is a list, a field name, or Jinja: a single ``{{ expression }}`` is evaluated on the document;
any other template (MultiRC's quoted list whose items hold ``{{answer}}``) is rendered with the document and the
text parsed as a Python list (``ast.literal_eval``), as the harness does. Choices that read no field are the
same for every document (the task's verbalizers); others vary per document (:class:`HarnessTask`).
``doc_to_target`` is an index, a field or Jinja giving an index or a choice's text: a text equal to one of the
choices is that choice (``"1"`` among the choices ``["0", "1"]`` is choice 1, not read as the index 1);
otherwise a whole number is an index.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from anchorlens.errors import DataError, UsageError
from anchorlens.roles.jinja import bounded_render, jinja_environment, jinja_message
from anchorlens.tasks.task import CLASSIFICATION, Task

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ChoiceFunction = Callable[[Mapping[str, Any]], list[str]]


@dataclass(frozen=True)
class HarnessTask(Task):
    """A harness task; ``choices_of`` gives a document's choices when they vary per document (its labels are then
    the choice indices 0, 1, ...), ``choice_texts`` the fixed choices without ``target_delimiter`` (acc_norm
    divides a choice's log-likelihood by its text's length in characters, as the harness does)."""

    choices_of: ChoiceFunction | None = field(default=None, compare=False)
    target_delimiter: str = " "
    choice_texts: tuple[str, ...] = ()

    @property
    def has_labels(self) -> bool:
        """Fixed labels, or choices per document (a classification task either way)."""
        return self.kind == CLASSIFICATION and (bool(self.labels) or self.choices_of is not None)

    def label_index(self, value: Any) -> int:
        """A choice index (choices per document: any index the document's choices have), else as :class:`Task`."""
        if self.choices_of is None:
            return super().label_index(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ValueError(f"label {value!r} is not a choice index for task {self.name}")

    def verbalizer(self, value: Any) -> str:
        """Answer text for a label value; choices per document have none without the document (UsageError)."""
        if self.choices_of is None:
            return super().verbalizer(value)
        raise UsageError(
            f"task {self.name}: its choices vary per document, so a label's answer text needs its document "
            "(example_answer)"
        )

    def example_answer(self, example: Mapping[str, Any]) -> str:
        """``target_delimiter`` + the example's own choice at its label (choices per document), as the harness
        writes a demonstration's answer; else the label's verbalizer. DataError when the label is no choice of it."""
        choices = self.example_choices(example)
        if choices is None:
            return super().example_answer(example)
        label = example["label"]
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
            raise DataError(
                f"task {self.name}: example {example.get('idx')!r} has label {label!r}, not one of its "
                f"{len(choices)} choices"
            )
        return self.target_delimiter + choices[label]

    def example_choices(self, example: Mapping[str, Any]) -> list[str] | None:
        """The document's choices (without ``target_delimiter``) when they vary per document, else None."""
        return None if self.choices_of is None else self.choices_of(example)


def _body(text: str) -> str | None:
    """The expression of a template that is one ``{{ expression }}`` only, else None."""
    text = text.strip()
    if text.startswith("{{") and text.endswith("}}") and text.count("{{") == 1 and "{%" not in text:
        return text[2:-2].strip()
    return None


def _as_choices(value: Any, key: str) -> list[str]:
    """A list of choice texts from what ``doc_to_choice`` gives (a list, or a list's text); an undefined value or
    item raises its error (UndefinedError, or SecurityError for an attribute the sandbox refuses)."""
    from jinja2 import Undefined

    if isinstance(value, Undefined):
        str(value)  # StrictUndefined: raises the reason
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"{key} gives {value[:80]!r}, not a list of choices") from None
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{key} gives {type(value).__name__}, not a list of choices")
    return [str(c) for c in value]


def choice_function(value: Any, where: str) -> tuple[list[str] | None, ChoiceFunction | None]:
    """``doc_to_choice`` as (fixed choices, None) or (None, document -> choices); DataError names the key."""
    import jinja2
    from jinja2 import meta

    key = "doc_to_choice"
    if isinstance(value, (list, tuple)):
        return [str(c) for c in value], None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: {key} must be a list of choices, a field name or Jinja giving a list")
    env = jinja_environment()
    text = value.strip()
    if _IDENT.fullmatch(text):
        name = text

        def from_field(doc: Mapping[str, Any]) -> list[str]:
            if name not in doc:
                raise ValueError(f"{key}: the document has no field {name!r}")
            return _as_choices(doc[name], key)

        return None, from_field
    body = _body(text)
    try:
        if body is not None:
            compiled = env.compile_expression(body, undefined_to_none=False)
            reads = meta.find_undeclared_variables(env.parse("{{ " + body + " }}"))
        else:
            template = env.from_string(value)
            reads = meta.find_undeclared_variables(env.parse(value))
    except jinja2.TemplateSyntaxError as err:
        raise DataError(f"{where}: {key}: Jinja syntax error ({err.message})") from None

    def choices(doc: Mapping[str, Any]) -> list[str]:
        try:
            out = compiled(**doc) if body is not None else bounded_render(template, doc)
            return _as_choices(out, key)
        except ValueError as err:
            if str(err).startswith(key):
                raise
            raise ValueError(f"{key}: {jinja_message(err)}") from None
        except Exception as err:  # an undefined field, a sandbox refusal, a failing expression
            raise ValueError(f"{key}: {jinja_message(err)}") from None

    if reads:
        return None, choices
    try:
        return choices({}), None
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def target_function(target: Any, where: str) -> Callable[[Mapping[str, Any], list[str]], Any]:
    """``doc_to_target`` as (document, its choices) -> choice index (or None); DataError names the key."""
    import jinja2

    key = "doc_to_target"
    if isinstance(target, bool) or target is None or not isinstance(target, (int, str)):
        raise DataError(f"{where}: {key} must be an index, a field name or a Jinja expression")
    if isinstance(target, int):
        index = target

        def fixed(_doc: Mapping[str, Any], choices: list[str]) -> Any:
            return target_index(index, choices)

        return fixed
    text = target.strip()
    body = _body(text)
    env = jinja_environment()
    try:
        if body is not None or _IDENT.fullmatch(text):
            compiled = env.compile_expression(body if body is not None else text, undefined_to_none=False)
            render: Callable[..., Any] = compiled
        elif "{{" in text or "{%" in text:
            template = env.from_string(target)
            render = lambda **doc: bounded_render(template, doc)  # noqa: E731
        else:
            raise DataError(f"{where}: {key} must be an index, a field name or a Jinja expression")
    except jinja2.TemplateSyntaxError as err:
        raise DataError(f"{where}: {key}: Jinja syntax error ({err.message})") from None

    def label(doc: Mapping[str, Any], choices: list[str]) -> Any:
        try:
            value = render(**doc)
        except Exception as err:  # an undefined field, an expression failing on this document
            raise ValueError(f"{key} fails on this example ({jinja_message(err)})") from None
        return target_index(value, choices)

    return label


def target_index(value: Any, choices: list[str]) -> int | None:
    """The choice index a target value names: a choice's text first, then a whole number; ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        if value in choices:
            return choices.index(value)
        stripped = [c.strip() for c in choices]
        if value.strip() in stripped:
            return stripped.index(value.strip())
        if value.strip().lstrip("-").isdigit():
            value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(choices):
            return value
        raise ValueError(f"doc_to_target gives index {value}, but there are {len(choices)} choices {choices}")
    raise ValueError(f"doc_to_target gives {value!r}, not a choice index or one of the choices {choices}")
