"""Deep prompts (P-tuning v2 as per-layer tokens): n learned vectors per layer, inserted and removed."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.positions import Position
from anchorlens.methods.soft_prompt import embedding_std
from anchorlens.methods.stacks import choose_layer_stacks
from anchorlens.roles.kinds import Role


class DeepPrompt(Guidance):
    """``n`` vectors spliced into the sequence entering every block and removed after it (role SOFT_PROMPT).

    Parameters: ``prompts[stack]`` [layers, n, d], random N(0, std(E)). ``stacks``: which
    self-attention stacks (default: all the adapter supports, e.g. T5 encoder and decoder).
    """

    kind = "deep_prompt"
    spec_name = "deep-prompt"
    role = Role.SOFT_PROMPT
    level = "layer"

    def __init__(self, n: int = 5, position: str | int | Position = "first", stacks: tuple[str, ...] | str | None = None) -> None:
        super().__init__(position)
        if int(n) < 1:
            raise UsageError(f"a deep prompt needs n >= 1 vectors per layer; got n={n}")
        self.n = int(n)
        self.requested_stacks = (stacks,) if isinstance(stacks, str) else (tuple(stacks) if stacks else None)
        self.prompts = nn.ParameterDict()

    def choose_stacks(self, adapter) -> tuple[str, ...]:
        """The requested stacks, or every stack the adapter can insert into."""
        return choose_layer_stacks(adapter, self.requested_stacks, self.kind)

    def build(self, base, generator: torch.Generator) -> None:
        """Create ``prompts[stack]`` [layers, n, d]."""
        std = embedding_std(base)
        for stack in self.stacks:
            self.prompts[stack] = nn.Parameter(torch.randn(self.layers[stack], self.n, self.hidden_size, generator=generator) * std)

    def count(self) -> int:
        """n per layer."""
        return self.n

    def options(self) -> dict[str, Any]:
        """n, pos, stacks."""
        return {"n": self.n, "position": self.position.value, "stacks": list(self.requested_stacks) if self.requested_stacks else None}

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "DeepPrompt":
        """Rebuild from ``options()``."""
        opts = dict(options)
        if opts.get("stacks"):
            opts["stacks"] = tuple(opts["stacks"])
        return cls(**opts)

    def layer_vectors(self, stack: str, layer: int, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """This layer's prompts for every example: [B, n, d]."""
        return self.prompts[stack][layer].to(hidden.dtype).unsqueeze(0).expand(hidden.shape[0], -1, -1)
