"""Prefix tuning (PEFT PREFIX_TUNING / P-tuning v2): key-only positions at every self-attention layer.

The n prefix positions are keys and values, never queries: the captured attention at a layer is
[Q, n+Q] and the prefix keys carry role SOFT_PROMPT. They are not rotary-rotated, and the real
tokens start at position n, exactly as PEFT's prefilled cache does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.config import MethodConfig
from anchorlens.roles.kinds import Role


@dataclass(frozen=True)
class PrefixConfig(MethodConfig):
    """Spec ``prefix``: PEFT prefix tuning, n key-only positions at every self-attention layer."""

    name = "prefix"
    kind = "prefix"
    context_bounded = ("n",)

    n: int = field(default=20, metadata={"doc": "key/value positions per layer"})

    def count(self) -> int:
        """n key-only positions per layer."""
        return self.n

    def parameter_count(self, base) -> int:
        """n * layers * 2 * kv_heads * head_dim (0 where prefixes are unsupported: ``build`` refuses)."""
        if not base.adapter.supports_prefix:
            return 0
        layers, kv_heads, head_dim = base.adapter.kv_geometry(base.model)
        return self.n * layers * 2 * kv_heads * head_dim


class Prefix(Guidance):
    """``kv`` [n, layers*2*token_dim] in PEFT's layout: layer l's keys are columns [2l*td, (2l+1)*td), values the next td.

    token_dim = kv_heads * head_dim (grouped-query models have fewer kv heads than query heads).
    ``kv=None`` starts from N(0, 0.02).
    """

    kind = "prefix"
    spec_name = "prefix"
    role = Role.SOFT_PROMPT
    level = "prefix"
    config: PrefixConfig

    def __init__(self, n: int = 20, kv: torch.Tensor | None = None) -> None:
        super().__init__(PrefixConfig(n=n))
        self._kv = kv
        self.kv_heads = 0
        self.head_dim = 0

    def build(self, base, generator: torch.Generator) -> None:
        """Create ``kv`` [n, layers*2*kv_heads*head_dim]; UsageError on bases without prefix support."""
        adapter = base.adapter
        if not adapter.supports_prefix:
            why = adapter.prefix_refusal or f"{adapter.family} takes no key-only prefix"
            raise UsageError(f"prefix tuning needs a decoder-only base whose layers all hold keys: {why}")
        layers, self.kv_heads, self.head_dim = adapter.kv_geometry(base.model)
        self.layers = {self.stacks[0]: layers}
        width = layers * 2 * self.kv_heads * self.head_dim
        if self._kv is not None:
            kv = self._kv.detach().float().clone()
            if tuple(kv.shape) != (self.n, width):
                raise UsageError(
                    f"prefix tensor is {tuple(kv.shape)} but this base needs ({self.n}, {width}) = "
                    f"(n, {layers} layers x 2 x {self.kv_heads} kv heads x {self.head_dim} head dim)"
                )
            self._kv = None
        else:
            kv = torch.randn(self.n, width, generator=generator) * 0.02
        self.kv = nn.Parameter(kv)

    @property
    def n(self) -> int:
        """Key/value positions per layer."""
        return self.config.n

    def prefix_kv(self, layer: int, batch_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) [B, kv_heads, n, head_dim] of ``layer``."""
        td = self.kv_heads * self.head_dim
        k = self.kv[:, 2 * layer * td : (2 * layer + 1) * td]
        v = self.kv[:, (2 * layer + 1) * td : (2 * layer + 2) * td]
        shape = (self.n, self.kv_heads, self.head_dim)
        k = k.reshape(shape).permute(1, 0, 2).unsqueeze(0).expand(batch_size, -1, -1, -1).to(dtype)
        v = v.reshape(shape).permute(1, 0, 2).unsqueeze(0).expand(batch_size, -1, -1, -1).to(dtype)
        return k, v
