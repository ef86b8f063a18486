"""Prompt tuning: n learned vectors spliced into the input embeddings and kept (role SOFT_PROMPT)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.config import MethodConfig
from anchorlens.methods.positions import Position
from anchorlens.roles.kinds import Role

PAPER_PROMPT_LENGTH = 100  # the CaPT paper's soft prompt length


def embedding_std(base) -> float:
    """Standard deviation of the base's input embedding matrix (scale for random inits)."""
    return float(base.adapter.embeddings(base.model).weight.detach().float().std())


@dataclass(frozen=True)
class PromptConfig(MethodConfig):
    """Spec ``prompt`` (checkpoint kind ``soft_prompt``): Lester et al.'s prompt tuning."""

    name = "prompt"
    kind = "soft_prompt"
    aliases = ("soft-prompt", "soft_prompt")
    context_bounded = ("n",)

    n: int = field(default=PAPER_PROMPT_LENGTH, metadata={"doc": "learned vectors (the paper uses 100)"})
    init: Literal["vocab", "random"] = field(
        default="vocab", metadata={"doc": "copies of random vocabulary embeddings, or N(0, std(E))"}
    )
    position: str | int = field(
        default="first", metadata={"doc": "where the vectors go (first, middle, last, an index...)"}
    )

    def count(self) -> int:
        """n."""
        return self.n

    def parameter_count(self, base) -> int:
        """n * d."""
        return self.n * base.hidden_size


SOFT_PROMPT_INITS = ("vocab", "random")


class SoftPrompt(Guidance):
    """``n`` learned input vectors (Lester et al.); ``init``: copies of random vocabulary rows or N(0, std(E)).

    Parameters: ``prompt`` [n, d]. ``vectors`` ([n, d]) sets them directly (PEFT import).
    """

    kind = "soft_prompt"
    spec_name = "prompt"
    role = Role.SOFT_PROMPT
    level = "input"
    config: PromptConfig

    def __init__(
        self,
        n: int = PAPER_PROMPT_LENGTH,
        init: str = "vocab",
        position: str | int | Position = "first",
        vectors: torch.Tensor | None = None,
    ) -> None:
        super().__init__(PromptConfig(n=n, init=init, position=Position.parse(position).value))  # type: ignore[arg-type]
        self._vectors = vectors

    @property
    def n(self) -> int:
        """Number of vectors."""
        return self.config.n

    @property
    def init(self) -> str:
        """Initialisation."""
        return self.config.init

    def build(self, base, generator: torch.Generator) -> None:
        """Create ``prompt`` [n, d] (float32)."""
        d = self.hidden_size
        if self._vectors is not None:
            vec = self._vectors.detach().float().clone()
            if tuple(vec.shape) != (self.n, d):
                raise UsageError(f"soft prompt vectors are {tuple(vec.shape)}, the base needs ({self.n}, {d})")
            self._vectors = None
        elif self.init == "vocab":
            weight = base.adapter.embeddings(base.model).weight.detach()
            ids = torch.randint(0, weight.shape[0], (self.n,), generator=generator)
            vec = weight[ids.to(weight.device)].float().cpu().clone()
        else:
            vec = torch.randn(self.n, d, generator=generator) * embedding_std(base)
        self.prompt = nn.Parameter(vec)

    def input_vectors(self, embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The prompt for every example: [B, n, d]."""
        return self.prompt.to(embeds.dtype).unsqueeze(0).expand(embeds.shape[0], -1, -1)
