"""``entropy``: how spread out each query's attention is, overall and over content keys."""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer, mean_of, mean_or_empty, with_all
from anchorlens.analyses.frames import NO_ROLE
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, long_rows
from anchorlens.analyses.shared import PLOGP_COLUMNS, column_mass, column_plogp, visible_key_counts
from anchorlens.analyses.stage import QueryStage
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.engine.quantities import KEY_SUMS, LSE, SCORE_SUMS, VISIBLE
from anchorlens.roles.kinds import Role
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable


def normalized_entropy(plogp_sum: torch.Tensor, mass: torch.Tensor, n_keys: torch.Tensor) -> torch.Tensor:
    """Entropy of p / mass normalized by log(n_keys), from sums over the keys; all [B, H, Q].

    plogp_sum = sum_k p_k log p_k, mass = sum_k p_k. H(p / mass) = log(mass) - plogp_sum / mass.
    Defined as 0 where n_keys <= 1 (a single visible key: no choice) or mass == 0; clamped to [0, 1].
    """
    n = n_keys.to(mass.dtype)
    return _entropy_from_terms(plogp_sum, mass, torch.where(n >= 2, 1.0 / n.clamp_min(2).log(), 0.0))


def _entropy_from_terms(plogp_sum: torch.Tensor, mass: torch.Tensor, inv_log_keys: torch.Tensor) -> torch.Tensor:
    """:func:`normalized_entropy` given 1 / log(n_keys), 0 where n_keys < 2 (the reducer computes it once per
    forward); shapes broadcast.

    Where mass == 0, plogp_sum is 0 too and log(tiny mass) makes the entropy negative: the clamp gives 0.
    """
    safe_mass = mass.clamp_min(torch.finfo(mass.dtype).tiny)
    ratio = plogp_sum / safe_mass
    h = safe_mass.log_().sub_(ratio).mul_(inv_log_keys)
    return h.nan_to_num_(nan=0.0, posinf=1.0, neginf=0.0).clamp_(0.0, 1.0)


@register_reducer("entropy")
class EntropyReducer(SiteReducer):
    """Normalized attention entropy per valid query, averaged per example/site/head/query role.

    ``entropy``: keys = the valid keys the query can attend to after every edit (the event's ``visible``: causal
    mask, window, padding, and the keys a ``renorm`` or ``zero`` knockout removed); the row is renormalized over
    them and H / log(#keys) is taken (0 when a query sees a single key). A query that sees no key at all (an empty
    row) is not averaged in; a role whose queries are all empty gives a NaN row with count 0. ``anchor_content_entropy``: the same
    restricted to CONTENT keys (renormalized over them), normalized by log(#visible content keys);
    a query that sees no content key or puts zero mass on content is left out of the average
    (count not incremented), one visible content key gives 0. The state keeps the content entropy
    of every query role; ``anchor_role`` only picks which rows ``frame`` emits (``None``: all roles)
    and does not affect merging. Frame rows: ``entropy`` (query roles plus ``"all"``, key_role
    ``""``) and ``anchor_content_entropy`` (query_role = anchor role, key_role ``"content"``).
    """

    name = "entropy"
    reads = frozenset({KEY_SUMS, SCORE_SUMS, LSE, VISIBLE})

    def __init__(self, anchor_role: str | int | Role | None = "capsule", roles: RoleTable = BUILTIN_ROLES) -> None:
        super().__init__(roles)
        self.anchor_role = None if anchor_role is None else roles.id(anchor_role)
        self._same_mask = IdentityCache()

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """sum/count/queries: [R] for ``entropy`` (count: queries that see a key; queries: valid queries);
        content_sum/content_count: [R] for content entropy."""
        r = (self.num_roles,)
        return {"sum": r, "count": r, "queries": r, "content_sum": r, "content_count": r}

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """[B, H, q, 2] mass and [B, H, q, 2] sum of p·log p, over every valid key and over content keys."""
        return column_mass(event)[..., PLOGP_COLUMNS], column_plogp(event)

    def _stage_constants(self, event: AttentionEvent) -> dict:
        """From the keys each query can attend to after every edit (all, content), shaped [B|1, H|1, q, 1, F] like the
        staged values: 1 / log(n), 0 where n < 2, and whether a content key is visible (bool); shared by the layers
        of a forward."""

        def compute() -> dict:
            counts = visible_key_counts(event)  # [B|1, H|1, q, R]
            keys = torch.stack([counts.sum(-1), counts[..., int(Role.CONTENT)]], -1)[:, :, :, None]
            return {
                "inv_log_keys": torch.where(keys >= 2, 1.0 / keys.clamp_min(2).log(), 0.0),
                "sees_content": keys[..., 1:] >= 1,
            }

        layout = event.layout
        return self._same_mask.get(
            (
                event.visibility_key,
                layout.q.roles,
                layout.q.valid,
                layout.k.roles,
                layout.k.valid,
                event.device,
            ),
            compute,
        )

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """Four [L, B, H, R] sums (count: [1, B, H|1, R], queries [1, B, 1, R]), float64, from the staged mass and
        p·log p."""
        mass = stage.stacked(0)  # [B, H, q, L, 2]: over every valid key, over content keys
        # overall and content entropy side by side in the last dim: one pass of the small ops for both
        entropy = _entropy_from_terms(stage.stacked(1), mass, stage.constants["inv_log_keys"])
        # a query that sees no content key or puts no mass on it has no content entropy (not counted);
        # padding queries weigh nothing in the sums over query roles
        c_ok = (mass[..., 1:] > 0).logical_and_(stage.constants["sees_content"]).to(entropy.dtype)
        entropy[..., 1:].mul_(c_ok)
        sums = stage.role_sums(torch.cat([entropy, c_ok], -1))  # [L, B, H, R, 3]
        return {
            "sum": sums[..., 0],
            "count": stage.live_counts(),
            "queries": stage.query_counts(),
            "content_sum": sums[..., 1],
            "content_count": sums[..., 2],
        }

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """``entropy`` rows ([N, H, R+1]) and ``anchor_content_entropy`` rows ([N, H, 1 or R])."""
        total, count = with_all(arrays["sum"], arrays["count"])
        queries = with_all(arrays["queries"], arrays["queries"])[1]
        value, keep = mean_or_empty(total, count, queries)
        overall = long_rows(
            stack,
            layer,
            examples,
            heads,
            "entropy",
            value.unsqueeze(-1).numpy(),
            count.numpy(),
            self.query_labels,
            (NO_ROLE,),
            keep.numpy(),
        )
        c_sum, c_count = arrays["content_sum"], arrays["content_count"]
        labels: tuple[str, ...] = self.roles.names
        if self.anchor_role is not None:
            i = self.anchor_role
            c_sum, c_count = c_sum[:, :, i : i + 1], c_count[:, :, i : i + 1]
            labels = (self.roles.names[i],)
        anchor = long_rows(
            stack,
            layer,
            examples,
            heads,
            "anchor_content_entropy",
            mean_of(c_sum, c_count).unsqueeze(-1).numpy(),
            c_count.numpy(),
            labels,
            (Role.CONTENT.label,),
        )
        return Rows.concat([overall, anchor])
