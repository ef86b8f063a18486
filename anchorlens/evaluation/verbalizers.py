"""Token ids of a task's verbalizers (answer words) for one tokenizer, and how labels are scored.

``scoring="sum"`` (the default, as lm-evaluation-harness's ``acc``): a label's score is the summed log-likelihood
of every token of its verbalizer after the prompt, and ``acc_norm`` ranks by that score divided by the answer's
length in characters (a harness task: the choice text without ``target_delimiter``, as the harness's
``acc_norm``; other tasks: the verbalizer). When every verbalizer is one token after the tokens they all share at
their start (``" yes"``/``" no"``; ``" 1"``/``" 2"`` = ``" "`` + one token for SmolLM2) one forward pass
scores all labels: the shared tokens are appended to the input and each label's score is their log-likelihood
plus that of its distinguishing token (``choice``) at the last position. Otherwise each label is its own row,
prompt + verbalizer (input-level guidance then sees the answer, as when the harness runs the guided model).

``scoring="first_token"``: the log-probability of the first *distinguishing* token only (the shared prefix
appended to every input and dropped from the score; tokens after the distinguishing one are not scored).

Encoder-decoder scoring uses the whole verbalizer as the decoder target (``targets``, with the tokenizer's
``</s>``) and sums its log-likelihood (``first_token``: up to the first distinguishing token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from anchorlens.errors import UsageError
from anchorlens.tasks import Task
from anchorlens.tasks.harness_choices import HarnessTask

SCORINGS: tuple[str, ...] = ("sum", "first_token")
AUTO = "auto"  # sum, or first_token where guidance would see an appended answer (evaluation.scoring.resolve_scoring)


@dataclass(frozen=True)
class Verbalizers:
    """Verbalizer token ids for one (task, tokenizer) pair.

    shared: token ids common to the start of every verbalizer; choice: per label, its first token
    after ``shared`` (empty when two labels share it: sum scoring only); targets: per label, the full target token
    ids (encoder-decoder bases); plain: per label, the verbalizer's token ids without specials; norm_chars: per
    label, the characters acc_norm divides by; scoring: ``sum`` or ``first_token``; per_document: the choices
    vary per document (words empty: each batch tokenizes its documents' choices).
    """

    words: tuple[str, ...]
    shared: tuple[int, ...]
    choice: tuple[int, ...]
    targets: tuple[tuple[int, ...], ...]
    plain: tuple[tuple[int, ...], ...] = ()
    norm_chars: tuple[int, ...] = ()
    scoring: str = "sum"
    per_document: bool = False

    @property
    def num_labels(self) -> int:
        """Number of labels L."""
        return len(self.words)

    @property
    def one_pass(self) -> bool:
        """Whether one forward pass of prompt + ``shared`` scores every label (first_token, or every verbalizer is
        one distinguishing token after ``shared``)."""
        if self.per_document or not self.choice:
            return False
        return self.scoring == "first_token" or all(len(p) == len(self.shared) + 1 for p in self.plain)


def common_prefix(rows: Sequence[Sequence[int]]) -> list[int]:
    """Longest token prefix shared by every row."""
    out: list[int] = []
    for column in zip(*rows):
        if len(set(column)) != 1:
            break
        out.append(column[0])
    return out


def norm_length(text: str) -> int:
    """Characters acc_norm divides a choice's log-likelihood by (at least 1)."""
    return max(1, len(text))


def verbalizer_ids(tokenizer: Any, task: Task, scoring: str = "sum") -> Verbalizers:
    """Tokenize ``task``'s verbalizers for ``scoring`` (``sum`` or ``first_token``); UsageError (naming the task
    file) when one tokenizes to nothing or, for first_token scoring, two labels cannot be told apart by one
    token."""
    if scoring not in SCORINGS:
        raise UsageError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    if isinstance(task, HarnessTask) and task.choices_of is not None and task.has_labels:
        if scoring != "sum":
            raise UsageError(f"task {task.name}: its choices vary per document; score it with scoring='sum'")
        return Verbalizers(words=(), shared=(), choice=(), targets=(), scoring=scoring, per_document=True)
    if not task.has_labels:
        raise UsageError(f"task {task.name} has no labels: scoring needs verbalizers (a classification task)")
    words = tuple(task.verbalizers)
    where = task.source if task.source and not task.source.startswith("builtin:") else f"task {task.name}"
    plain = [list(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in words]
    targets = tuple(tuple(tokenizer(w, add_special_tokens=True)["input_ids"]) for w in words)
    for w, ids in zip(words, plain):
        if not ids:
            raise UsageError(f"{where}: the verbalizer {w!r} tokenizes to nothing; give each label a non-empty answer")
    shared = common_prefix(plain)
    texts = task.choice_texts if isinstance(task, HarnessTask) and task.choice_texts else words
    norm = tuple(norm_length(t) for t in texts)
    choice = tuple(ids[len(shared)] for ids in plain if len(ids) > len(shared))
    distinct = len(choice) == len(plain) and len(set(choice)) == len(choice)
    if scoring == "first_token":
        if any(len(ids) <= len(shared) for ids in plain):
            raise UsageError(f"{where}: one verbalizer of {words!r} is a token prefix of another; make them differ")
        if not distinct:
            raise UsageError(
                f"{where}: verbalizers {words!r} share a distinguishing token {choice!r}; "
                "choose answer words that differ in their first token after a common prefix"
            )
    return Verbalizers(
        words=words,
        shared=tuple(shared),
        choice=choice if distinct else (),
        targets=targets,
        plain=tuple(tuple(p) for p in plain),
        norm_chars=norm,
        scoring=scoring,
    )


def document_choices(tokenizer: Any, task: Task, example: dict) -> tuple[list[tuple[int, ...]], list[int]]:
    """A document's choices (a task whose choices vary per document) as token ids of ``target_delimiter`` +
    choice, and their acc_norm lengths; ValueError when it has fewer than one choice or one tokenizes to
    nothing."""
    assert isinstance(task, HarnessTask)
    texts = task.example_choices(example) or []
    if not texts:
        raise ValueError(f"task {task.name}: a document has no choices")
    ids = [tuple(tokenizer(task.target_delimiter + t, add_special_tokens=False)["input_ids"]) for t in texts]
    if any(not i for i in ids):
        raise ValueError(f"task {task.name}: a choice of {texts!r} tokenizes to nothing")
    return ids, [norm_length(t) for t in texts]
