"""Training-free instance-aware token(s): the mean of the input's token embeddings (role INSTANCE)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance, masked_mean
from anchorlens.methods.config import MethodConfig
from anchorlens.methods.positions import Position
from anchorlens.roles.kinds import Role

INSTANCE_MODES = ("copies", "chunks")


@dataclass(frozen=True)
class InstanceConfig(MethodConfig):
    """Spec ``instance``: k training-free tokens from the input's own embeddings (no parameters)."""

    name = "instance"
    kind = "instance"
    context_bounded = ("k",)

    k: int = field(default=1, metadata={"doc": "tokens inserted"})
    mode: Literal["copies", "chunks"] = field(
        default="copies", metadata={"doc": "k copies of the mean, or the means of k contiguous chunks"}
    )
    position: str | int = field(
        default="first", metadata={"doc": "where the tokens go (first, middle, last, an index...)"}
    )

    def count(self) -> int:
        """k."""
        return self.k


class InstanceToken(Guidance):
    """``k`` tokens from the input's own embeddings (padding excluded), kept through the model.

    ``copies``: k copies of the mean; ``chunks``: the means of k contiguous chunks of the valid
    tokens (an example with fewer than k valid tokens is a UsageError). No parameters.
    """

    kind = "instance"
    spec_name = "instance"
    role = Role.INSTANCE
    level = "input"
    config: InstanceConfig

    def __init__(self, k: int = 1, mode: str = "copies", position: str | int | Position = "first") -> None:
        super().__init__(InstanceConfig(k=k, mode=mode, position=Position.parse(position).value))  # type: ignore[arg-type]

    @property
    def k(self) -> int:
        """Tokens inserted."""
        return self.config.k

    @property
    def mode(self) -> str:
        """copies or chunks."""
        return self.config.mode

    def input_vectors(self, embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """embeds [B, T, d], valid [B, T] -> [B, k, d]."""
        if self.mode == "copies":
            return masked_mean(embeds, valid).unsqueeze(1).expand(-1, self.k, -1)
        out = []
        for row in range(embeds.shape[0]):
            idx = valid[row].nonzero().view(-1)
            if idx.numel() < self.k:
                raise UsageError(
                    f"instance chunks: example {row} has {idx.numel()} valid tokens, fewer than k={self.k}; lower k"
                )
            out.append(torch.stack([embeds[row, part].mean(0) for part in torch.tensor_split(idx, self.k)]))
        return torch.stack(out)
