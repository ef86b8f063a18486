"""A tokenized batch that remembers the role and field of every position."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import SequenceRoles
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable


@dataclass
class Encoded:
    """A padded batch of tokenized examples with per-position roles.

    input_ids, attention_mask, roles: [B, T] long; ``roles`` holds ids of ``role_table`` (the run's roles:
    the built-in ``Role`` values and those the task adds; padding is ``Role.SPECIAL`` with attention_mask 0).
    fields: per example, per position, the
    template field a content token came from (``"premise"``), the structural segment's text for
    structural tokens, and ``""`` for specials. tokens: per example, per position, the token's
    text. example_ids: [B] long, the examples' indices in their dataset. target_*: the decoder
    side of encoder-decoder models ([B, S]); None for decoder-only and encoder-only bases.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    roles: torch.Tensor
    fields: list[list[str]]
    tokens: list[list[str]]
    example_ids: torch.Tensor
    padding_side: str = "right"
    target_ids: torch.Tensor | None = None
    target_mask: torch.Tensor | None = None
    target_roles: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)
    role_table: RoleTable = BUILTIN_ROLES

    @property
    def batch_size(self) -> int:
        """Number of examples B."""
        return int(self.input_ids.shape[0])

    def input_sequence(self) -> SequenceRoles:
        """Roles, validity and field groups of the input positions (:meth:`field_ids`)."""
        return SequenceRoles(self.roles, self.attention_mask.bool(), self.role_table, self.field_ids())

    def field_ids(self) -> torch.Tensor | None:
        """[B, T] long: each content token's field among ``role_table.fields`` (-1 for every other position and for
        fields the table does not list); None when the table names no fields."""
        names = self.role_table.fields
        if not names:
            return None
        index = {name: i for i, name in enumerate(names)}
        ids = torch.tensor(
            [[index.get(f, -1) for f in row] for row in self.fields], dtype=torch.long, device=self.roles.device
        ).reshape(self.roles.shape)
        return torch.where(self.roles == int(Role.CONTENT), ids, torch.full_like(ids, -1))

    def target_sequence(self) -> SequenceRoles | None:
        """Roles and validity of the decoder-side positions, when there are any."""
        if self.target_ids is None or self.target_roles is None or self.target_mask is None:
            return None
        return SequenceRoles(self.target_roles, self.target_mask.bool(), self.role_table)

    def sequences(self) -> dict[str, SequenceRoles]:
        """Named sequences (``input`` and, for encoder-decoder, ``target``)."""
        out = {"input": self.input_sequence()}
        tgt = self.target_sequence()
        if tgt is not None:
            out["target"] = tgt
        return out

    def to(self, device: torch.device | str) -> Encoded:
        """Copy of the batch with its tensors on ``device``."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            roles=self.roles.to(device),
            example_ids=self.example_ids.to(device),
            target_ids=move(self.target_ids),
            target_mask=move(self.target_mask),
            target_roles=move(self.target_roles),
        )
