"""The architecture adapter: the one place that knows where an architecture keeps things."""
from __future__ import annotations

from typing import ClassVar

import torch

from anchorlens.capture.selection import Site
from anchorlens.roles.encoding import Encoded


class ArchAdapter:
    """Knows an architecture's attention sites, blocks, embeddings and how to run it on a batch.

    Subclasses set ``family``, ``model_types`` and ``stack_sequences`` (each stack's query and key
    sequence names, ``input`` or ``target``) and implement ``blocks``/``attention_module``.
    """

    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    stack_sequences: ClassVar[dict[str, tuple[str, str]]] = {}
    causal: ClassVar[bool] = True

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """The transformer blocks of ``stack``, in order (for ``cross``: the decoder blocks)."""
        raise NotImplementedError

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """The attention module of one block that receives the ``stack``'s attention call."""
        raise NotImplementedError

    def embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        """The input token embedding module."""
        return model.get_input_embeddings()

    def stacks(self) -> tuple[str, ...]:
        """Names of this architecture's attention stacks."""
        return tuple(self.stack_sequences)

    def attention_sites(self, model: torch.nn.Module) -> list[tuple[Site, torch.nn.Module]]:
        """Every (site, attention module) pair of the model."""
        out = []
        for stack in self.stacks():
            for layer, block in enumerate(self.blocks(model, stack)):
                out.append((Site(stack, layer), self.attention_module(block, stack)))
        return out

    def num_layers(self, model: torch.nn.Module, stack: str | None = None) -> int:
        """Number of blocks in ``stack`` (default: the first stack)."""
        return len(self.blocks(model, stack or self.stacks()[0]))

    def model_inputs(self, batch: Encoded) -> dict[str, torch.Tensor]:
        """Keyword arguments of the HF forward for ``batch``."""
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}

    def forward(self, model: torch.nn.Module, batch: Encoded, **kwargs):
        """Run the HF model on ``batch`` without a cache."""
        return model(**self.model_inputs(batch), use_cache=False, **kwargs) if self.causal else model(
            **self.model_inputs(batch), **kwargs
        )
