"""``learned_sink``: the mass each query gives a learned sink logit (gpt-oss), reported as its own metric.

A learned sink is a per-head logit in the softmax with no key behind it: the real keys' probabilities sum to
1 - sink. It is not a token and has no role, so it is a separate metric beside the decomposition (whose parts
then sum to 1 - learned_sink), never a key role. Importing this module registers the reducer.
"""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_of, with_all
from anchorlens.analyses.frames import NO_ROLE
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent
from anchorlens.engine.quantities import LEARNED_SINK, VISIBLE

METRIC = "learned_sink"


@register_reducer("learned_sink")
class LearnedSinkReducer(SiteReducer):
    """Mean learned-sink mass of valid queries. State per example/head: sum[s] over queries of role s, count[s].

    Frame: metric ``learned_sink``, value = sum / count, key_role ``""``, query roles plus ``"all"``. Sites whose
    attention has no learned sink give no rows.
    """

    name = "learned_sink"
    reads = frozenset({LEARNED_SINK, VISIBLE})

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """sum: [R]; count: [R]."""
        return {"sum": (self.num_roles,), "count": (self.num_roles,)}

    def update(self, event: AttentionEvent) -> None:
        """Stage the event when its site has a learned sink (others have nothing to report)."""
        if event.learned_sink is not None:
            super().update(event)

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, 1]: each query's learned-sink mass."""
        assert event.learned_sink is not None
        return (event.learned_sink.unsqueeze(-1).clone(),)

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """sum [L, B, H, R], count [1, B, H|1, R] (float64; queries that see a key)."""
        return {"sum": stage.role_sums_of()[..., 0], "count": stage.live_counts()}

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, R+1, 1] = sum / count with the ``all`` query role appended."""
        total, count = with_all(arrays["sum"], arrays["count"])
        value = mean_of(total, count).unsqueeze(-1)
        return long_rows(
            stack, layer, examples, heads, METRIC, value.numpy(), count.numpy(), self.query_labels, (NO_ROLE,)
        )
