"""The seven SuperGLUE tasks: fields, templates, labels, verbalizers and metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from anchorlens.errors import UnknownNameError
from anchorlens.roles.templates import Template

Row = dict[str, Any]


class RowError(ValueError):
    """A jsonl row does not have the shape its task expects (message without file location)."""


def flatten_row(row: Mapping[str, Any], prefix: str = "") -> Row:
    """Copy of ``row`` with nested objects flattened to dotted keys (``target.span1_text``)."""
    out: Row = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_row(value, name + "."))
        else:
            out[name] = value
    return out


def expand_plain(row: Mapping[str, Any]) -> list[Row]:
    """One example per row, nested objects flattened."""
    return [flatten_row(row)]


def _need(obj: Any, key: str, where: str) -> Any:
    """``obj[key]`` or RowError naming the dotted field ``where``."""
    if not isinstance(obj, Mapping) or obj.get(key) is None:
        raise RowError(f"missing field {where!r} for task multirc")
    return obj[key]


def expand_multirc(row: Mapping[str, Any]) -> list[Row]:
    """One example per (question, answer) of a nested MultiRC row; already-flat rows pass through.

    Each example has passage, question, answer, label, idx (the answer's idx), group (the
    question's idx, for exact match), passage_idx and question_idx.
    """
    passage = _need(row, "passage", "passage")
    if isinstance(passage, str):
        return [flatten_row(row)]
    text = _need(passage, "text", "passage.text")
    questions = _need(passage, "questions", "passage.questions")
    if not isinstance(questions, list):
        raise RowError("field 'passage.questions' is not a list")
    out: list[Row] = []
    for q_pos, q in enumerate(questions):
        question = _need(q, "question", "passage.questions[].question")
        answers = _need(q, "answers", "passage.questions[].answers")
        if not isinstance(answers, list):
            raise RowError("field 'passage.questions[].answers' is not a list")
        q_idx = q.get("idx", q_pos)
        for _a_pos, a in enumerate(answers):
            ex: Row = {
                "passage": text,
                "question": question,
                "answer": _need(a, "text", "passage.questions[].answers[].text"),
                "idx": a.get("idx", len(out)),
                "group": q_idx,
                "passage_idx": row.get("idx"),
                "question_idx": q_idx,
            }
            if a.get("label") is not None:
                ex["label"] = a["label"]
            out.append(ex)
    return out


@dataclass(frozen=True)
class Task:
    """One classification task: required fields, template, label values, answer words and metrics."""

    name: str
    description: str
    fields: tuple[str, ...]
    template: Template
    labels: tuple[Any, ...]
    verbalizers: tuple[str, ...]
    metrics: tuple[str, ...] = ("accuracy",)
    group_field: str | None = None
    expand: Callable[[Mapping[str, Any]], list[Row]] = expand_plain

    def __post_init__(self) -> None:
        """Check that labels and verbalizers pair up and the template uses only known fields."""
        if len(self.labels) != len(self.verbalizers):
            raise ValueError(f"task {self.name}: {len(self.labels)} labels but {len(self.verbalizers)} verbalizers")
        extra = set(self.template.fields) - set(self.fields)
        if extra:
            raise ValueError(f"task {self.name}: template uses undeclared fields {sorted(extra)}")

    @property
    def num_labels(self) -> int:
        """Number of classes."""
        return len(self.labels)

    def label_index(self, value: Any) -> int:
        """Position of a label value in ``labels`` (type-strict: ``True`` is not ``1``); ValueError otherwise."""
        for i, label in enumerate(self.labels):
            if value == label and isinstance(value, bool) == isinstance(label, bool):
                return i
        raise ValueError(f"label {value!r} is not one of {self.labels!r} for task {self.name}")

    def verbalizer(self, value: Any) -> str:
        """Answer word for a label value."""
        return self.verbalizers[self.label_index(value)]


def _t(name: str, spec: str) -> Template:
    """Parse a task template."""
    return Template.parse(spec, name=name)


_NLI = "premise: {premise}\nhypothesis: {hypothesis}\nanswer:"

_ALL = (
    Task(
        name="rte",
        description="Recognizing Textual Entailment: does the premise entail the hypothesis?",
        fields=("premise", "hypothesis"),
        template=_t("rte", _NLI),
        labels=("entailment", "not_entailment"),
        verbalizers=(" yes", " no"),
    ),
    Task(
        name="cb",
        description="CommitmentBank: is the hypothesis entailed, contradicted or neither?",
        fields=("premise", "hypothesis"),
        template=_t("cb", _NLI),
        labels=("entailment", "contradiction", "neutral"),
        verbalizers=(" yes", " no", " maybe"),
        metrics=("accuracy", "macro_f1"),
    ),
    Task(
        name="boolq",
        description="BoolQ: answer a yes/no question about a passage.",
        fields=("passage", "question"),
        template=_t("boolq", "passage: {passage}\nquestion: {question}?\nanswer:"),
        labels=(True, False),
        verbalizers=(" yes", " no"),
    ),
    Task(
        name="copa",
        description="Choice of Plausible Alternatives: which choice is the cause/effect of the premise?",
        fields=("premise", "question", "choice1", "choice2"),
        template=_t(
            "copa",
            "premise: {premise}\nquestion: {question}\nchoice1: {choice1}\nchoice2: {choice2}\nanswer:",
        ),
        labels=(0, 1),
        verbalizers=(" 1", " 2"),
    ),
    Task(
        name="wic",
        description="Word in Context: is the word used with the same sense in both sentences?",
        fields=("word", "sentence1", "sentence2"),
        template=_t("wic", "word: {word}\nsentence1: {sentence1}\nsentence2: {sentence2}\nanswer:"),
        labels=(True, False),
        verbalizers=(" yes", " no"),
    ),
    Task(
        name="wsc",
        description="Winograd Schema Challenge: does the pronoun (span2) refer to span1?",
        fields=("text", "target.span1_text", "target.span2_text"),
        template=_t("wsc", "text: {text}\nspan1: {target.span1_text}\nspan2: {target.span2_text}\nanswer:"),
        labels=(True, False),
        verbalizers=(" yes", " no"),
    ),
    Task(
        name="multirc",
        description="MultiRC: is the candidate answer to the question about the passage correct?",
        fields=("passage", "question", "answer"),
        template=_t("multirc", "passage: {passage}\nquestion: {question}\nanswer: {answer}\ncorrect:"),
        labels=(0, 1),
        verbalizers=(" no", " yes"),
        metrics=("f1a", "em"),
        group_field="group",
        expand=expand_multirc,
    ),
)

TASKS: Mapping[str, Task] = MappingProxyType({t.name: t for t in _ALL})


def get_task(name: str | Task) -> Task:
    """Task by case-insensitive name (a Task passes through); UnknownNameError (a ValueError) lists the known tasks."""
    if isinstance(name, Task):
        return name
    key = str(name).strip().lower()
    if key not in TASKS:
        raise UnknownNameError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[key]
