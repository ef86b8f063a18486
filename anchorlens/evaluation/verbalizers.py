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
    """Tokenize ``task``'s verbalizers; ValueError when two labels cannot be told apart by one token."""
    words = tuple(task.verbalizers)
    plain = [list(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in words]
    targets = tuple(tuple(tokenizer(w, add_special_tokens=True)["input_ids"]) for w in words)
    if any(not ids for ids in plain):
        raise ValueError(f"task {task.name}: a verbalizer of {words!r} tokenizes to nothing")
    shared = _common_prefix(plain)
    if any(len(ids) <= len(shared) for ids in plain):
        raise ValueError(f"task {task.name}: one verbalizer of {words!r} is a token prefix of another")
    choice = tuple(ids[len(shared)] for ids in plain)
    if len(set(choice)) != len(choice):
        raise ValueError(
            f"task {task.name}: verbalizers {words!r} share a distinguishing token {choice!r}; "
            "choose answer words that differ in their first token after a common prefix"
        )
    return Verbalizers(words=words, shared=tuple(shared), choice=choice, targets=targets)
