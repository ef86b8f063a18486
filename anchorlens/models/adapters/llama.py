"""Adapter for decoder-only Llama-family models (Llama, Qwen2, SmolLM2, Mistral)."""
from __future__ import annotations

import torch

from anchorlens.models.adapters.base import ArchAdapter


class LlamaAdapter(ArchAdapter):
    """Decoder blocks at ``model.model.layers[i]``, attention at ``.self_attn``, rotary positions."""

    family = "llama"
    model_types = ("llama", "qwen2", "mistral", "qwen3")
    stack_sequences = {"decoder": ("input", "input")}

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Decoder layers."""
        return list(model.model.layers)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``block.self_attn``."""
        return block.self_attn
