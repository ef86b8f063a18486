"""Where inserted positions go in a batch of sequences: pure index geometry, no architecture.

A ``Splice`` turns sequences of length T into sequences of length T+N: every new position either
copies an old position or takes one of N new vectors (a "slot"). Insertion points may differ per
example (left/right padding, positions resolved per example). The same object moves hidden
states, roles, masks and position ids, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import torch


def _gather_seq(x: torch.Tensor, index: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """x gathered along ``dim`` with a [B, L] index (x's leading dim is B; trailing dims kept)."""
    shape = list(x.shape)
    shape[dim] = index.shape[1]
    view = [index.shape[0]] + [1] * (x.dim() - 1)
    view[dim] = index.shape[1]
    return x.gather(dim, index.view(view).expand(shape))


def visible_of(mask: torch.Tensor) -> torch.Tensor:
    """Boolean visibility of a mask that is boolean or additive (0 visible, dtype min hidden)."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def like_mask(visible: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """``visible`` (bool) in the form of ``template``: boolean, or additive in its dtype."""
    if template.dtype == torch.bool:
        return visible
    low = torch.finfo(template.dtype).min
    return torch.zeros(visible.shape, dtype=template.dtype, device=visible.device).masked_fill(~visible, low)


@dataclass(frozen=True)
class Splice:
    """Insertion geometry of one batch.

    src: [B, T+N] long, the old index each new position copies, -1 for inserted positions.
    slot: [B, T+N] long, the inserted vector (0..N-1) an inserted position takes, -1 for old ones.
    old_len: T.
    """

    src: torch.Tensor
    slot: torch.Tensor
    old_len: int

    # ------------------------------------------------------------------ construction
    @classmethod
    def insert(cls, index: torch.Tensor, count: int, old_len: int) -> Splice:
        """Insert ``count`` slots before per-example ``index`` ([B] long, 0..T)."""
        b = index.shape[0]
        pos = torch.arange(old_len + count, device=index.device).expand(b, -1)
        start = index.view(b, 1)
        inserted = (pos >= start) & (pos < start + count)
        src = torch.where(pos < start, pos, pos - count).masked_fill(inserted, -1)
        slot = torch.where(inserted, pos - start, torch.full_like(pos, -1))
        return cls(src, slot, old_len)

    def then(self, other: Splice) -> Splice:
        """This splice followed by ``other`` (whose old sequence is this one's new sequence)."""
        from_old = other.src >= 0
        idx = other.src.clamp_min(0)
        src = torch.where(from_old, self.src.gather(1, idx), torch.full_like(other.src, -1))
        slot = torch.where(from_old, self.slot.gather(1, idx), other.slot + self.num_slots)
        return Splice(src, slot, self.old_len)

    # ------------------------------------------------------------------ facts
    @property
    def new_len(self) -> int:
        """T+N."""
        return int(self.src.shape[1])

    @property
    def num_slots(self) -> int:
        """N, inserted positions per example."""
        return self.new_len - self.old_len

    @property
    def inserted(self) -> torch.Tensor:
        """[B, T+N] bool: positions that are inserted."""
        return self.src < 0

    def keep_index(self) -> torch.Tensor:
        """[B, T] long: the new position of every old position."""
        b = self.src.shape[0]
        pos = torch.arange(self.new_len, device=self.src.device).expand(b, -1)
        out = torch.zeros(b, self.old_len + 1, dtype=torch.long, device=self.src.device)
        out.scatter_(1, self.src.masked_fill(self.inserted, self.old_len), pos)
        return out[:, : self.old_len]

    def slot_index(self) -> torch.Tensor:
        """[B, N] long: the new position of every slot."""
        b = self.src.shape[0]
        pos = torch.arange(self.new_len, device=self.src.device).expand(b, -1)
        out = torch.zeros(b, self.num_slots + 1, dtype=torch.long, device=self.src.device)
        out.scatter_(1, self.slot.masked_fill(~self.inserted, self.num_slots), pos)
        return out[:, : self.num_slots]

    # ------------------------------------------------------------------ moving tensors
    def apply(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] old and [B, N, ...] slot values -> [B, T+N, ...]."""
        b = self.src.shape[0]
        old = old.expand(b, *old.shape[1:])
        both = torch.cat([old, new.to(old.dtype).expand(b, *new.shape[1:])], dim=1)
        index = torch.where(self.inserted, self.old_len + self.slot, self.src)
        return _gather_seq(both, index)

    def remove(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T+N, ...] -> [B, T, ...]: the old positions only."""
        return _gather_seq(x, self.keep_index())

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T+N, ...] -> [B, N, ...]: the inserted positions, in slot order."""
        return _gather_seq(x, self.slot_index())

    def positions(self, old: torch.Tensor) -> torch.Tensor:
        """Position ids [B|1, T] -> [B, T+N]; later positions shift by the slots inserted before them.

        For old = c + arange(T) this gives c + arange(T+N): exactly what concatenation would give.
        """
        b = self.src.shape[0]
        old = old.expand(b, self.old_len)
        ins = self.inserted.long()
        before = ins.cumsum(1) - ins
        j = torch.arange(self.new_len, device=self.src.device).expand(b, -1)
        nxt = (j - before).clamp_max(self.old_len - 1)
        after_end = (j - before) >= self.old_len
        base_ins = old.gather(1, nxt) + after_end.long()
        base_old = old.gather(1, self.src.clamp_min(0))
        return torch.where(self.inserted, base_ins, base_old) + before

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """[B|1, H, T, K] -> [B, H, T+N, K]; inserted rows copy the row they were inserted before."""
        b = self.src.shape[0]
        if t.shape[2] == 1:  # broadcast rows: nothing to move
            return t.expand(b, t.shape[1], self.new_len, t.shape[3])
        t = t.expand(b, *t.shape[1:])
        ins = self.inserted.long()
        before = ins.cumsum(1) - ins
        j = torch.arange(self.new_len, device=self.src.device).expand(b, -1)
        idx = torch.where(self.inserted, (j - before).clamp_max(self.old_len - 1), self.src)
        return _gather_seq(t, idx, dim=2)

    def unrows(self, t: torch.Tensor) -> torch.Tensor:
        """[B|1, H, T+N, K] -> [B, H, T, K]: the old query rows only."""
        b = self.src.shape[0]
        if t.shape[2] == 1:
            return t.expand(b, t.shape[1], self.old_len, t.shape[3])
        return _gather_seq(t.expand(b, *t.shape[1:]), self.keep_index(), dim=2)

    @overload
    def mask(self, mask: None, causal: bool, valid: torch.Tensor) -> None: ...
    @overload
    def mask(self, mask: torch.Tensor, causal: bool, valid: torch.Tensor) -> torch.Tensor: ...

    def mask(self, mask: torch.Tensor | None, causal: bool, valid: torch.Tensor) -> torch.Tensor | None:
        """Extend an attention mask [B|1, 1, T|1, P+T] (boolean, or additive as eager builds it) to [B, 1, T+N, P+T+N].

        P leading key columns (a prefilled prefix) are kept and stay visible to inserted queries.
        Old query/key pairs keep their old entries; inserted keys are visible to every query
        (causal: every query at or after them); inserted queries see the valid keys (causal: up to
        themselves). ``valid``: [B, T+N] bool validity of the new sequence. None stays None (no
        padding, plain causal or bidirectional attention, and no prefix).
        """
        if mask is None:
            return None
        if mask.dtype != torch.bool:  # additive (eager) mask: 0 visible, dtype min hidden
            return like_mask(self.mask(visible_of(mask), causal, valid), mask)
        b, t, tn = self.src.shape[0], self.old_len, self.new_len
        past = mask.shape[-1] - t
        m = mask.expand(b, 1, t, mask.shape[-1])
        src = self.src.clamp_min(0)
        m = _gather_seq(m, src, dim=2)  # [B,1,Tn,P+T]
        body = _gather_seq(m[..., past:].squeeze(1), src, dim=2)  # [B,Tn,Tn]
        dev = self.src.device
        q = torch.arange(tn, device=dev).view(1, tn, 1)
        k = torch.arange(tn, device=dev).view(1, 1, tn)
        order = (k <= q) if causal else torch.ones(1, tn, tn, dtype=torch.bool, device=dev)
        ins_q = self.inserted[:, :, None]
        ins_k = self.inserted[:, None, :]
        body = torch.where(ins_q, order & valid[:, None, :], body)
        body = torch.where(ins_k, order.expand(b, tn, tn), body)
        head = m[..., :past].squeeze(1) | ins_q
        return torch.cat([head, body], dim=-1).unsqueeze(1)
