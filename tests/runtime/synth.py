"""Synthetic per-example attention, batched with left padding into AttentionEvents."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from anchorlens.capture.event import AttentionEvent
from anchorlens.roles.kinds import NUM_ROLES
from anchorlens.roles.layout import Layout, SequenceRoles

HEADS = 2
SITES = (("decoder", 0), ("decoder", 1))


@dataclass(frozen=True)
class Item:
    """One example at one site: causal probs [H, T, T] and roles [T] (T may be 0)."""

    probs: torch.Tensor
    roles: torch.Tensor


def make_items(n: int, seed: int, max_len: int = 6, heads: int = HEADS) -> dict[tuple[str, int], list[Item]]:
    """Random examples (some of length 0) at every site of ``SITES``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (n,), generator=g).tolist()
    out = {}
    for site in SITES:
        items = []
        for t in lengths:
            logits = torch.randn(heads, t, t, generator=g) * 3
            logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            items.append(Item(torch.softmax(logits, -1), torch.randint(0, NUM_ROLES, (t,), generator=g)))
        out[site] = items
    return out


def batch_event(
    items: Sequence[Item], ids: Sequence[int], site: tuple[str, int], nan_padding: bool = True
) -> AttentionEvent:
    """Left-pad ``items`` into one event; padding query rows are NaN (reducers must ignore them)."""
    b = len(items)
    h = items[0].probs.shape[0] if items else HEADS
    t = max([it.roles.numel() for it in items] + [1])
    probs = torch.full((b, h, t, t), float("nan") if nan_padding else 0.0)
    roles = torch.zeros(b, t, dtype=torch.long)
    valid = torch.zeros(b, t, dtype=torch.bool)
    for row, it in enumerate(items):
        n = it.roles.numel()
        if n:
            probs[row, :, t - n :, :] = 0.0
            probs[row, :, t - n :, t - n :] = it.probs
            roles[row, t - n :] = it.roles
            valid[row, t - n :] = True
    visible = valid[:, None, None, :] & torch.ones(t, t, dtype=torch.bool).tril()
    seq = SequenceRoles(roles, valid)
    return AttentionEvent(
        site[0],
        site[1],
        torch.arange(h),
        probs,
        visible,
        Layout.self_attention(seq),
        torch.as_tensor(list(ids), dtype=torch.long),
    )


def feed(reducers, data: dict[tuple[str, int], list[Item]], batches: Sequence[Sequence[int]], sites=SITES) -> None:
    """Update ``reducers`` with every batch (lists of example ids) at every site."""
    for ids in batches:
        for site in sites:
            event = batch_event([data[site][i] for i in ids], ids, site)
            for r in reducers:
                r.update(event)
