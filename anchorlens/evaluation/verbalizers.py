"""Token ids of a task's verbalizers (answer words) for one tokenizer.

Decoder-only scoring uses one forward pass: the tokens all verbalizers share at their start
(``shared``, e.g. the ``" "`` of ``" 1"``/``" 2"`` for SmolLM2) are appended to every input —
label-independent, so instance-aware guidance sees the same input for every label — and each
label is scored by the log-probability of its first *distinguishing* token (``choice``) at the
last position. The shared prefix's log-probability is the same for all labels and is dropped;
tokens after the distinguishing one (e.g. the tail of a multi-token ``" maybe"``) are not scored.
Encoder-decoder scoring uses the whole verbalizer as the decoder target (``targets``, with the
tokenizer's ``</s>``) and sums its log-likelihood.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anchorlens.errors import UsageError
from anchorlens.tasks import Task


@dataclass(frozen=True)
class Verbalizers:
    """Verbalizer token ids for one (task, tokenizer) pair.

    shared: token ids common to the start of every verbalizer; choice: per label, its first token
    after ``shared``; targets: per label, the full target token ids (encoder-decoder bases).
    """

    words: tuple[str, ...]
    shared: tuple[int, ...]
    choice: tuple[int, ...]
    targets: tuple[tuple[int, ...], ...]

    @property
    def num_labels(self) -> int:
        """Number of labels L."""
        return len(self.words)


def _common_prefix(rows: list[list[int]]) -> list[int]:
    """Longest token prefix shared by every row."""
    out: list[int] = []
    for column in zip(*rows):
        if len(set(column)) != 1:
            break
        out.append(column[0])
    return out


def verbalizer_ids(tokenizer: Any, task: Task) -> Verbalizers:
    """Tokenize ``task``'s verbalizers; UsageError (naming the task file) when one tokenizes to nothing or two labels
    cannot be told apart by one token."""
    if not task.has_labels:
        raise UsageError(f"task {task.name} has no labels: scoring needs verbalizers (a classification task)")
    words = tuple(task.verbalizers)
    where = task.source if task.source and not task.source.startswith("builtin:") else f"task {task.name}"
    plain = [list(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in words]
    targets = tuple(tuple(tokenizer(w, add_special_tokens=True)["input_ids"]) for w in words)
    for w, ids in zip(words, plain):
        if not ids:
            raise UsageError(f"{where}: the verbalizer {w!r} tokenizes to nothing; give each label a non-empty answer")
    shared = _common_prefix(plain)
    if any(len(ids) <= len(shared) for ids in plain):
        raise UsageError(f"{where}: one verbalizer of {words!r} is a token prefix of another; make them differ")
    choice = tuple(ids[len(shared)] for ids in plain)
    if len(set(choice)) != len(choice):
        raise UsageError(
            f"{where}: verbalizers {words!r} share a distinguishing token {choice!r}; "
            "choose answer words that differ in their first token after a common prefix"
        )
    return Verbalizers(words=words, shared=tuple(shared), choice=choice, targets=targets)
