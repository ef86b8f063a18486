"""Training-free instance-aware token(s): the mean of the input's token embeddings (role INSTANCE)."""
from __future__ import annotations

from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance, masked_mean
from anchorlens.methods.positions import Position
from anchorlens.roles.kinds import Role

INSTANCE_MODES = ("copies", "chunks")


class InstanceToken(Guidance):
    """``k`` tokens from the input's own embeddings (padding excluded), kept through the model.

    ``copies``: k copies of the mean; ``chunks``: the means of k contiguous chunks of the valid
    tokens (an example with fewer than k valid tokens is a UsageError). No parameters.
    """

    kind = "instance"
    spec_name = "instance"
    role = Role.INSTANCE
    level = "input"

    def __init__(self, k: int = 1, mode: str = "copies", position: str | int | Position = "first") -> None:
        super().__init__(position)
        if int(k) < 1:
            raise UsageError(f"an instance token needs k >= 1; got k={k}")
        if mode not in INSTANCE_MODES:
            raise UsageError(f"unknown instance mode {mode!r}; choose one of: {', '.join(INSTANCE_MODES)}")
        self.k, self.mode = int(k), mode

    def count(self) -> int:
        """k."""
        return self.k

    def options(self) -> dict[str, Any]:
        """k, mode, pos."""
        return {"k": self.k, "mode": self.mode, "position": self.position.value}

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
