"""``first_token``: attention mass on the first valid key of each example (the classic sink)."""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_of, with_all
from anchorlens.analyses.frames import NO_ROLE
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import FIRST_KEY, anchor_key_index, column_mass
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent
from anchorlens.engine.quantities import KEY_SUMS, PROBS, VISIBLE
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable


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

    def __init__(self, anchor_position: int | None = None, roles: RoleTable = BUILTIN_ROLES) -> None:
        super().__init__(roles)
        self.anchor_position = None if anchor_position is None else int(anchor_position)
        # another anchor is gathered from the probabilities, the first key read from the key columns
        self.reads = frozenset({PROBS if self.anchor_position else KEY_SUMS, VISIBLE})

    def _options(self) -> dict:
        """``{"anchor_position": ...}``: which valid key is the anchor."""
        return {"anchor_position": self.anchor_position}

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """sum: [R]; count: [R]."""
        return {"sum": (self.num_roles,), "count": (self.num_roles,)}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, F]: each query's mass on the anchor key.

        The first valid key is a column of the shared key-column sums (all of them are staged: the same tensor
        as the other reducers'); another anchor is gathered, [B, H, q, 1] (0 where an example has too few
        valid keys, or the anchor comes after the keys the event covers: hidden, mass 0).
        """
        if not self.anchor_position:
            return (column_mass(event),)
        probs = event.probabilities(self.name)
        b, h, q, _ = probs.shape
        k_index, found = anchor_key_index(event.layout.k.valid.to(probs.device), self.anchor_position)
        covered = found & (k_index < event.key_count)
        index = torch.where(covered, k_index, 0).view(b, 1, 1, 1).expand(b, h, q, 1)
        return (probs.gather(-1, index) * covered.view(b, 1, 1, 1).to(probs.dtype),)

    def _stage_constants(self, event: AttentionEvent) -> dict:
        """found: [1, B, 1, 1] float64, whether the example has the anchor key (else it counts no query)."""
        valid = event.layout.k.valid.to(event.device).bool()
        if not self.anchor_position:
            found = valid.any(1)
        else:
            found = anchor_key_index(valid, self.anchor_position)[1]
        return {"found": found.view(1, -1, 1, 1).to(torch.float64)}

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """sum [L, B, H, R], count [1, B, H|1, R] (float64; queries that see a key)."""
        sums = stage.role_sums_of()
        return {
            "sum": sums[..., FIRST_KEY] if not self.anchor_position else sums[..., 0],
            "count": stage.live_counts() * stage.constants["found"],
        }

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, R+1, 1] = sum / count with the ``all`` query role appended."""
        total, count = with_all(arrays["sum"], arrays["count"])
        value = mean_of(total, count).unsqueeze(-1)
        return long_rows(
            stack,
            layer,
            examples,
            heads,
            "first_token_mass",
            value.numpy(),
            count.numpy(),
            self.query_labels,
            (NO_ROLE,),
        )
