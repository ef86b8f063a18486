"""Adapter for decoder-only Llama-family models (Llama, Qwen2, SmolLM2, Mistral)."""
from __future__ import annotations

import torch

from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.splice import Splice


class LlamaAdapter(ArchAdapter):
    """Decoder blocks at ``model.model.layers[i]``, attention at ``.self_attn``, rotary positions."""

    family = "llama"
    model_types = ("llama", "qwen2", "mistral", "qwen3")
    stack_sequences = {"decoder": ("input", "input")}
    guidance_stacks = ("decoder",)
    supports_prefix = True
    block_args = ("hidden_states", "attention_mask", "position_ids", "cache", "use_cache", "position_embeddings")

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Decoder layers."""
        return list(model.model.layers)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``block.self_attn``."""
        return block.self_attn

    def kv_geometry(self, model: torch.nn.Module) -> tuple[int, int, int]:
        """(layers, key/value heads, head dim); grouped-query models have fewer kv heads."""
        cfg = model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads, head_dim

    def splice_block_inputs(self, model, stack, args, kwargs, hidden, splice: Splice, valid, memo):
        """Also recompute the rotary cos/sin for the T+N spliced positions with the model's rotary module."""
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(splice.old_len, device=hidden.device).unsqueeze(0)
            kwargs = {**kwargs, "position_ids": pos}
        args, kwargs = super().splice_block_inputs(model, stack, args, kwargs, hidden, splice, valid, memo)
        key = ("rope", id(splice))
        if key not in memo:
            memo[key] = model.model.rotary_emb(hidden, kwargs["position_ids"])
        return self.set_arg(args, kwargs, "position_embeddings", memo[key])
