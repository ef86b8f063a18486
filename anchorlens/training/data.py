"""Training data: a seeded train/eval split and a resumable, seeded batch order."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from anchorlens.tasks import Task


def _unit_key(example: dict, task: Task) -> object:
    """What must stay on one side of a split: the example's group (MultiRC: a question's answers) or the example."""
    key = task.group_key(example)
    return id(example) if key is None else key


def split_train_eval(
    examples: Sequence[dict], task: Task, eval_share: float = 0.1, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Seeded split (default 90/10) keeping question groups whole; both sides get at least one unit."""
    units: dict[object, list[dict]] = {}
    for ex in examples:
        units.setdefault(_unit_key(ex, task), []).append(ex)
    groups = list(units.values())
    if len(groups) < 2:
        raise ValueError(f"cannot split {len(examples)} example(s) into train and eval; pass an eval file")
    n_eval = min(len(groups) - 1, max(1, math.ceil(eval_share * len(groups))))
    perm = torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed)).tolist()
    eval_ids = set(perm[:n_eval])
    train = [ex for i, g in enumerate(groups) if i not in eval_ids for ex in g]
    held = [ex for i, g in enumerate(groups) if i in eval_ids for ex in g]
    return train, held


# examples per length-sorted window when batches are grouped by length (HF Trainer's megabatch idea, 50 batches)
GROUP_WINDOW_BATCHES = 50


class BatchOrder:
    """Batches of example indices: a fresh seeded permutation per epoch; the last batch of an epoch may be short.

    With ``lengths`` (tokens per example) each epoch's permutation is cut into windows of
    ``GROUP_WINDOW_BATCHES`` batches, each window is sorted by length and cut into batches, and the full
    batches are shuffled (the short one stays last): batches hold examples of similar length, so far
    less padding is computed, while every epoch still visits every example once in a seeded random order.
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int = 0, lengths: Sequence[int] | None = None) -> None:
        """Order ``num_examples`` indices in batches of ``batch_size`` using a generator seeded with ``seed``."""
        if num_examples < 1 or batch_size < 1:
            raise ValueError(f"need examples and a positive batch size; got {num_examples} and {batch_size}")
        if lengths is not None and len(lengths) != num_examples:
            raise ValueError(f"need one length per example; got {len(lengths)} for {num_examples}")
        self.num_examples, self.batch_size = num_examples, batch_size
        self.lengths = None if lengths is None else [int(n) for n in lengths]
        self.generator = torch.Generator().manual_seed(seed)
        self.perm: list[int] = []
        self.cursor = 0
        self.epoch = 0

    def next_batch(self) -> list[int]:
        """The next batch of indices (drawing a new permutation at an epoch's start)."""
        if self.cursor >= len(self.perm):
            self.perm = self._epoch_order()
            self.cursor = 0
            self.epoch += 1
        out = self.perm[self.cursor : self.cursor + self.batch_size]
        self.cursor += len(out)
        return out

    def _epoch_order(self) -> list[int]:
        """One epoch's order: a seeded permutation, grouped by length when lengths are known."""
        perm = torch.randperm(self.num_examples, generator=self.generator).tolist()
        if self.lengths is None:
            return perm
        size, lengths = self.batch_size, self.lengths
        window = size * GROUP_WINDOW_BATCHES
        batches: list[list[int]] = []
        for start in range(0, len(perm), window):
            part = sorted(perm[start : start + window], key=lambda i: -lengths[i])
            batches.extend(part[k : k + size] for k in range(0, len(part), size))
        short = [b for b in batches if len(b) < size]
        full = [b for b in batches if len(b) == size]
        shuffled = [full[i] for i in torch.randperm(len(full), generator=self.generator).tolist()]
        return [i for b in shuffled + short for i in b]

    @property
    def epochs_done(self) -> float:
        """Epochs consumed so far (fractional)."""
        if not self.perm:
            return 0.0
        return self.epoch - 1 + self.cursor / len(self.perm)

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """(tensors, json-able facts) that restore this order exactly."""
        return {"order.generator": self.generator.get_state()}, {
            "perm": self.perm,
            "cursor": self.cursor,
            "epoch": self.epoch,
            "num_examples": self.num_examples,
            "batch_size": self.batch_size,
        }

    def load_state(self, tensors: dict[str, torch.Tensor], facts: dict) -> None:
        """Restore a state saved by ``state``; ValueError when the data size or batch size differs."""
        if facts["num_examples"] != self.num_examples or facts["batch_size"] != self.batch_size:
            raise ValueError(
                f"checkpoint was made with {facts['num_examples']} examples in batches of {facts['batch_size']}, "
                f"now {self.num_examples} in batches of {self.batch_size}"
            )
        self.generator.set_state(tensors["order.generator"])
        self.perm, self.cursor, self.epoch = list(facts["perm"]), int(facts["cursor"]), int(facts["epoch"])


def steps_for_epochs(num_examples: int, batch_size: int, grad_accum: int, epochs: float) -> int:
    """Optimizer steps that cover ``epochs`` passes over ``num_examples``."""
    per_epoch = math.ceil(num_examples / batch_size)
    return max(1, math.ceil(per_epoch * epochs / grad_accum))
