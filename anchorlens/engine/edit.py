"""The edit protocol: what an intervention (a knockout) supplies to each attention call.

An editor answers two questions per call of an attention module: whether the call only records a key and value
for a later call (a mean knockout computes the keys' key/value from their mean state, then the real call reads
them), and which weights the call loses (:class:`KnockoutEdit`). :mod:`anchorlens.methods.knockout` implements it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import nn


@dataclass(frozen=True)
class KnockoutEdit:
    """Which weights one attention call loses, per mode: bool [B, H|1, Q, K] (True = knocked out) or None.

    before: masked before the softmax (renorm); after: zeroed after it (zero); value: removed from the output
    only (the keys' values zeroed for these queries and heads); mean: these queries and heads read the key and value
    of ``mean_key``/``mean_value`` [B, H_kv, K, D] (computed from the dataset-mean hidden state) instead of the call's.
    """

    before: torch.Tensor | None = None
    after: torch.Tensor | None = None
    value: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    mean_key: torch.Tensor | None = None
    mean_value: torch.Tensor | None = None

    def aligned(self, key: torch.Tensor, value: torch.Tensor) -> KnockoutEdit:
        """This edit with ``mean_key``/``mean_value`` covering the call's K keys (key [B, H_kv, K, D]): key-only
        positions in front (a prefix), which have no hidden state to replace, keep the call's own."""
        if self.mean_key is None or self.mean_value is None or self.mean_key.shape[2] == key.shape[2]:
            return self
        extra = key.shape[2] - self.mean_key.shape[2]
        return replace(
            self,
            mean_key=torch.cat([key[:, :, :extra], self.mean_key], dim=2),
            mean_value=torch.cat([value[:, :, :extra], self.mean_value], dim=2),
        )

    @staticmethod
    def chunk(mask: torch.Tensor | None, start: int, stop: int, keys: int) -> torch.Tensor | None:
        """``mask`` for queries ``start:stop`` and the first ``keys`` keys (None stays None)."""
        return None if mask is None else mask[..., start:stop, :keys]


class AttentionEditor(Protocol):
    """What the active edit supplies to every call of the engine's attention function."""

    def record(self, module: nn.Module, key: torch.Tensor, value: torch.Tensor) -> bool:
        """True when this call of ``module`` only computes a key and value (key, value [B, H_kv, K, D]) the editor
        keeps for the module's real call: the attention function then skips its own math."""
        ...

    def call_edit(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor) -> KnockoutEdit | None:
        """The weights the call of ``module`` loses (query [B, H, Q, D], key [B, H_kv, K, D]); None: no edit here."""
        ...
