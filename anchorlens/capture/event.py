"""What capture hands to a sink for one attention call."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from anchorlens.roles.layout import Layout


@dataclass(frozen=True)
class AttentionEvent:
    """Attention probabilities of one (stack, layer) for one batch.

    probs: [B, H, Q, K] float32, rows sum to 1 over visible keys (0 elsewhere); only the selected
    heads, whose model indices are ``heads`` ([H] long). visible: [B, 1, Q, K] bool, which keys each
    query may attend to (causal and padding masks combined). layout: roles of queries ([B, Q]) and
    keys ([B, K]). example_ids: [B] long, the examples' dataset indices.
    """

    stack: str
    layer: int
    heads: torch.Tensor
    probs: torch.Tensor
    visible: torch.Tensor
    layout: Layout
    example_ids: torch.Tensor

    @property
    def query_valid(self) -> torch.Tensor:
        """[B, Q] bool: queries that are real positions (not padding)."""
        return self.layout.q.valid

    @property
    def key_valid(self) -> torch.Tensor:
        """[B, K] bool: keys that are real positions (not padding)."""
        return self.layout.k.valid
