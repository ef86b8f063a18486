"""CaPT capsule: n learned vectors per layer (default one) fused with a mean of the sequence (role CAPSULE).

Layer 1: S_1 = p_1 + Mean(E), E the sequence entering layer 1 (padding excluded; kept soft
prompt or instance positions included, except with ``mean=input``). Layer i > 1:

    S_i = p_i + Mean(S_{i-1} ⊕ H_{i-1})

the mean of layer i-1's output over the positions that ``mean`` selects:

- ``capsule+input`` (default, the paper's reading): the capsule's own positions S_{i-1} and the
  kept sequence H_{i-1} (input tokens plus kept soft prompt / instance positions); other
  guidances' per-layer positions (deep prompts, other capsules) excluded;
- ``input``: the input's own tokens only (no capsule, no guidance position of any kind);
- ``all``: every valid position of layer i-1, other guidances' per-layer positions included.

S_i is spliced into the sequence entering layer i and removed after it, so the capsule is
re-derived from the sequence and re-inserted at every layer. With p = 0 (the default init) an
untrained capsule is therefore a per-layer running mean; it is not the paper's training-free
instance token (that is ``instance``: the mean input embedding, inserted once and kept).

Fusions: ``add`` (above); ``prepend``: two positions [p_i, Mean]; ``project``:
S_i = p_i + B(A(Mean)) with A [d, r], B [r, d] shared by the layers of a stack (B starts at 0).

Count ablation (``capsule:n=2``, ``capsule:n=4``): n vectors p_i^1..p_i^n per layer, all fused
with the same Mean: ``add`` inserts the n positions S_i^j = p_i^j + Mean, ``project`` the n
positions p_i^j + B(A(Mean)), ``prepend`` the n + 1 positions [p_i^1..p_i^n, Mean]; all of them
are the capsule's own positions S_{i-1} in the next layer's mean. The paper ("All You Need is
One") finds a single capsule per layer enough (its preliminary study even sees accuracy drop as
instance-aware tokens are added), hence the default n = 1; ``n`` is there to rerun that ablation.

Parameters: ``p[stack]`` [layers, d] for n = 1 (the layout of checkpoints saved before ``n``
existed), [layers, n, d] for n > 1; ``down[stack]`` A [d, r] and ``up[stack]`` B [r, d] for
``project``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance, LayerPositions, masked_mean
from anchorlens.methods.config import MethodConfig
from anchorlens.methods.positions import Position
from anchorlens.methods.stacks import choose_layer_stacks, layers_of
from anchorlens.roles.kinds import Role

CAPSULE_FUSIONS = ("add", "prepend", "project")
CAPSULE_INITS = ("zeros", "random")
CAPSULE_MEANS = ("capsule+input", "input", "all")


@dataclass(frozen=True)
class CapsuleConfig(MethodConfig):
    """Spec ``capsule``: CaPT's per-layer capsule (see the module docstring for the equations)."""

    name = "capsule"
    kind = "capsule"
    context_bounded = ("n",)

    fusion: Literal["add", "prepend", "project"] = field(
        default="add", metadata={"doc": "p + Mean, [p, Mean] as n + 1 positions, or p + B(A(Mean))"}
    )
    rank: int = field(default=8, metadata={"doc": "rank r of the project fusion (<= hidden size)"})
    position: str | int = field(default="first", metadata={"doc": "where the capsule goes in each layer's sequence"})
    init: Literal["zeros", "random"] = field(default="zeros", metadata={"doc": "every p_i^j starts at 0 or N(0, 0.02)"})
    stacks: tuple[str, ...] | None = field(
        default=None, metadata={"doc": "stacks to insert into (encoder/decoder); default all the base supports"}
    )
    mean: Literal["capsule+input", "input", "all"] = field(
        default="capsule+input", metadata={"doc": "positions entering Mean(S_{i-1} ⊕ H_{i-1})"}
    )
    n: int = field(default=1, metadata={"doc": "capsule vectors per layer (the paper's count ablation)"})

    def count(self) -> int:
        """n per layer (n + 1 for ``prepend``)."""
        return self.n + 1 if self.fusion == "prepend" else self.n

    def parameter_count(self, base) -> int:
        """layers * n * d, plus 2 * d * rank per stack for ``project``."""
        layers = layers_of(base, self.stacks, self.kind)
        d = base.hidden_size
        projection = 2 * d * self.rank * len(layers) if self.fusion == "project" else 0
        return sum(layers.values()) * self.n * d + projection

    def check_fits(self, base) -> None:
        """Also: rank <= hidden size."""
        if self.fusion == "project" and self.rank > base.hidden_size:
            raise UsageError(
                f"{self.to_spec()}: rank={self.rank} exceeds the hidden size {base.hidden_size} of {base.spec}; "
                f"use rank <= {base.hidden_size}"
            )
        super().check_fits(base)


