"""Adapter for GPT-2 (learned absolute positions, Conv1D attention)."""
from __future__ import annotations

import torch

from anchorlens.models.adapters.base import ArchAdapter


class GPT2Adapter(ArchAdapter):
    """Blocks at ``model.transformer.h[i]``, attention at ``.attn``."""

    family = "gpt2"
    model_types = ("gpt2",)
    stack_sequences = {"decoder": ("input", "input")}

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Transformer blocks."""
        return list(model.transformer.h)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``block.attn``."""
        return block.attn
