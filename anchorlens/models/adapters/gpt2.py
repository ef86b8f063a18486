"""Adapter for GPT-2 (learned absolute positions, Conv1D attention)."""
from __future__ import annotations

import torch

from anchorlens.models.adapters.base import ArchAdapter


class GPT2Adapter(ArchAdapter):
    """Blocks at ``model.transformer.h[i]``, attention at ``.attn``.

    Learned absolute positions are added once, to the input embeddings: positions kept from the
    input (soft prompts, instance tokens) get the position embedding of their slot, but per-layer
    inserted positions (deep prompts, capsules) get none, and the real tokens keep the position
    embeddings they got at the input.
    """

    family = "gpt2"
    model_types = ("gpt2",)
    stack_sequences = {"decoder": ("input", "input")}
    guidance_stacks = ("decoder",)
    supports_prefix = True
    block_args = ("hidden_states", "cache", "attention_mask", "encoder_hidden_states", "encoder_attention_mask", "use_cache")

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Transformer blocks."""
        return list(model.transformer.h)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``block.attn``."""
        return block.attn

    def kv_geometry(self, model: torch.nn.Module) -> tuple[int, int, int]:
        """(layers, heads, head dim)."""
        cfg = model.config
        return cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
