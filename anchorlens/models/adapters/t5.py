"""Adapter for T5 encoder-decoder models (relative position bias; three attention stacks)."""
from __future__ import annotations

import torch

from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.roles.encoding import Encoded


class T5Adapter(ArchAdapter):
    """Encoder self-attention, decoder self-attention and decoder cross-attention."""

    family = "t5"
    model_types = ("t5", "mt5")
    stack_sequences = {
        "encoder": ("input", "input"),
        "decoder": ("target", "target"),
        "cross": ("target", "input"),
    }
    causal = False

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Encoder blocks for ``encoder``; decoder blocks for ``decoder`` and ``cross``."""
        side = model.encoder if stack == "encoder" else model.decoder
        return list(side.block)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``layer[0].SelfAttention`` or, for ``cross``, ``layer[1].EncDecAttention``."""
        if stack == "cross":
            return block.layer[1].EncDecAttention
        return block.layer[0].SelfAttention

    def model_inputs(self, batch: Encoded) -> dict[str, torch.Tensor]:
        """Encoder inputs plus decoder inputs (the batch's target side)."""
        if batch.target_ids is None:
            raise ValueError("a T5 base needs decoder inputs: encode the batch with a target side")
        return {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "decoder_input_ids": batch.target_ids,
            "decoder_attention_mask": batch.target_mask,
        }

    def forward(self, model: torch.nn.Module, batch: Encoded, **kwargs):
        """Run encoder and decoder without a cache."""
        return model(**self.model_inputs(batch), use_cache=False, **kwargs)
