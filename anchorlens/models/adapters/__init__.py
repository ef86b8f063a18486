"""Architecture adapters, chosen from ``config.model_type``; adding a family = adding one module."""
from __future__ import annotations

from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.bert import BertAdapter
from anchorlens.models.adapters.gpt2 import GPT2Adapter
from anchorlens.models.adapters.llama import LlamaAdapter
from anchorlens.models.adapters.t5 import T5Adapter

ADAPTERS: tuple[type[ArchAdapter], ...] = (LlamaAdapter, GPT2Adapter, BertAdapter, T5Adapter)


def adapter_for(model_type: str) -> ArchAdapter:
    """The adapter for a HF ``model_type``; ValueError lists the supported ones."""
    for cls in ADAPTERS:
        if model_type in cls.model_types:
            return cls()
    known = ", ".join(t for cls in ADAPTERS for t in cls.model_types)
    raise ValueError(f"unsupported architecture {model_type!r}; anchorlens supports: {known}")


__all__ = ["ADAPTERS", "ArchAdapter", "BertAdapter", "GPT2Adapter", "LlamaAdapter", "T5Adapter", "adapter_for"]
