"""One task: its fields, template, labels and verbalizers, metric, role rules and prompt settings.

Every task is data: the seven SuperGLUE tasks and plain text are task files shipped inside the package
(``anchorlens/tasks/builtin/*.toml``), read by the same code as a user's file (:mod:`anchorlens.tasks.taskfile`)
or an lm-evaluation-harness YAML (:mod:`anchorlens.tasks.harness`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from anchorlens.roles.jinja import JinjaTemplate
from anchorlens.roles.kinds import GUIDANCE_ROLES
from anchorlens.roles.scheme import TokenRule
from anchorlens.roles.table import BUILTIN_ROLES, check_role_name
from anchorlens.roles.templates import Template
from anchorlens.tasks.explode import Row, expand_plain

METRICS: tuple[str, ...] = ("accuracy", "macro_f1", "f1a", "em")
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")  # how a number is written (no leading zeros: "01" is text)
CLASSIFICATION = "classification"
TEXT = "text"
KINDS: tuple[str, ...] = (CLASSIFICATION, TEXT)


def label_text(value: Any) -> str:
    """The text a label value is written as in a CSV or a task file (``true``, ``0``, ``entailment``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def label_key(value: Any) -> tuple[str, Any]:
    """What a label value is, as data can write it: equal keys are one label.

    Numbers are equal by value whatever their type or text (``1``, ``1.0``, ``"1"``, ``"1.0"``; ``"01"`` is text);
    booleans are equal to their words (``true``, ``"True"``) but never to numbers (``True`` is not ``1``: a task
    with labels ``0``/``1`` and a boolean column are different things, and the type-strict tests of
    :meth:`Task.label_index` hold it); other text is compared as written.
    """
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, (int, float)):
        return ("number", float(value))
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL.fullmatch(text):
            return ("number", float(text))
        if text.lower() in ("true", "false"):
            return ("boolean", text.lower() == "true")
        return ("text", value)
    return ("other", repr(value))


