"""The guidance protocol: a small module that inserts positions into a frozen base.

Three levels:

- ``input``: vectors spliced into the input embeddings once and kept through the model
  (soft prompt, instance token);
- ``layer``: vectors spliced into the sequence entering a block and removed after it, at every
  layer of each of its stacks (deep prompt, capsule);
- ``prefix``: key/value pairs prepended to the keys of every self-attention layer; key-only
  positions, not queries (PEFT prefix tuning).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.positions import Position
from anchorlens.roles.kinds import Role


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x [B, T, d] over positions where mask [B, T] is True -> [B, d] (0 for empty rows)."""
    w = mask.to(x.dtype).unsqueeze(-1)
    total = (x * w).sum(1)
    return total / w.sum(1).clamp_min(1.0)


@dataclass(frozen=True)
class LayerPositions:
    """Bool masks [B, T+N] over the sequence inside one block (T kept positions, N inserted at this layer).

    valid: every valid position present (kept and inserted); inserted: the N per-layer positions of
    all layer-level guidances; tokens: the input's own tokens (no guidance position, kept or
    inserted); own: the calling guidance's positions.
    """

    valid: torch.Tensor
    inserted: torch.Tensor
    tokens: torch.Tensor
    own: torch.Tensor


class Guidance(nn.Module):
    """Base class of guidance methods; subclasses set ``kind``, ``role``, ``level``; ``config`` describes the instance."""

    kind: ClassVar[str] = ""
    spec_name: ClassVar[str] = ""  # the name in spec strings (``prompt``, ``deep-prompt``)
    role: ClassVar[Role] = Role.SOFT_PROMPT
    level: ClassVar[str] = "input"
    config_class: ClassVar[type]  # set by ``register_method``

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self._position = Position.parse(getattr(config, "position", "start"))
        self.bound = False
        self.stacks: tuple[str, ...] = ()
        self.layers: dict[str, int] = {}
        self.hidden_size = 0

    @property
    def position(self) -> Position:
        """Where this guidance's positions go."""
        return self._position

    @position.setter
    def position(self, value: str | int | Position) -> None:
        """Move the guidance (position sweeps); the config follows, so names and checkpoints stay true."""
        parsed = Position.parse(value)
        if not any(f.name == "position" for f in dataclasses.fields(self.config)):
            raise UsageError(f"{self.config.name} has no position to move")
        self.config = dataclasses.replace(self.config, position=parsed.value)
        self._position = parsed

    # ------------------------------------------------------------------ binding
    def bind(self, base, generator: torch.Generator) -> None:
        """Create the parameters for ``base`` (width, layers, stacks); UsageError if unsupported or too large."""
        adapter = base.adapter
        if not adapter.supports_guidance:
            why = adapter.guidance_refusal or f"{adapter.family} supports capture only"
            raise UsageError(f"{self.kind} needs a base that accepts inserted positions: {why}")
        self.config.check_fits(base)  # before allocating anything
        self.hidden_size = base.hidden_size
        self.stacks = self.choose_stacks(adapter)
        self.layers = {s: adapter.num_layers(base.model, s) for s in self.stacks}
        self.build(base, generator)
        self.bound = True

    def choose_stacks(self, adapter) -> tuple[str, ...]:
        """Stacks this guidance inserts into (input-level: the first stack)."""
        return (adapter.stacks()[0],)

    def build(self, base, generator: torch.Generator) -> None:
        """Create parameters (override); called once by ``bind``."""

    # ------------------------------------------------------------------ facts
    def count(self) -> int:
        """Positions inserted per example (per layer for layer-level guidance)."""
        return self.config.count()

    def options(self) -> dict[str, Any]:
        """JSON-able options (the config's fields) for ``anchorlens.json``."""
        return self.config.to_options()

    def num_trainable(self) -> int:
        """Trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def describe(self) -> str:
        """The spec text of this guidance (``capsule:fusion=prepend,pos=last``; defaults omitted)."""
        return self.config.to_spec()

    # ------------------------------------------------------------------ runtime hooks
    def begin(self) -> None:
        """Reset per-forward state before a forward pass."""

    def input_vectors(self, embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Input-level: embeds [B, T, d] of the input tokens, valid [B, T] -> vectors [B, n, d]."""
        raise NotImplementedError

    def layer_vectors(
        self, stack: str, layer: int, hidden: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """Layer-level: hidden [B, T, d] entering the block, valid [B, T], tokens [B, T] (input tokens only) -> [B, n, d]."""
        raise NotImplementedError

    def after_layer(self, stack: str, layer: int, output: torch.Tensor, positions: LayerPositions) -> None:
        """Layer-level: the block's output [B, T+N, d] and which of its positions are what."""

    def prefix_kv(self, layer: int, batch_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix-level: (keys, values) [B, kv_heads, n, head_dim] for ``layer``."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        """Shown by ``print(module)``."""
        return self.describe()
