"""``value_mass``: norm-based (value-aware) attention mass, Kobayashi et al. 2020 ("Attention is not only a weight").

Key j's contribution to query i's output in head h is A_h(i, j) · v_j W_O^h; its norm is A_h(i, j) · n_j^h with
n_j^h = ||v_j W_O^h|| (the capture's :attr:`~anchorlens.capture.event.AttentionEvent.value_norms`). A weight on a
key whose value is near zero changes nothing, and sinks are known to have small values (Gu et al. 2024): the
norm-based mass says how much each key part *writes*, next to how much it is *weighted*.

Per valid query i and key part P (a key role, the example's first valid key ``first_token``, or its ``sink``, the
first valid input key as in the decomposition):

    norm_mass(i, P) = sum_{j in P} A_h(i, j) n_j^h,  norm_total(i) = sum_{j valid} A_h(i, j) n_j^h,
    norm_share(i, P) = norm_mass(i, P) / norm_total(i)   (0 when the total is 0)

averaged over the valid queries of each role (and ``all``). The weight-based counterparts are ``role_flow``
(the same key roles) and ``first_token_mass`` (the first valid key): same queries, same averaging.

Frame rows: ``norm_mass`` and ``norm_share`` (key_role: each role, ``first_token``, ``sink``), ``norm_total``
(key_role ``""``); ``count`` is the number of queries averaged. Models whose attention output cannot be decomposed
per head are refused at the first attention call (one line).
"""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_of, with_all
from anchorlens.analyses.frames import NO_ROLE
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import (
    FIRST_KEY,
    SINK_KEY,
    VALID_KEY,
    key_columns,
    layout_key_columns,
    role_columns,
)
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent
from anchorlens.engine.quantities import VALUE_NORMS, VALUE_SUMS, VISIBLE
from anchorlens.errors import UsageError

NORM_MASS = "norm_mass"
NORM_SHARE = "norm_share"
NORM_TOTAL = "norm_total"
FIRST_LABEL = "first_token"
SINK_LABEL = "sink"


@register_reducer("value_mass")
class ValueMassReducer(SiteReducer):
    """Norm-based mass and share per query role and key part (module docstring).

    State per example and head: ``sum`` [R, 2, P + 1] (norm mass, then norm share, of each part P: the roles, the
    first key, the sink; then the norm total) summed over the valid queries of each role, ``count`` [R].
    """

    name = "value_mass"
    # the key columns weighted by the value norms: the kernel plan sums them without the probabilities
    reads = frozenset({VALUE_SUMS, VALUE_NORMS, VISIBLE})

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """sum: [R, 2, P + 1] with P = R + 2; count: [R]."""
        return {"sum": (self.num_roles, 2, self.num_roles + 3), "count": (self.num_roles,)}

    @property
    def key_labels(self) -> tuple[str, ...]:
        """The key parts: every role, the first valid key, the sink."""
        return self.roles.names + (FIRST_LABEL, SINK_LABEL)

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, 2 (P + 1)]: each query's norm mass on every part and its total, then the shares."""
        if event.value_norms is None:
            raise UsageError(
                "value_mass needs the capture's value norms: run it through a capture (stream_statistics), "
                "which computes them when a reducer asks"
            )
        roles = role_columns(self.num_roles)  # the role one-hots (not the field groups after them)
        parts = [*range(roles.start, roles.stop), FIRST_KEY, SINK_KEY, VALID_KEY]
        summed = event.value_sums_over(layout_key_columns(event))  # [B, H, q, C]: the kernel plan's
        if summed is not None:
            mass = summed[..., parts]
        else:
            probs = event.probabilities(self.name)
            columns = key_columns(event)  # [B, K', C]
            k = probs.shape[-1]
            weighted = event.value_norms[..., :k, None].to(probs.dtype) * columns[:, None, :, parts]  # [B, H, K', P+1]
            mass = torch.matmul(probs, weighted)  # [B, H, q, P + 1]: one pass over the probabilities
        total = mass[..., -1:]
        share = torch.where(total > 0, mass / total.clamp_min(torch.finfo(mass.dtype).tiny), 0.0)
        return (torch.cat([mass, share], -1),)

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """sum [L, B, H, R, 2, P + 1], count [1, B, H|1, R] (float64; queries that see a key)."""
        sums = stage.role_sums(stage.stacked(0))  # [L, B, H, R, 2 (P + 1)]
        return {"sum": sums.unflatten(-1, (2, -1)), "count": stage.live_counts()}

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, R+1, P] = sum / count per metric, the ``all`` query role appended."""
        total, count = with_all(arrays["sum"], arrays["count"])  # [N, H, R+1, 2, P+1], [N, H, R+1]
        value = mean_of(total, count).numpy()
        n = count.numpy()
        labels = self.query_labels
        return Rows.concat(
            [
                long_rows(stack, layer, examples, heads, NORM_MASS, value[..., 0, :-1], n, labels, self.key_labels),
                long_rows(stack, layer, examples, heads, NORM_SHARE, value[..., 1, :-1], n, labels, self.key_labels),
                long_rows(stack, layer, examples, heads, NORM_TOTAL, value[..., 0, -1:], n, labels, (NO_ROLE,)),
            ]
        )
