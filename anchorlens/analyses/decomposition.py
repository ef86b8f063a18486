"""``decomposition``: where input queries' attention goes, with the attention sink split off.

Per example, site and head, the attention of each valid query is split over disjoint key parts
that cover every valid key, so the parts sum to 1 per query:

    sink                the example's first valid INPUT key (any role but guidance): position 0,
                        BOS or the natural first token; guidance keys are never the sink
    special, structural, content and every role the run's task adds (scaffold, demo...)
                        keys of that role, the sink excluded
    soft_prompt, instance, capsule
                        guidance keys of that role (``guidance`` in frames = their sum)

State (float64 sums over queries, so query chunks and examples add up): ``mass[g, p]`` over the
valid queries of query group g (0: input = every role but guidance, 1: guidance) and
``count[g]``. A second, head-independent table keeps what the mask lets each query see:
``pairs[s, r]`` = number of (valid query of role s, visible valid key of role r) pairs (r = the
R roles of the run's table, the sink, then the F field groups ``content:<field>`` of its template fields;
s = the roles, then the field groups) and ``queries[s]``. From it :mod:`analyses.metrics`
detects metrics fixed by the mask and measures guidance absorption.

Frame rows: metric ``decomposition`` (query_role ``input`` or ``guidance``, key_role one of
:func:`parts_of` or ``guidance``; value = mean mass per query, count = queries) and, with head <NA>
(visibility does not depend on the head), metric ``visible_share`` (value = share of the
visible key positions of the query group that have key_role; key labels: the roles, ``sink``,
``input``, ``guidance``) and ``visible_keys`` (key_role ``""``: mean number of visible keys per
query) for each query role present and the pooled ``input`` and ``guidance`` groups.
"""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_of
from anchorlens.analyses.frames import GUIDANCE, INPUT, NO_ROLE
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import (
    ROLE_START,
    SINK_KEY,
    column_mass,
    group_columns,
    key_columns,
    layout_key_columns,
    query_fields_transposed,
    query_roles,
    role_columns,
)
from anchorlens.analyses.stage import QueryStage
from anchorlens.analyses.table import SiteSums, SiteTable
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.engine.quantities import KEY_SUMS, VISIBLE
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable

SINK = "sink"
QUERY_GROUPS: tuple[str, ...] = (INPUT, GUIDANCE)
_ALL_HEADS = torch.tensor([-1])  # the visibility table's one column (visibility does not depend on the head)


def parts_of(roles: RoleTable) -> tuple[str, ...]:
    """The mass columns of a run: the sink, then each role without the sink."""
    return (SINK,) + roles.names


def _group_of_role(roles: RoleTable) -> torch.Tensor:
    """[2, R] float64: the query group (input, guidance) of each role."""
    groups = torch.zeros(len(QUERY_GROUPS), roles.size, dtype=torch.float64)
    groups[0, list(roles.input_ids)] = 1.0
    groups[1, list(roles.guidance_ids)] = 1.0
    return groups


