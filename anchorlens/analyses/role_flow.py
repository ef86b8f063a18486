"""``role_flow``: how much attention queries of each role put on keys of each role."""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_of, with_all
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import ROLE_COLUMNS, column_mass
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent


@register_reducer("role_flow")
class RoleFlowReducer(SiteReducer):
    """Per example, site and head: ``mass[s, r]`` and ``count[s]`` over valid queries.

    mass[s, r] = sum over valid queries q of role s of sum over valid keys k of role r of p[q, k];
    count[s] = number of valid queries of role s. Padding keys (``layout.k.valid`` False) are not
    counted; visibility is taken from ``probs`` (0 on keys a query may not see, per the event
    contract). Frame rows: metric ``role_flow``, value = mass[s, r] / count[s] (mean mass per
    query, in [0, 1]), count = count[s]; query_role is each role with count > 0 plus ``"all"``
    (every valid query), key_role each role label of the run's table.
    """

    name = "role_flow"
    reads_column_mass = True

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """mass: [R, R]; count: [R]."""
        r = self.num_roles
        return {"mass": (r, r), "count": (r,)}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, C]: the shared key-column sums, whose role columns are the mass on each key role."""
        return (column_mass(event),)

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """mass [L, B, H, R, R] (query role x key role), count [1, B, 1, R] (float64)."""
        return {"mass": stage.role_sums_of()[..., ROLE_COLUMNS], "count": stage.query_counts()}

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, R+1, R] = mass / count with the ``all`` query role appended."""
        mass, count = with_all(arrays["mass"], arrays["count"])
        value = mean_of(mass, count)
        return long_rows(
            stack,
            layer,
            examples,
            heads,
            "role_flow",
            value.numpy(),
            count.numpy(),
            self.query_labels,
            self.roles.names,
        )
