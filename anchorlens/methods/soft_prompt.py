"""Prompt tuning: n learned vectors spliced into the input embeddings and kept (role SOFT_PROMPT)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.positions import Position
from anchorlens.roles.kinds import Role

SOFT_PROMPT_INITS = ("vocab", "random")


def embedding_std(base) -> float:
    """Standard deviation of the base's input embedding matrix (scale for random inits)."""
    return float(base.adapter.embeddings(base.model).weight.detach().float().std())


class SoftPrompt(Guidance):
    """``n`` learned input vectors (Lester et al.); ``init``: copies of random vocabulary rows or N(0, std(E)).

    Parameters: ``prompt`` [n, d]. ``vectors`` ([n, d]) sets them directly (PEFT import).
    """

    kind = "soft_prompt"
    spec_name = "prompt"
    role = Role.SOFT_PROMPT
    level = "input"

    def __init__(
        self, n: int = 20, init: str = "vocab", position: str | int | Position = "first", vectors: torch.Tensor | None = None
    ) -> None:
        super().__init__(position)
        if int(n) < 1:
            raise UsageError(f"a soft prompt needs n >= 1 vectors; got n={n}")
        if init not in SOFT_PROMPT_INITS:
            raise UsageError(f"unknown soft prompt init {init!r}; choose one of: {', '.join(SOFT_PROMPT_INITS)}")
        self.n, self.init = int(n), init
        self._vectors = vectors

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

    def count(self) -> int:
        """n."""
        return self.n

    def options(self) -> dict[str, Any]:
        """n, init, pos."""
        return {"n": self.n, "init": self.init, "position": self.position.value}

    def input_vectors(self, embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The prompt for every example: [B, n, d]."""
        return self.prompt.to(embeds.dtype).unsqueeze(0).expand(embeds.shape[0], -1, -1)
