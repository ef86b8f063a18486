"""``first_token``: attention mass on the first valid key of each example (the classic sink)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from anchorlens.analyses.base import QUERY_LABELS, SiteReducer, mean_of, with_all
from anchorlens.analyses.frames import NO_ROLE, long_frame
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.shared import (
    FIRST_KEY,
    anchor_key_index,
    column_mass_by_query_role,
    query_counts,
    query_role_sums,
)
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.roles.kinds import NUM_ROLES


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
        self._same_layout = IdentityCache()

    def state_options(self) -> dict:
        """``{"anchor_position": ...}``: which valid key is the anchor."""
        return {"anchor_position": self.anchor_position}

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """sum: [R]; count: [R]."""
        return {"sum": (NUM_ROLES,), "count": (NUM_ROLES,)}

    def _reduce(self, event: AttentionEvent) -> dict[str, torch.Tensor]:
        """probs [B, H, Q, K] -> sum [B, H, R], count [B, H, R] (float64).

        The first valid key is a column of the shared key-column sums; another anchor is gathered.
        """
        probs = event.probs
        b, h, q, _ = probs.shape
        dev = probs.device
        if not self.anchor_position:
            total = column_mass_by_query_role(event)[..., FIRST_KEY]  # zero where no key was found
            valid, counts = event.layout.k.valid, query_counts(event)
            count = self._same_layout.get(
                (valid, counts), lambda: counts * valid.to(dev).bool().any(1).view(b, 1, 1).to(counts.dtype)
            )
            return {"sum": total, "count": count}
        k_index, found = anchor_key_index(event.layout.k.valid.to(dev), self.anchor_position)
        covered = found & (k_index < event.key_count)  # an anchor after the covered keys is hidden: mass 0
        index = torch.where(covered, k_index, 0).view(b, 1, 1, 1).expand(b, h, q, 1)
        mass = probs.gather(-1, index).squeeze(-1)  # [B, H, q]
        total = query_role_sums(event, mass * covered.view(b, 1, 1).to(mass.dtype))
        return {"sum": total, "count": query_counts(event) * found.view(b, 1, 1)}

    def _site_frame(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> pd.DataFrame:
        """value [N, H, R+1, 1] = sum / count with the ``all`` query role appended."""
        total, count = with_all(arrays["sum"], arrays["count"])
        value = mean_of(total, count).unsqueeze(-1)
        return long_frame(
            stack, layer, examples, heads, "first_token_mass", value.numpy(), count.numpy(), QUERY_LABELS, (NO_ROLE,)
        )