class Capsule(Guidance):
    """n vectors per layer (``p[stack]`` [layers, d] for n = 1, [layers, n, d] otherwise); see the module docstring."""

    kind = "capsule"
    spec_name = "capsule"
    role = Role.CAPSULE
    level = "layer"
    config: CapsuleConfig

    def __init__(
        self,
        fusion: str = "add",
        rank: int = 8,
        position: str | int | Position = "first",
        init: str = "zeros",
        stacks: tuple[str, ...] | str | None = None,
        mean: str = "capsule+input",
        n: int = 1,
    ) -> None:
        super().__init__(
            CapsuleConfig.from_json(
                {
                    "fusion": fusion,
                    "rank": rank,
                    "position": Position.parse(position).value,
                    "init": init,
                    "stacks": [stacks] if isinstance(stacks, str) else (list(stacks) if stacks else None),
                    "mean": mean,
                    "n": n,
                },
                "Capsule(...)",
            )
        )
        self.p = nn.ParameterDict()
        self.down = nn.ParameterDict()
        self.up = nn.ParameterDict()
        self._pooled: dict[str, torch.Tensor] = {}

    @property
    def n(self) -> int:
        """Capsule vectors per layer."""
        return self.config.n

    @property
    def fusion(self) -> str:
        """add, prepend or project."""
        return self.config.fusion

    @property
    def rank(self) -> int:
        """Rank of the project fusion."""
        return self.config.rank

    @property
    def init(self) -> str:
        """zeros or random."""
        return self.config.init

    @property
    def mean(self) -> str:
        """Which positions enter the mean."""
        return self.config.mean

    @property
    def requested_stacks(self) -> tuple[str, ...] | None:
        """Stacks asked for (None: all)."""
        return self.config.stacks

    def choose_stacks(self, adapter) -> tuple[str, ...]:
        """The requested stacks, or every stack the adapter can insert into."""
        return choose_layer_stacks(adapter, self.requested_stacks, self.kind)

    def build(self, base, generator: torch.Generator) -> None:
        """Create p[stack] [layers, d] or [layers, n, d] (zeros or N(0, 0.02)) and, for ``project``, A/B per stack."""
        d = self.hidden_size
        for stack in self.stacks:
            shape = (self.layers[stack], d) if self.n == 1 else (self.layers[stack], self.n, d)
            p = torch.zeros(shape) if self.init == "zeros" else torch.randn(shape, generator=generator) * 0.02
            self.p[stack] = nn.Parameter(p)
            if self.fusion == "project":
                self.down[stack] = nn.Parameter(torch.randn(d, self.rank, generator=generator) / d**0.5)
                self.up[stack] = nn.Parameter(torch.zeros(self.rank, d))

    def begin(self) -> None:
        """Forget the previous forward's pooled states."""
        self._pooled = {}

    def layer_vectors(
        self, stack: str, layer: int, hidden: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """S_i^1..S_i^n for every example: [B, n, d] (``prepend``: [B, n + 1, d])."""
        pooled = self._pooled.get(stack)
        if pooled is None:  # layer 1: Mean(E)
            pooled = masked_mean(hidden, tokens if self.mean == "input" else valid)  # [B, d]
        p = self.p[stack][layer].to(hidden.dtype).reshape(1, self.n, -1)  # [1, n, d]
        if self.fusion == "add":
            return p + pooled.unsqueeze(1)
        if self.fusion == "prepend":
            return torch.cat([p.expand(pooled.shape[0], -1, -1), pooled.unsqueeze(1)], dim=1)
        a, b = self.down[stack].to(hidden.dtype), self.up[stack].to(hidden.dtype)
        return p + ((pooled @ a) @ b).unsqueeze(1)

    def after_layer(self, stack: str, layer: int, output: torch.Tensor, positions: LayerPositions) -> None:
        """Remember Mean(S_i ⊕ H_i) over the positions ``mean`` selects ([B, T+N] masks) for the next layer."""
        if self.mean == "input":
            pool = positions.tokens
        elif self.mean == "all":
            pool = positions.valid
        else:
            pool = (positions.valid & ~positions.inserted) | positions.own
        self._pooled[stack] = masked_mean(output, pool)
