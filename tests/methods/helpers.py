"""Test helpers for guided models: padded batches, a collecting sink, hand-written splicing."""
from __future__ import annotations

import torch

from anchorlens.tasks import bundled_examples, get_task


class Collect:
    """Sink that keeps every event (tests only)."""

    def __init__(self) -> None:
        self.events = []

    def consume(self, event) -> None:
        self.events.append(event)


def rte_batch(base, padding_side: str = "right", n: int = 3):
    """A padded batch of ``n`` bundled RTE examples."""
    task = get_task("rte")
    examples = bundled_examples("rte")[:n]
    old = base.tokenizer.padding_side
    base.tokenizer.padding_side = padding_side
    try:
        batch = base.encode([task.template.render(ex) for ex in examples])
    finally:
        base.tokenizer.padding_side = old
    assert batch.attention_mask.min() == 0, "the batch must contain padding"
    return batch


def insert_rows(x: torch.Tensor, index: list[int], new: torch.Tensor) -> torch.Tensor:
    """Per example b: x[b, :i] ++ new[b] ++ x[b, i:] (x [B, T, ...], new [B, n, ...])."""
    return torch.stack([torch.cat([x[b, :i], new[b], x[b, i:]]) for b, i in enumerate(index)])


def drop_rows(x: torch.Tensor, index: list[int], n: int) -> torch.Tensor:
    """Per example b: x[b] without rows [i, i+n)."""
    return torch.stack([torch.cat([x[b, :i], x[b, i + n :]]) for b, i in enumerate(index)])


def first_valid(mask: torch.Tensor) -> list[int]:
    """Index of the first valid token per example."""
    return [int(row.nonzero()[0]) for row in mask]


def after_last_valid(mask: torch.Tensor) -> list[int]:
    """Index right after the last valid token per example."""
    return [int(row.nonzero()[-1]) + 1 for row in mask]


def masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid positions: x [B, T, d], valid [B, T] -> [B, d]."""
    w = valid.float().unsqueeze(-1)
    return (x * w).sum(1) / w.sum(1)
