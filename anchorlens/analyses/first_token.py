"""``first_token``: attention mass on the first valid key of each example (the classic sink)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from anchorlens.analyses.base import QUERY_LABELS, SiteReducer, mean_of, per_role, query_roles, with_all
from anchorlens.analyses.frames import NO_ROLE, long_frame
from anchorlens.analyses.registry import register_reducer
from anchorlens.capture.event import AttentionEvent
from anchorlens.roles.kinds import NUM_ROLES


def anchor_key_index(key_valid: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of each example's ``position``-th valid key (negative counts from the last).

    key_valid: [B, K] bool. Returns (index [B] long, found [B] bool); ``found`` is False where the
    example has too few valid keys.
    """
    valid = key_valid.bool()
    rank = valid.long().cumsum(1)  # [B, K]: 1-based rank of each valid key
    n_valid = rank[:, -1] if rank.shape[1] else torch.zeros(valid.shape[0], dtype=torch.long, device=valid.device)
    wanted = n_valid + position if position < 0 else torch.full_like(n_valid, position)
    hit = valid & (rank == (wanted + 1).unsqueeze(1))
    return hit.long().argmax(1), hit.any(1)


@register_reducer("first_token")
class FirstTokenReducer(SiteReducer):
    """Mean attention mass each valid query puts on one anchor key of its example.

    The anchor key is the example's first valid key (``anchor_position=None``) or its
    ``anchor_position``-th valid key (0-based; negative counts from the end), found per example so
    left padding is handled. Examples with too few valid keys give no rows. State per example/
    head: sum[s] of that mass over valid queries of role s, count[s]. Frame: metric
    ``first_token_mass``, value = sum / count, key_role ``""``, query roles plus ``"all"``.
    """

    name = "first_token"

    def __init__(self, anchor_position: int | None = None) -> None:
        super().__init__()
        self.anchor_position = None if anchor_position is None else int(anchor_position)

    def state_options(self) -> dict:
        """``{"anchor_position": ...}``: which valid key is the anchor."""
        return {"anchor_position": self.anchor_position}

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """sum: [R]; count: [R]."""
        return {"sum": (NUM_ROLES,), "count": (NUM_ROLES,)}

    def _reduce(self, event: AttentionEvent) -> dict[str, torch.Tensor]:
        """probs [B, H, Q, K] -> sum [B, H, R], count [B, H, R] (float64)."""
        probs = event.probs
        b, h, q, _ = probs.shape
        dev = probs.device
        k_index, found = anchor_key_index(event.layout.k.valid.to(dev), self.anchor_position or 0)
        q_valid = event.layout.q.valid.to(dev).bool() & found[:, None]  # [B, q]
        mass = probs.gather(-1, k_index.view(b, 1, 1, 1).expand(b, h, q, 1)).squeeze(-1)  # [B, H, q]
        mass = torch.where(q_valid[:, None, :], mass, torch.zeros_like(mass))
        q_hot = query_roles(event) * found[:, None, None]  # [B, q, R]
        count = q_hot.sum(1)[:, None, :].expand(b, h, NUM_ROLES)
        return {"sum": per_role(q_hot, mass), "count": count}

    def _site_frame(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> pd.DataFrame:
        """value [N, H, R+1, 1] = sum / count with the ``all`` query role appended."""
        total, count = with_all(arrays["sum"], arrays["count"])
        value = mean_of(total, count).unsqueeze(-1)
        return long_frame(
            stack, layer, examples, heads, "first_token_mass", value.numpy(), count.numpy(), QUERY_LABELS, (NO_ROLE,)
        )
