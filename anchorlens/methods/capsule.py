"""CaPT capsule: one learned vector per layer fused with the mean of the sequence (role CAPSULE).

Layer 1: S_1 = p_1 + Mean(E), E the sequence entering layer 1 (padding excluded; kept soft
prompt or instance positions included). Layer i > 1: S_i = p_i + Mean(S_{i-1} ⊕ H_{i-1}), the
mean of layer i-1's output over the capsule's own positions and the other valid positions
(other guidances' per-layer positions excluded). S_i is spliced into the sequence entering layer
i and removed after it. With p = 0 (the default init) an untrained capsule is the mean token, the
paper's training-free anchor.

Fusions: ``add`` (above); ``prepend``: two positions [p_i, Mean]; ``project``:
S_i = p_i + B(A(Mean)) with A [d, r], B [r, d] shared by the layers of a stack (B starts at 0).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance, masked_mean
from anchorlens.methods.positions import Position
from anchorlens.methods.stacks import choose_layer_stacks
from anchorlens.roles.kinds import Role

CAPSULE_FUSIONS = ("add", "prepend", "project")
CAPSULE_INITS = ("zeros", "random")


class Capsule(Guidance):
    """One vector per layer (``p[stack]`` [layers, d]); see the module docstring for the equations."""

    kind = "capsule"
    spec_name = "capsule"
    role = Role.CAPSULE
    level = "layer"

    def __init__(
        self,
        fusion: str = "add",
        rank: int = 8,
        position: str | int | Position = "first",
        init: str = "zeros",
        stacks: tuple[str, ...] | str | None = None,
    ) -> None:
        super().__init__(position)
        if fusion not in CAPSULE_FUSIONS:
            raise UsageError(f"unknown capsule fusion {fusion!r}; choose one of: {', '.join(CAPSULE_FUSIONS)}")
        if init not in CAPSULE_INITS:
            raise UsageError(f"unknown capsule init {init!r}; choose one of: {', '.join(CAPSULE_INITS)}")
        if int(rank) < 1:
            raise UsageError(f"capsule rank must be >= 1; got {rank}")
        self.fusion, self.rank, self.init = fusion, int(rank), init
        self.requested_stacks = (stacks,) if isinstance(stacks, str) else (tuple(stacks) if stacks else None)
        self.p = nn.ParameterDict()
        self.down = nn.ParameterDict()
        self.up = nn.ParameterDict()
        self._pooled: dict[str, torch.Tensor] = {}

    def choose_stacks(self, adapter) -> tuple[str, ...]:
        """The requested stacks, or every stack the adapter can insert into."""
        return choose_layer_stacks(adapter, self.requested_stacks, self.kind)

    def build(self, base, generator: torch.Generator) -> None:
        """Create p[stack] [layers, d] (zeros or N(0, 0.02)) and, for ``project``, A/B per stack."""
        d = self.hidden_size
        for stack in self.stacks:
            shape = (self.layers[stack], d)
            p = torch.zeros(shape) if self.init == "zeros" else torch.randn(shape, generator=generator) * 0.02
            self.p[stack] = nn.Parameter(p)
            if self.fusion == "project":
                self.down[stack] = nn.Parameter(torch.randn(d, self.rank, generator=generator) / d**0.5)
                self.up[stack] = nn.Parameter(torch.zeros(self.rank, d))

    def count(self) -> int:
        """1 (2 for ``prepend``) per layer."""
        return 2 if self.fusion == "prepend" else 1

    def options(self) -> dict[str, Any]:
        """fusion, rank, pos, init, stacks."""
        return {
            "fusion": self.fusion,
            "rank": self.rank,
            "position": self.position.value,
            "init": self.init,
            "stacks": list(self.requested_stacks) if self.requested_stacks else None,
        }

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "Capsule":
        """Rebuild from ``options()``."""
        opts = dict(options)
        if opts.get("stacks"):
            opts["stacks"] = tuple(opts["stacks"])
        return cls(**opts)

    def begin(self) -> None:
        """Forget the previous forward's pooled states."""
        self._pooled = {}

    def layer_vectors(self, stack: str, layer: int, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """S_i for every example: [B, 1, d] (``prepend``: [B, 2, d])."""
        pooled = self._pooled.get(stack)
        mean = masked_mean(hidden, valid) if pooled is None else pooled  # [B, d]
        p = self.p[stack][layer].to(hidden.dtype).unsqueeze(0)  # [1, d]
        if self.fusion == "add":
            return (p + mean).unsqueeze(1)
        if self.fusion == "prepend":
            return torch.stack([p.expand_as(mean), mean], dim=1)
        a, b = self.down[stack].to(hidden.dtype), self.up[stack].to(hidden.dtype)
        return (p + (mean @ a) @ b).unsqueeze(1)

    def after_layer(self, stack: str, layer: int, output: torch.Tensor, pool: torch.Tensor, own: torch.Tensor) -> None:
        """Remember Mean(S_i ⊕ H_i) over ``pool`` [B, T+N] for the next layer."""
        self._pooled[stack] = masked_mean(output, pool)
