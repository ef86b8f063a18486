"""``role_flow``: how much attention queries of each role put on keys of each role."""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_or_empty, with_all
from anchorlens.analyses.frames import ALL
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import ROLE_START, column_mass
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent
from anchorlens.engine.quantities import KEY_SUMS, VISIBLE


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

    Field groups: when the table names template fields, their groups ``content:<field>`` (the content tokens filled
    from each field) follow the roles on both axes (s and r run over R roles, then F groups): the same sums over
    the queries and keys of each group. They are a finer partition of ``content``, reported besides it: a query's
    masses on the field groups sum to its mass on ``content`` (less content tokens of no listed field), and the
    ``all`` query role sums the roles only.
    """

    name = "role_flow"
    reads = frozenset({KEY_SUMS, VISIBLE})

    @property
    def groups(self) -> tuple[str, ...]:
        """Labels of the R roles, then the F field groups: the query and key groups of the state's axes."""
        return self.roles.names + self.roles.group_names

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """mass: [G, G]; count: [G] (queries that see a key); queries: [G] (valid queries); G = R roles + F groups."""
        g = len(self.groups)
        return {"mass": (g, g), "count": (g,), "queries": (g,)}

    def _options(self) -> dict:
        """The field groups change the state's axes (none: the options of a run without fields, as before)."""
        return {"fields": list(self.roles.fields)} if self.roles.fields else {}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, C]: the shared key-column sums, whose role columns are the mass on each key role."""
        return (column_mass(event),)

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """mass [L, B, H, G, G] (query group x key group), count [1, B, H|1, G], queries [1, B, 1, G] (float64)."""
        mass = stage.role_sums_of()[..., ROLE_START:]  # [L, B, H, R, R+F]: role and field-group key columns
        if not self.roles.fields:
            return {"mass": mass, "count": stage.live_counts(), "queries": stage.query_counts()}
        fields = stage.field_sums(stage.stacked(0))[..., ROLE_START:]  # [L, B, H, F, R+F]
        return {
            "mass": torch.cat([mass, fields], 3),
            "count": torch.cat([stage.live_counts(), stage.field_live_counts()], -1),
            "queries": torch.cat([stage.query_counts(), stage.field_query_counts()], -1),
        }

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, G+1, G] = mass / count with the ``all`` query role (the roles' sum) appended (NaN for empty
        groups)."""
        r = self.num_roles
        mass, count = with_all(arrays["mass"], arrays["count"], r)
        queries = with_all(arrays["queries"], arrays["queries"], r)[1]
        value, keep = mean_or_empty(mass, count, queries)
        return long_rows(
            stack,
            layer,
            examples,
            heads,
            "role_flow",
            value.numpy(),
            count.numpy(),
            self.groups + (ALL,),
            self.groups,
            keep.numpy(),
        )
