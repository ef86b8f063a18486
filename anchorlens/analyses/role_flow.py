"""``role_flow``: how much attention queries of each role put on keys of each role."""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_or_empty, with_all
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import ROLE_COLUMNS, column_mass
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent


@register_reducer("role_flow")
class RoleFlowReducer(SiteReducer):
    """Per example, site and head: ``mass[s, r]``, ``count[s]`` and ``queries[s]`` over valid queries.

    mass[s, r] = sum over valid queries q of role s of sum over valid keys k of role r of p[q, k];
    count[s] = number of valid queries of role s that see at least one valid key after every edit (an empty row,
    whose keys a knockout all removed, is all zeros and is not averaged in); queries[s] = valid queries of role s.
    Padding keys (``layout.k.valid`` False) are not counted; visibility is taken from ``probs`` (0 on keys a query
    may not see, per the event contract). Frame rows: metric ``role_flow``, value = mass[s, r] / count[s] (mean mass
    per query, in [0, 1]; a row sums to 1 over key roles, less a learned sink's or a ``zero`` knockout's mass),
    count = count[s]; query_role is each role with queries plus ``"all"`` (every valid query), key_role each role
    label of the run's table. A role whose queries are all empty gives rows with value NaN and count 0 (flagged
    ``empty`` by :func:`~anchorlens.analyses.derived.with_fixed`).
    """

    name = "role_flow"
    reads_column_mass = True

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """mass: [R, R]; count: [R] (queries that see a key); queries: [R] (valid queries)."""
        r = self.num_roles
        return {"mass": (r, r), "count": (r,), "queries": (r,)}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, C]: the shared key-column sums, whose role columns are the mass on each key role."""
        return (column_mass(event),)

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """mass [L, B, H, R, R] (query role x key role), count [1, B, H|1, R], queries [1, B, 1, R] (float64)."""
        return {
            "mass": stage.role_sums_of()[..., ROLE_COLUMNS],
            "count": stage.live_counts(),
            "queries": stage.query_counts(),
        }

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, R+1, R] = mass / count with the ``all`` query role appended (NaN for empty roles)."""
        mass, count = with_all(arrays["mass"], arrays["count"])
        queries = with_all(arrays["queries"], arrays["queries"])[1]
        value, keep = mean_or_empty(mass, count, queries)
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
            keep.numpy(),
        )
