"""Which role every query and key position has at one attention site."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from anchorlens.roles.table import BUILTIN_ROLES, RoleTable


@dataclass(frozen=True)
class SequenceRoles:
    """Roles of one batch of sequences.

    roles: [B, T] long (ids of ``table``); valid: [B, T] bool (False for padding); table: the run's roles.
    fields: [B, T] long or None: the field group of each position (index into ``table.fields``; -1 for every
    position that is not a content token filled from one of them); None when the sequence has no field groups.
    """

    roles: torch.Tensor
    valid: torch.Tensor
    table: RoleTable = BUILTIN_ROLES
    fields: torch.Tensor | None = None

    def insert(self, index: torch.Tensor, role: int, count: int) -> SequenceRoles:
        """Insert ``count`` valid positions of ``role`` before per-example ``index`` ([B] long)."""
        b, t = self.roles.shape
        device = self.roles.device
        new_t = t + count
        pos = torch.arange(new_t, device=device).expand(b, new_t)
        start = index.to(device).view(b, 1)
        inserted = (pos >= start) & (pos < start + count)
        src = torch.where(pos < start, pos, pos - count).clamp(0, t - 1)
        roles = torch.where(inserted, torch.full_like(pos, int(role)), self.roles.gather(1, src))
        valid = torch.where(inserted, torch.ones_like(inserted), self.valid.gather(1, src))
        fields = None
        if self.fields is not None:
            fields = torch.where(inserted, torch.full_like(pos, -1), self.fields.to(device).gather(1, src))
        return SequenceRoles(roles, valid, self.table, fields)

    def slice(self, start: int, stop: int) -> SequenceRoles:
        """Positions ``start:stop`` of every example (roles, validity and field groups alike)."""
        fields = None if self.fields is None else self.fields[:, start:stop]
        return SequenceRoles(self.roles[:, start:stop], self.valid[:, start:stop], self.table, fields)

    def spliced(
        self, apply: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], role: int, count: int
    ) -> SequenceRoles:
        """The sequence after ``apply(tensor, inserted)`` puts ``count`` new valid positions of ``role`` into every
        [B, T] tensor (``inserted``: [B, count], the new positions' values; their field group is -1)."""
        b, dev = self.roles.shape[0], self.roles.device
        roles = torch.full((b, count), int(role), dtype=self.roles.dtype, device=dev)
        ones = torch.ones((b, count), dtype=torch.bool, device=dev)
        fields = None
        if self.fields is not None:
            fields = apply(self.fields, torch.full((b, count), -1, dtype=self.fields.dtype, device=self.fields.device))
        return SequenceRoles(apply(self.roles, roles), apply(self.valid.bool(), ones), self.table, fields)

    def prepend(self, role: int, count: int) -> SequenceRoles:
        """Insert ``count`` valid positions of ``role`` at index 0 of every example."""
        zero = torch.zeros(self.roles.shape[0], dtype=torch.long, device=self.roles.device)
        return self.insert(zero, role, count)


@dataclass(frozen=True)
class Layout:
    """Roles of the queries and keys seen by one attention call.

    q: roles of the Q query positions ([B, Q]); k: roles of the K key positions ([B, K]).
    For self-attention q and k are usually the same sequence; key-only positions (prefix
    tuning) make K > Q.
    """

    q: SequenceRoles
    k: SequenceRoles

    @property
    def table(self) -> RoleTable:
        """The roles of the layout's ids (queries and keys share one table)."""
        return self.k.table

    @classmethod
    def self_attention(cls, seq: SequenceRoles) -> Layout:
        """Layout where queries and keys are the same positions."""
        return cls(seq, seq)


class LayoutProvider(Protocol):
    """Anything that can say which roles the positions have at a (stack, layer) site."""

    def layout(self, stack: str, layer: int) -> Layout:
        """Return the layout for the attention call at ``stack``/``layer``."""
        ...


@dataclass
class StaticLayout:
    """Layout provider for a model whose positions do not change between layers.

    sequences: named sequences (``"input"``, ``"target"``); stack_sequences maps each stack to
    its (query sequence, key sequence) names, as given by the architecture adapter.
    """

    sequences: dict[str, SequenceRoles]
    stack_sequences: dict[str, tuple[str, str]]

    def layout(self, stack: str, layer: int) -> Layout:
        """Return the same layout for every layer of a stack."""
        q_name, k_name = self.stack_sequences[stack]
        return Layout(self.sequences[q_name], self.sequences[k_name])
