"""Deep prompts (P-tuning v2 as per-layer tokens): n learned vectors per layer, inserted and removed."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from anchorlens.methods.base import Guidance
from anchorlens.methods.config import MethodConfig
from anchorlens.methods.positions import Position
from anchorlens.methods.soft_prompt import embedding_std
from anchorlens.methods.stacks import choose_layer_stacks, layers_of
from anchorlens.roles.kinds import Role


@dataclass(frozen=True)
class DeepPromptConfig(MethodConfig):
    """Spec ``deep-prompt`` (checkpoint kind ``deep_prompt``): n learned vectors at every layer."""

    name = "deep-prompt"
    kind = "deep_prompt"
    aliases = ("deep_prompt", "deepprompt")
    context_bounded = ("n",)

    n: int = field(default=5, metadata={"doc": "learned vectors per layer"})
    position: str | int = field(default="first", metadata={"doc": "where the vectors go in each layer's sequence"})
    stacks: tuple[str, ...] | None = field(
        default=None, metadata={"doc": "stacks to insert into (encoder/decoder); default all the base supports"}
    )

    def count(self) -> int:
        """n per layer."""
        return self.n

    def parameter_count(self, base) -> int:
        """layers * n * d over the chosen stacks."""
        return sum(layers_of(base, self.stacks, self.kind).values()) * self.n * base.hidden_size


class DeepPrompt(Guidance):
    """``n`` vectors spliced into the sequence entering every block and removed after it (role SOFT_PROMPT).

    Parameters: ``prompts[stack]`` [layers, n, d], random N(0, std(E)). ``stacks``: which
    self-attention stacks (default: all the adapter supports, e.g. T5 encoder and decoder).
    """

    kind = "deep_prompt"
    spec_name = "deep-prompt"
    role = Role.SOFT_PROMPT
    level = "layer"
    config: DeepPromptConfig

    def __init__(
        self, n: int = 5, position: str | int | Position = "first", stacks: tuple[str, ...] | str | None = None
    ) -> None:
        super().__init__(DeepPromptConfig(n=n, position=Position.parse(position).value, stacks=stacks))  # type: ignore[arg-type]
        self.prompts = nn.ParameterDict()

    @property
    def n(self) -> int:
        """Vectors per layer."""
        return self.config.n

    @property
    def requested_stacks(self) -> tuple[str, ...] | None:
        """Stacks asked for (None: all)."""
        return self.config.stacks

    def choose_stacks(self, adapter) -> tuple[str, ...]:
        """The requested stacks, or every stack the adapter can insert into."""
        return choose_layer_stacks(adapter, self.requested_stacks, self.kind)

    def build(self, base, generator: torch.Generator) -> None:
        """Create ``prompts[stack]`` [layers, n, d]."""
        std = embedding_std(base)
        for stack in self.stacks:
            self.prompts[stack] = nn.Parameter(
                torch.randn(self.layers[stack], self.n, self.hidden_size, generator=generator) * std
            )

    def layer_vectors(
        self, stack: str, layer: int, hidden: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """This layer's prompts for every example: [B, n, d]."""
        return self.prompts[stack][layer].to(hidden.dtype).unsqueeze(0).expand(hidden.shape[0], -1, -1)
