"""Where an inserted guidance position goes, per example (padding and lengths differ)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anchorlens.errors import UsageError
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import SequenceRoles

POSITION_NAMES: tuple[str, ...] = ("first", "after_structural", "middle", "last", "start")
_HELP = "first, after_structural, middle, last, start, or an integer index into the valid tokens"


@dataclass(frozen=True)
class Position:
    """An insertion point.

    ``first``: before the first valid token (after left padding); ``after_structural``: after the
    first contiguous run of structural (template) tokens; ``middle``: before valid token
    ``n_valid // 2``; ``last``: after the last valid token; ``start``: index 0 of the padded
    sequence, before any left padding (PEFT's layout); an int i: before valid token i (negative
    counts from the end; ``n_valid`` means after the last one).
    """

    value: str | int = "first"

    @classmethod
    def parse(cls, value: str | int | Position) -> Position:
        """``"middle"``, ``"3"``, ``-1`` or a Position -> Position; UsageError lists the choices."""
        if isinstance(value, Position):
            return value
        if isinstance(value, bool):
            raise UsageError(f"bad position {value!r}; use {_HELP}")
        if isinstance(value, int):
            return cls(value)
        text = str(value).strip().lower().replace("-", "_")
        if text.lstrip("_").isdigit():
            return cls(int(str(value).strip()))
        if text in POSITION_NAMES:
            return cls(text)
        raise UsageError(f"unknown position {value!r}; use {_HELP}")

    def __str__(self) -> str:
        """The spec form (``middle``, ``3``)."""
        return str(self.value)

    def resolve(self, seq: SequenceRoles) -> torch.Tensor:
        """[B] long insertion indices into the padded sequence (insert before that index)."""
        valid = seq.valid.bool()
        b, t = valid.shape
        count = valid.sum(1)
        if self.value == "start":
            return torch.zeros(b, dtype=torch.long, device=valid.device)
        # positions of the valid tokens in order, then a sentinel "after the last valid token"
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
        idx = torch.arange(t, device=valid.device).expand(b, t)
        last = torch.where(valid, idx, torch.full_like(idx, -1)).max(1).values
        after_last = torch.where(count > 0, last + 1, torch.zeros_like(last))
        if self.value == "after_structural":
            return self._after_structural(seq, valid)
        if self.value == "first":
            k = torch.zeros_like(count)
        elif self.value == "middle":
            k = count // 2
        elif self.value == "last":
            k = count
        else:
            i = int(self.value)
            k = count + i if i < 0 else torch.full_like(count, i)
            bad = (k < 0) | (k > count)
            if bool(bad.any()):
                row = int(bad.nonzero()[0, 0])
                raise UsageError(
                    f"position {i} is beyond example {row} of the batch ({int(count[row])} valid tokens); "
                    f"use an index in [-{int(count[row])}, {int(count[row])}] or first/middle/last"
                )
        kc = k.clamp(0, t - 1).view(b, 1)
        at = order.gather(1, kc).view(b)
        return torch.where(k >= count, after_last, at)

    @staticmethod
    def _after_structural(seq: SequenceRoles, valid: torch.Tensor) -> torch.Tensor:
        """Index right after the first contiguous run of valid structural tokens of each example."""
        b, t = valid.shape
        structural = valid & (seq.roles == int(Role.STRUCTURAL))
        has = structural.any(1)
        if not bool(has.all()):
            row = int((~has).nonzero()[0, 0])
            raise UsageError(
                f"position after_structural: example {row} has no structural (template) token; "
                "use a template with literal text or another position (first, middle, last)"
            )
        idx = torch.arange(t, device=valid.device).expand(b, t)
        start = torch.where(structural, idx, torch.full_like(idx, t)).min(1).values
        # first index >= start that is not structural (or t)
        stop = torch.where((idx >= start[:, None]) & ~structural, idx, torch.full_like(idx, t)).min(1).values
        return stop
