"""Adapter for BERT-style bidirectional encoders."""

from __future__ import annotations

from typing import Any

import torch

from anchorlens.models.adapters.base import ArchAdapter


class BertAdapter(ArchAdapter):
    """Blocks at ``encoder.layer[i]``, attention at ``.attention.self``; no causal mask."""

    family = "bert"
    model_types = ("bert",)
    stack_sequences = {"encoder": ("input", "input")}
    causal = False
    supports_guidance = False

    def _core(self, model: torch.nn.Module) -> Any:
        return model.bert if hasattr(model, "bert") else model

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Encoder layers."""
        return list(self._core(model).encoder.layer)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``block.attention.self``."""
        layer: Any = block
        return layer.attention.self