@dataclass(frozen=True)
class Task:
    """A task: what an example holds, how it is rendered, and (for classification) its labels.

    fields: the example fields the template reads; labels/verbalizers: label values in the data and the answer
    text scored for each (empty for a task without labels: capture only); label_field: the data column holding
    the label; metrics: accuracy, macro_f1, f1a, em (em and the train/eval split group examples by the values
    of ``group_fields``: MultiRC's answers of one question); expand: row -> examples
    (nested rows, see :mod:`anchorlens.tasks.explode`); kind: ``classification`` or ``text`` (documents cut
    into windows); rules: token rules that give roles by token text; chat/system: render through the
    tokenizer's chat template with an optional system prompt; shots/fewshot_delimiter: demonstrations
    prepended by default; preamble: structural text before the demonstrations and the query (a harness task's
    ``description``); data: a default data source and fewshot_data the default source of demonstrations;
    source: where the task was read from (``builtin:rte`` or a path) and digest: sha256 of that file's text, for
    manifests; label_of: computes an example's label (a harness task's ``doc_to_target``) instead of reading
    ``label_field``; notes: what a reader of the task should know (choices that vary per document...).
    """

    name: str
    description: str
    fields: tuple[str, ...]
    template: Template | JinjaTemplate
    labels: tuple[Any, ...] = ()
    verbalizers: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("accuracy",)
    group_fields: tuple[str, ...] = ()
    expand: Callable[[Mapping[str, Any]], list[Row]] = expand_plain
    label_field: str = "label"
    kind: str = CLASSIFICATION
    rules: tuple[TokenRule, ...] = ()
    chat: bool = False
    system: str | None = None
    shots: int = 0
    fewshot_delimiter: str = "\n\n"
    preamble: str = ""
    data: str | None = None
    source: str = ""
    digest: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)
    label_of: Callable[[Mapping[str, Any]], Any] | None = field(default=None, compare=False)
    fewshot_data: str | None = None
    chat_template: str | None = None  # a task file's named chat template (--chat-template NAME)
    chat_template_kwargs: tuple[tuple[str, Any], ...] = field(default=(), compare=False)  # its template arguments

    def __post_init__(self) -> None:
        """Check that labels and verbalizers pair up, the template uses only known fields, and roles are sound."""
        if len(self.labels) != len(self.verbalizers):
            raise ValueError(f"task {self.name}: {len(self.labels)} labels but {len(self.verbalizers)} verbalizers")
        repeated = [v for i, v in enumerate(self.verbalizers) if v in self.verbalizers[:i]]
        if repeated:
            shared = [label_text(x) for x, v in zip(self.labels, self.verbalizers) if v == repeated[0]]
            raise ValueError(
                f"task {self.name}: labels {' and '.join(shared)} share the verbalizer {repeated[0]!r}; "
                "give each label its own answer"
            )
        extra = set(self.template.fields) - set(self.fields)
        if extra:
            raise ValueError(f"task {self.name}: template uses undeclared fields {sorted(extra)}")
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        guidance = {r.label for r in GUIDANCE_ROLES}
        taken = guidance.intersection(self.template.roles + tuple(r.role for r in self.rules))
        if taken:
            raise ValueError(
                f"task {self.name}: role {sorted(taken)[0]!r} is a guidance role; give the text another role"
            )
        for name in self.roles:
            check_role_name(name)

    @property
    def group_field(self) -> str | None:
        """The finest grouping column (the last of ``group_fields``), or None."""
        return self.group_fields[-1] if self.group_fields else None

    def group_key(self, example: Mapping[str, Any]) -> tuple | None:
        """The values of ``group_fields`` of an example (None without grouping or when one is missing)."""
        if not self.group_fields or any(f not in example for f in self.group_fields):
            return None
        return tuple(example[f] for f in self.group_fields)

    @property
    def num_labels(self) -> int:
        """Number of classes (0 for a task without labels)."""
        return len(self.labels)

    @property
    def has_labels(self) -> bool:
        """Whether the task scores answers (evaluate and train need it)."""
        return bool(self.labels) and self.kind == CLASSIFICATION

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this task's text can have beyond the built-ins: its template's and its rules', in order."""
        names = [*self.template.roles, *(r.role for r in self.rules)]
        return tuple(n for n in dict.fromkeys(names) if n not in BUILTIN_ROLES.names)

    def label_index(self, value: Any) -> int:
        """Position of a label value in ``labels``; ValueError otherwise.

        Values are compared type-strictly (``True`` is not ``1``), except that a string and a value of another
        type match by text: a CSV cell ``"true"`` or ``"0"`` is the label ``true`` or ``0`` of a task file, and a
        boolean column matches the string labels ``"true"``/``"false"`` (case-insensitive); numbers match by value
        however written (a data label ``1.0`` or ``"1.0"``, not ``"01"``, is the label ``1`` or ``"1"``), as
        :func:`label_key` says (a task file cannot list two labels with one key).
        """
        for i, label in enumerate(self.labels):
            if value == label and isinstance(value, bool) == isinstance(label, bool):
                return i
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            key = label_key(value)
            if key[0] == "number":
                for i, label in enumerate(self.labels):
                    if label_key(label) == key:
                        return i
        if isinstance(value, (str, int, float, bool)):
            text = label_text(value).strip().lower()
            number = _DECIMAL.fullmatch(value.strip()) if isinstance(value, str) else None
            for i, label in enumerate(self.labels):
                if isinstance(label, str) != isinstance(value, str) and label_text(label).strip().lower() == text:
                    return i
                numeric = isinstance(label, (int, float)) and not isinstance(label, bool)
                if number is not None and numeric and float(value) == label:  # a CSV cell "1.0" for the label 1
                    return i
        raise ValueError(f"label {value!r} is not one of {self.labels!r} for task {self.name}")

    def unknown_label(self, value: Any) -> str:
        """The error text for a label value in the data that the task has no verbalizer for, with the fix."""
        own = self.source and not self.source.startswith("builtin:")
        fix = f"give it a verbalizer in {self.source}" if own else "correct the row's label"
        return f"label {value!r} is not one of {self.labels!r} for task {self.name}; {fix} (or drop the row)"

    def example_label(self, example: Mapping[str, Any]) -> Any:
        """The label value of an example: its ``label_field``, or what the task computes from it (a harness task's
        ``doc_to_target``)."""
        if self.label_of is not None:
            return self.label_of(example)
        return example.get(self.label_field)

    def verbalizer(self, value: Any) -> str:
        """Answer text for a label value."""
        return self.verbalizers[self.label_index(value)]

    def example_answer(self, example: Mapping[str, Any]) -> str:
        """The answer text of a labelled example (what a few-shot demonstration shows after its template): the
        verbalizer of its ``label``."""
        return self.verbalizer(example["label"])

    def describe_source(self) -> dict[str, Any]:
        """``{"name", "source", "sha256", "kind", "fields", "label_field", "labels", "roles"}`` for a run's manifest
        (labels as ``[value, verbalizer]`` pairs)."""
        return {
            "name": self.name,
            "source": self.source,
            "sha256": self.digest,
            "kind": self.kind,
            "fields": list(self.fields),
            "label_field": self.label_field if self.has_labels else None,
            "labels": [[label, verbalizer] for label, verbalizer in zip(self.labels, self.verbalizers)],
            "roles": list(self.roles),
        }


def text_digest(text: str) -> str:
    """sha256 of a task file's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
