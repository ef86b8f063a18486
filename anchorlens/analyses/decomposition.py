"""``decomposition``: where input queries' attention goes, with the attention sink split off.

Per example, site and head, the attention of each valid query is split over disjoint key parts
that cover every valid key, so the parts sum to 1 per query:

    sink                the example's first valid INPUT key (special/structural/content): position 0,
                        BOS or the natural first token; guidance keys are never the sink
    special, structural, content
                        keys of that role, the sink excluded
    soft_prompt, instance, capsule
                        guidance keys of that role (``guidance`` in frames = their sum)

State (float64 sums over queries, so query chunks and examples add up): ``mass[g, p]`` over the
valid queries of query group g (0: input = special+structural+content, 1: guidance) and
``count[g]``. A second, head-independent table keeps what the mask lets each query see:
``pairs[s, r]`` = number of (valid query of role s, visible valid key of role r) pairs (r = the
six roles plus the sink as a seventh column) and ``queries[s]``. From it :mod:`analyses.metrics`
detects metrics fixed by the mask and measures guidance absorption.

Frame rows: metric ``decomposition`` (query_role ``input`` or ``guidance``, key_role one of
:data:`PARTS` or ``guidance``; value = mean mass per query, count = queries) and, with head <NA>
(visibility does not depend on the head), metric ``visible_share`` (value = share of the
visible key positions of the query group that have key_role; key labels: the roles, ``sink``,
``input``, ``guidance``) and ``visible_keys`` (key_role ``""``: mean number of visible keys per
query) for each query role present and the pooled ``input`` and ``guidance`` groups.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from anchorlens.analyses.base import SiteReducer, mean_of
from anchorlens.analyses.frames import GUIDANCE, INPUT, NO_ROLE, concat_frames, empty_frame, long_frame
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.shared import SINK_KEY, column_mass, key_columns, layout_key_columns, query_roles
from anchorlens.analyses.stage import QueryStage
from anchorlens.analyses.table import SiteSums, SiteTable
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.roles.kinds import GUIDANCE_ROLES, INPUT_ROLES, NUM_ROLES, ROLE_NAMES

SINK = "sink"
PARTS: tuple[str, ...] = (SINK,) + ROLE_NAMES  # mass columns: sink, then each role without the sink
QUERY_GROUPS: tuple[str, ...] = (INPUT, GUIDANCE)
_GUIDANCE_IDX = [int(r) for r in GUIDANCE_ROLES]
_INPUT_IDX = [int(r) for r in INPUT_ROLES]
_VIS_KEYS: tuple[str, ...] = ROLE_NAMES + (SINK,)  # pairs columns
_VIS_COLUMNS = [*range(NUM_ROLES), SINK_KEY]  # key columns of the pairs table
_ALL_HEADS = torch.tensor([-1])  # the visibility table's one column (visibility does not depend on the head)
_GROUP_OF_ROLE = torch.zeros(len(QUERY_GROUPS), NUM_ROLES, dtype=torch.float64)  # [2, R]: query group of each role
_GROUP_OF_ROLE[0, _INPUT_IDX] = 1.0
_GROUP_OF_ROLE[1, _GUIDANCE_IDX] = 1.0


@register_reducer("decomposition")
class DecompositionReducer(SiteReducer):
    """Sink-aware split of each query's attention over key parts (module docstring)."""

    name = "decomposition"
    reads_column_mass = True

    def __init__(self) -> None:
        super().__init__()
        self._vis = SiteSums(self._vis_shapes())
        self._same_mask = IdentityCache()
        self._same_keys = IdentityCache()

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """mass: [2, P] (query group x part); count: [2]."""
        return {"mass": (len(QUERY_GROUPS), len(PARTS)), "count": (len(QUERY_GROUPS),)}

    @staticmethod
    def _vis_shapes() -> dict[str, tuple[int, ...]]:
        """pairs: [R, R + 1] (query role x key role, then the sink); queries: [R]."""
        return {"pairs": (NUM_ROLES, NUM_ROLES + 1), "queries": (NUM_ROLES,)}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, C]: the shared key-column sums, of which the mass on each key role and on the sink are read."""
        return (column_mass(event),)

    def _stage_constants(self, event: AttentionEvent) -> dict:
        """parts: [B, 1, R + 2, P] the map from key columns to parts; visibility: pairs [1, B, 1, R, R+1] and
        queries [1, B, 1, R] (what the mask lets the stage's queries see)."""
        return {"parts": self._parts_of_columns(event), "visibility": self._visibility(event)}

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """mass [L, B, H, 2, P], count [1, B, 1, 2] (float64): no pass over [Q, K] of its own.

        The per-role masses of each query role, summed into the two query groups and mapped onto the parts
        by :meth:`_parts_of_columns` (the sink's mass moved out of its role).
        """
        sums = stage.role_sums_of()[..., : SINK_KEY + 1]  # [L, B, H, R, R + 2]: roles, first key, sink
        groups = _GROUP_OF_ROLE.to(sums.device)
        mass = torch.matmul(torch.matmul(groups, sums), stage.constants["parts"])  # [L, B, H, 2, P]
        return {"mass": mass, "count": torch.matmul(stage.query_counts(), groups.T)}

    def _parts_of_columns(self, event: AttentionEvent) -> torch.Tensor:
        """[B, 1, R + 2, P] float64: key-column sums (roles, first key, sink) -> parts (the sink, then each role
        without the sink), per example; shared by the layers of a forward."""
        k, dev = event.layout.k, event.probs.device

        def compute() -> torch.Tensor:
            columns = layout_key_columns(event).double()  # [B, K, C]
            # the sink's role: its row of the role columns (zero where an example has no sink)
            sink_role = torch.bmm(columns[..., SINK_KEY].unsqueeze(1), columns[..., :NUM_ROLES]).squeeze(1)  # [B, R]
            w = torch.zeros(columns.shape[0], SINK_KEY + 1, len(PARTS), dtype=torch.float64, device=dev)
            w[:, SINK_KEY, 0] = 1.0
            w[:, range(NUM_ROLES), range(1, NUM_ROLES + 1)] = 1.0
            w[:, SINK_KEY, 1:] -= sink_role  # the sink's mass leaves the part of its own role
            return w[:, None]

        return self._same_keys.get((k.roles, k.valid, dev), compute)

    def _visibility(self, event: AttentionEvent) -> dict[str, torch.Tensor]:
        """pairs [1, B, 1, R, R+1] and queries [1, B, 1, R]: what the mask lets valid queries see.

        The layers of one forward share their mask and roles, so the counts are computed once for them.
        """
        return self._same_mask.get(
            (event.visible, event.layout.q.roles, event.layout.q.valid, event.layout.k.roles, event.layout.k.valid),
            lambda: self._count_visible(event),
        )

    @staticmethod
    def _count_visible(event: AttentionEvent) -> dict[str, torch.Tensor]:
        """The uncached :meth:`_visibility`: the shared key columns (roles, sink) of the covered keys."""
        keys = key_columns(event)[..., _VIS_COLUMNS].double()  # [B, K', R+1], zero rows for padding keys
        seen = event.visible.to(keys.device)[:, 0].double().expand(keys.shape[0], -1, -1)  # [B, Q, K']
        q_hot = query_roles(event)  # [B, Q, R]
        pairs = torch.einsum("bqs,bqk,bkr->bsr", q_hot, seen, keys)
        return {"pairs": pairs[None, :, None], "queries": q_hot.sum(1)[None, :, None]}

    # -- the second (head-independent) table travels with the first --------------------------
    def _add_stage(self, stage: QueryStage) -> None:
        """Add a stage's mass sums and its visibility counts (the same for every slot) to the state."""
        super()._add_stage(stage)
        self._vis.add(stage.sites, stage.example_ids, _ALL_HEADS, stage.constants["visibility"])

    def flush(self) -> None:
        """Reduce every stage and move pending mass sums and visibility counts into their tables."""
        super().flush()
        self._vis.flush()

    def merge(self, other: SiteReducer) -> None:
        """Add another decomposition reducer's sums and visibility counts."""
        super().merge(other)  # flushes both
        assert isinstance(other, DecompositionReducer)
        self._vis.merge(other._vis)

    def state_dict(self) -> dict:
        """Base state plus ``"visibility": [{"stack", "layer", "examples", "heads", "arrays"}]``."""
        state = super().state_dict()
        state["visibility"] = [{"stack": s, "layer": layer, **t.state()} for (s, layer), t in self._vis.items()]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Replace the state with ``state_dict()`` output."""
        super().load_state_dict(state)  # drops the stages
        self._vis.replace(
            {
                (str(v["stack"]), int(v["layer"])): SiteTable.from_state(self._vis_shapes(), v)
                for v in state.get("visibility", [])
            }
        )

    def frame(self) -> pd.DataFrame:
        """``decomposition`` rows per head plus ``visible_share``/``visible_keys`` rows (head <NA>: over all heads)."""
        parts = [super().frame()]
        for (stack, layer), table in self._vis.items():
            examples = table.examples
            if examples.numel() == 0:
                continue
            order = torch.argsort(examples)
            arrays = {k: v[order][:, :1] for k, v in table.trimmed().items()}
            parts.append(_visibility_frame(stack, layer, examples[order].numpy(), arrays))
        return concat_frames(parts)

    def _site_frame(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> pd.DataFrame:
        """value [N, H, 2, P + 1] = mass / count (parts, then the guidance total)."""
        mass = arrays["mass"]
        mass = torch.cat([mass, mass[..., [1 + i for i in _GUIDANCE_IDX]].sum(-1, keepdim=True)], -1)
        value = mean_of(mass, arrays["count"])
        return long_frame(
            stack,
            layer,
            examples,
            heads,
            "decomposition",
            value.numpy(),
            arrays["count"].numpy(),
            QUERY_GROUPS,
            PARTS + (GUIDANCE,),
        )


def _visibility_frame(stack: str, layer: int, examples: np.ndarray, arrays: dict[str, torch.Tensor]) -> pd.DataFrame:
    """visible_share / visible_keys rows (head <NA>: over all heads) from pairs [N, 1, R, R+1] and queries [N, 1, R]."""
    pairs, queries = arrays["pairs"], arrays["queries"]
    pooled = lambda idx: (pairs[:, :, idx].sum(2, keepdim=True), queries[:, :, idx].sum(2, keepdim=True))  # noqa: E731
    (pi, qi), (pg, qg) = pooled(_INPUT_IDX), pooled(_GUIDANCE_IDX)
    pairs, queries = torch.cat([pairs, pi, pg], 2), torch.cat([queries, qi, qg], 2)  # [N, 1, R+2, ...]
    total = pairs[..., :NUM_ROLES].sum(-1, keepdim=True)  # [N, 1, S, 1]: visible keys of the group
    keys = torch.cat(
        [pairs, pairs[..., _INPUT_IDX].sum(-1, keepdim=True), pairs[..., _GUIDANCE_IDX].sum(-1, keepdim=True)], -1
    )  # [N, 1, S, R+3]
    share = mean_of(keys, total.squeeze(-1))
    labels = ROLE_NAMES + QUERY_GROUPS
    heads = None  # one column of rows over all heads (head <NA>)
    if examples.size == 0:
        return empty_frame()
    return concat_frames(
        [
            long_frame(
                stack,
                layer,
                examples,
                heads,
                "visible_share",
                share.numpy(),
                queries.numpy(),
                labels,
                _VIS_KEYS + QUERY_GROUPS,
            ),
            long_frame(
                stack,
                layer,
                examples,
                heads,
                "visible_keys",
                mean_of(total, queries).numpy(),
                queries.numpy(),
                labels,
                (NO_ROLE,),
            ),
        ]
    )
