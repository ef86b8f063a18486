"""Full attention maps of one example, for notebooks and paper-style figures."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anchorlens.errors import UnknownNameError
from anchorlens.roles.kinds import ROLE_NAMES, Role

LEARNED_SINK_TOKEN = "<learned_sink>"  # the label of the learned-sink pseudo-key column (not a token role)


@dataclass
class StackMaps:
    """Maps of one attention stack of one example.

    probs: [L, H, Q, K] float32 for the captured ``layers`` and ``heads`` (model indices), padding
    removed. q_roles/k_roles: [Q]/[K] long role ids; role_names: the run's role names by id (the built-in
    ``Role`` values first, then those the task added). q_tokens/k_tokens: token texts, with inserted guidance
    positions named ``<capsule>``, ``<instance>``, ``<soft_prompt>``.
    learned_sink: [L, H, Q] float32, the mass each query gives a learned sink logit (gpt-oss), or None when the
    model has none; real keys plus the sink sum to 1 (:meth:`with_learned_sink` appends it as a key column).
    """

    probs: torch.Tensor
    layers: list[int]
    heads: list[int]
    q_roles: torch.Tensor
    k_roles: torch.Tensor
    q_tokens: list[str]
    k_tokens: list[str]
    role_names: tuple[str, ...] = ROLE_NAMES
    learned_sink: torch.Tensor | None = None

    def with_learned_sink(self) -> tuple[torch.Tensor, list[str]]:
        """([L, H, Q, K+1] probabilities with the learned sink as the last key column, key labels ending in
        ``LEARNED_SINK_TOKEN``); without a learned sink, the maps and key labels unchanged."""
        if self.learned_sink is None:
            return self.probs, list(self.k_tokens)
        return torch.cat([self.probs, self.learned_sink.unsqueeze(-1)], dim=-1), [*self.k_tokens, LEARNED_SINK_TOKEN]

    def role_name(self, role_id: int) -> str:
        """Name of a role id of this map."""
        return self.role_names[int(role_id)]

    def layer(self, layer: int) -> torch.Tensor:
        """[H, Q, K] map of one model layer."""
        return self.probs[self.layers.index(layer)]

    def positions_of(self, role: str | Role | int, side: str = "k") -> list[int]:
        """Indices of the query (``side='q'``) or key (``'k'``) positions having ``role`` (a name or an id)."""
        wanted = self.role_names.index(role) if isinstance(role, str) else int(role)
        roles = self.q_roles if side == "q" else self.k_roles
        return [i for i, r in enumerate(roles.tolist()) if r == wanted]


@dataclass
class AttentionMaps:
    """All captured stacks of one example: ``stacks['decoder']`` etc., plus its identity."""

    example_id: int
    stacks: dict[str, StackMaps]

    def __getitem__(self, stack: str) -> StackMaps:
        """The maps of one stack; UnknownNameError (a KeyError) naming the captured stacks for another."""
        if stack not in self.stacks:
            raise UnknownNameError(f"stack {stack!r} was not captured; captured: {', '.join(self.stacks)}")
        return self.stacks[stack]

    @property
    def default_stack(self) -> str:
        """The stack shown first: ``decoder`` for decoder-only, ``encoder`` otherwise."""
        for name in ("decoder", "encoder"):
            if name in self.stacks:
                return name
        return next(iter(self.stacks))