@register_reducer("decomposition")
class DecompositionReducer(SiteReducer):
    """Sink-aware split of each query's attention over key parts (module docstring)."""

    name = "decomposition"
    reads = frozenset({KEY_SUMS, VISIBLE})

    def __init__(self, roles: RoleTable = BUILTIN_ROLES) -> None:
        super().__init__(roles)
        self.parts = parts_of(roles)
        self._groups = _group_of_role(roles)
        self._vis = SiteSums(self._vis_shapes())
        self._same_mask = IdentityCache()
        self._same_keys = IdentityCache()

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """mass: [2, P] (query group x part); count: [2]."""
        return {"mass": (len(QUERY_GROUPS), self.num_roles + 1), "count": (len(QUERY_GROUPS),)}

    def _vis_shapes(self) -> dict[str, tuple[int, ...]]:
        """pairs: [R + F, R + 1 + F] (query role, then field group x key role, the sink, then field group); queries:
        [R + F] (F = 0 without template fields)."""
        r, f = self.num_roles, len(self.roles.fields)
        return {"pairs": (r + f, r + 1 + f), "queries": (r + f,)}

    def _options(self) -> dict:
        """The field groups change the visibility table's axes (none: the options of a run without fields)."""
        return {"fields": list(self.roles.fields)} if self.roles.fields else {}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, C]: the shared key-column sums, of which the mass on each key role and on the sink are read."""
        return (column_mass(event),)

    def _stage_constants(self, event: AttentionEvent) -> dict:
        """parts: [B, 1, C, P] the map from key columns to parts; visibility: pairs [1, B, 1, R, R+1] and
        queries [1, B, 1, R] (what the mask lets the stage's queries see)."""
        return {"parts": self._parts_of_columns(event), "visibility": self._visibility(event)}

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """mass [L, B, H, 2, P], count [1, B, H|1, 2] (float64; queries that see a key): no pass over [Q, K] of its own.

        The per-role masses of each query role, summed into the two query groups and mapped onto the parts
        by :meth:`_parts_of_columns` (the sink's mass moved out of its role).
        """
        sums = stage.role_sums_of()  # [L, B, H, R, C]: first key, sink, valid, content, roles
        groups = self._groups.to(sums.device)
        mass = torch.matmul(torch.matmul(groups, sums), stage.constants["parts"])  # [L, B, H, 2, P]
        return {"mass": mass, "count": torch.matmul(stage.live_counts(), groups.T)}

    def _parts_of_columns(self, event: AttentionEvent) -> torch.Tensor:
        """[B, 1, C, P] float64: key-column sums (first key, sink, valid, content, roles) -> parts (the sink, then
        each role without the sink), per example; shared by the layers of a forward."""
        k, dev = event.layout.k, event.device
        r = self.num_roles

        def compute() -> torch.Tensor:
            columns = layout_key_columns(event).double()  # [B, K, C]
            # the sink's role: its row of the role columns (zero where an example has no sink)
            sink_role = torch.bmm(columns[..., SINK_KEY].unsqueeze(1), columns[..., role_columns(r)]).squeeze(
                1
            )  # [B, R]
            w = torch.zeros(columns.shape[0], columns.shape[-1], r + 1, dtype=torch.float64, device=dev)
            w[:, SINK_KEY, 0] = 1.0
            w[:, range(ROLE_START, ROLE_START + r), range(1, r + 1)] = 1.0
            w[:, SINK_KEY, 1:] -= sink_role  # the sink's mass leaves the part of its own role
            return w[:, None]

        return self._same_keys.get((k.roles, k.valid, dev), compute)

    def _visibility(self, event: AttentionEvent) -> dict[str, torch.Tensor]:
        """pairs [1, B, 1, R, R+1] and queries [1, B, 1, R]: what the mask lets valid queries see.

        The layers of one forward share their mask and roles, so the counts are computed once for them.
        """
        return self._same_mask.get(
            (
                event.visibility_key,
                event.layout.q.roles,
                event.layout.q.valid,
                event.layout.k.roles,
                event.layout.k.valid,
            ),
            lambda: self._count_visible(event),
        )

    @staticmethod
    def _count_visible(event: AttentionEvent) -> dict[str, torch.Tensor]:
        """The uncached :meth:`_visibility`: the shared key columns (roles, sink) of the covered keys."""
        columns = key_columns(event)
        r = event.layout.k.table.size
        roles, fields = role_columns(r), group_columns(r)
        keys = torch.cat([columns[..., roles], columns[..., SINK_KEY : SINK_KEY + 1], columns[..., fields]], -1)
        # keys: [B, K', R+1+F] (the roles, the sink, then the field groups), zero rows for padding keys
        # how many keys of each column a query can attend to after every edit; a knockout of chosen heads: the mean
        # over the heads
        seen = event.visible_counts(keys).mean(1)  # [B, Q, R+1+F]
        q_hot = torch.cat([query_roles(event), query_fields_transposed(event).transpose(1, 2)], -1)  # [B, Q, R+F]
        pairs = torch.einsum("bqs,bqr->bsr", q_hot, seen)
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

    def rows(self) -> Rows:
        """``decomposition`` rows per head plus ``visible_share``/``visible_keys`` rows (head <NA>: over all heads)."""
        parts = [super().rows()]
        for (stack, layer), table in self._vis.items():
            examples = table.examples
            if examples.numel() == 0:
                continue
            order = torch.argsort(examples)
            arrays = {k: v[order][:, :1] for k, v in table.trimmed().items()}
            parts.append(_visibility_rows(stack, layer, examples[order].numpy(), arrays, self.roles))
        return Rows.concat(parts)

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """value [N, H, 2, P + 1] = mass / count (parts, then the guidance total)."""
        mass = arrays["mass"]
        mass = torch.cat([mass, mass[..., [1 + i for i in self.roles.guidance_ids]].sum(-1, keepdim=True)], -1)
        value = mean_of(mass, arrays["count"])
        return long_rows(
            stack,
            layer,
            examples,
            heads,
            "decomposition",
            value.numpy(),
            arrays["count"].numpy(),
            QUERY_GROUPS,
            self.parts + (GUIDANCE,),
        )


def _visibility_rows(
    stack: str, layer: int, examples: np.ndarray, arrays: dict[str, torch.Tensor], roles: RoleTable
) -> Rows:
    """visible_share / visible_keys rows (head <NA>: over all heads) from pairs [N, 1, R+F, R+1+F] and queries
    [N, 1, R+F] (the F field groups after the roles: their shares are of every visible key, as the roles')."""
    pairs, queries = arrays["pairs"], arrays["queries"]
    inputs, guidance = list(roles.input_ids), list(roles.guidance_ids)
    pooled = lambda idx: (pairs[:, :, idx].sum(2, keepdim=True), queries[:, :, idx].sum(2, keepdim=True))  # noqa: E731
    (pi, qi), (pg, qg) = pooled(inputs), pooled(guidance)
    pairs, queries = torch.cat([pairs, pi, pg], 2), torch.cat([queries, qi, qg], 2)  # [N, 1, R+2, ...]
    total = pairs[..., : roles.size].sum(-1, keepdim=True)  # [N, 1, S, 1]: visible keys of the group
    keys = torch.cat(
        [pairs, pairs[..., inputs].sum(-1, keepdim=True), pairs[..., guidance].sum(-1, keepdim=True)], -1
    )  # [N, 1, S, R+3]
    share = mean_of(keys, total.squeeze(-1))
    labels = roles.names + roles.group_names + QUERY_GROUPS
    heads = None  # one column of rows over all heads (head <NA>)
    if examples.size == 0:
        return Rows.empty()
    return Rows.concat(
        [
            long_rows(
                stack,
                layer,
                examples,
                heads,
                "visible_share",
                share.numpy(),
                queries.numpy(),
                labels,
                roles.names + (SINK,) + roles.group_names + QUERY_GROUPS,
            ),
            long_rows(
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
