"""Metrics derived from reducer frames (role_flow, first_token_mass), pooled with query counts.

Notation, per (example, stack, layer, head): F[s, r] is the ``role_flow`` value (mean mass a query
of role s puts on keys of role r) and n[s] its ``count`` (number of valid queries of role s), so
M[s, r] = F[s, r] * n[s] is the summed mass. Pooling over a query-role set S is weighted by query
counts (every query counts once; not a mean of per-role means):

    pooled(S, R) = sum_{s in S} sum_{r in R} M[s, r] / sum_{s in S} n[s],   count = sum_{s in S} n[s].

Query roles of S without queries in an example drop out of that example's sums; an example with
no query of S gives no row.

``structural_attention`` includes the attention sink when the sink is a structural token (it is
on most chat/instruction templates); the sink-aware split is the ``decomposition`` reducer's
metric (``analyses.decomposition``), which the headline uses.

Metrics fixed by the mask: :func:`mark_fixed` finds, from the ``visible_share``/``visible_keys``
rows, cells whose value the attention mask decides (queries that can see no key of R: value 0;
only keys of R: value 1; a single key: entropy 0) while keys of R exist in the example, and sets
their value to NaN and the ``fixed`` column to the reason; every other row has ``fixed == ""``. The same policy
covers the raw ``role_flow`` rows and empty cells: a query role whose queries see no key at all after a knockout
(fully masked rows) gets value NaN, count 0 and ``fixed`` = ``"empty: no visible key after knockout"``, never a 0
averaged in (:func:`anchorlens.analyses.derived.fixed_reasons`).

The functions here take and return frames; the computations run on integer-coded rows
(:mod:`anchorlens.analyses.derived`), which :func:`metrics_frame` feeds straight from the reducers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from anchorlens.analyses import derived as D
from anchorlens.analyses.derived import FIRST_TOKEN, MASK_REASON, RoleLike, Roles
from anchorlens.analyses.frames import INPUT
from anchorlens.analyses.rows import Rows
from anchorlens.capture.reducer import Reducer
from anchorlens.roles.kinds import Role


def _need_count(df: pd.DataFrame) -> None:
    """Raise unless ``df`` carries the ``count`` column pooling needs."""
    if "count" not in df.columns:
        raise ValueError("pooling over query roles needs the 'count' column of reducer frames")


def flow_mass(
    df: pd.DataFrame,
    key_roles: Roles,
    query_roles: Roles | None = None,
    *,
    metric: str = "flow_mass",
) -> pd.DataFrame:
    """Attention mass on keys of ``key_roles`` R from ``role_flow`` rows.

    query_roles None: one row per query role s present (including ``"all"``), value =
    sum_{r in R} F[s, r]. Otherwise one pooled row per site: value = pooled(S, R) (module
    docstring), query_role = :func:`roles_label` of S. key_role = ``roles_label(R)``. Either may be
    ``"input"`` (the frame's input roles: every role but guidance) or ``"guidance"``.
    """
    _need_count(df)
    return D.flow_rows(Rows.from_frame(df), key_roles, query_roles, metric).frame()


def anchor_mass(
    df: pd.DataFrame,
    anchor: RoleLike = "capsule",
    query_roles: Roles = INPUT,
) -> pd.DataFrame:
    """``anchor_mass``: mass that queries of ``query_roles`` put on the anchor, pooled by query counts.

    anchor a role: pooled(S, {anchor}) from ``role_flow``; anchor ``"first_token"``: the
    ``first_token_mass`` rows pooled the same way, sum_s m[s] n[s] / sum_s n[s]. key_role = anchor.
    """
    _need_count(df)
    return D.anchor_rows(Rows.from_frame(df), anchor, query_roles).frame()


def structural_attention(df: pd.DataFrame, query_roles: Roles | None = None) -> pd.DataFrame:
    """``structural_attention``: F[s, structural] per query role (None) or pooled over ``query_roles``.

    This includes the sink when the first input token is structural; ``decomposition`` splits it off.
    """
    return flow_mass(df, [Role.STRUCTURAL], query_roles, metric="structural_attention")


def special_attention(df: pd.DataFrame, query_roles: Roles | None = None) -> pd.DataFrame:
    """``special_attention``: F[s, special] per query role (None) or pooled over ``query_roles``."""
    return flow_mass(df, [Role.SPECIAL], query_roles, metric="special_attention")


def island_score(df: pd.DataFrame, roles: Roles = D.GUIDANCE) -> pd.DataFrame:
    """``island_score``: share of guidance queries' attention kept on guidance keys, pooled(G, G).

    value = sum_{s in G} sum_{r in G} M[s, r] / sum_{s in G} n[s]: every guidance query weighs
    the same, whatever its role (one capsule query and ten soft-prompt queries -> 11 queries).
    """
    return flow_mass(df, roles, roles, metric="island_score")


def anchor_structural(
    df: pd.DataFrame,
    anchor: RoleLike = "capsule",
    key_roles: Roles = (Role.STRUCTURAL,),
) -> pd.DataFrame:
    """``anchor_structural``: mass the anchor role's own queries put on ``key_roles``, F[anchor, R]."""
    return flow_mass(df, key_roles, [anchor], metric="anchor_structural")


def pooled_entropy(df: pd.DataFrame) -> pd.DataFrame:
    """``entropy`` pooled over input queries (query_role ``input``: the headline entropy) and over
    guidance queries (``guidance``), weighted by query counts, from the per-role ``entropy`` rows;
    input roles whose queries see a single key (entropy 0 by definition) are left out.

    A query role whose queries each see a single key (BOS at position 0 under a causal mask) has entropy 0
    by definition; pooling it would move the pooled entropy whenever a token is inserted before it, so such
    roles are left out (this needs the decomposition reducer's ``visible_keys`` rows). Guidance queries in
    that case are kept, and flagged by :func:`mark_fixed`.
    """
    rows = Rows.from_frame(df)
    if rows.where("metric", ["entropy"]).any():
        _need_count(df)
    return D.entropy_rows(rows).frame()


def guidance_absorption(df: pd.DataFrame) -> pd.DataFrame:
    """``guidance_absorption``: mass input queries give guidance keys divided by the guidance
    keys' share of the positions they can see (> 1: the guidance attracts more than its share).

    value = decomposition[input, K] / visible_share[input, K] for K = ``guidance`` and each guidance
    role; rows only where keys of K exist in the example. Share 0 (keys hidden by the mask) gives
    NaN, flagged by :func:`mark_fixed`.
    """
    return D.absorption_rows(Rows.from_frame(df)).frame()


def mark_fixed(df: pd.DataFrame) -> pd.DataFrame:
    """Set value NaN and ``fixed`` to the reason on rows the attention mask decides (module docstring).

    Needs the ``visible_share``/``visible_keys`` rows of the ``decomposition`` reducer; without them
    every row is kept as measured (``fixed == ""``).
    """
    df = df.assign(fixed="") if "fixed" not in df.columns else df.copy()
    index, reasons = D.fixed_reasons(Rows.from_frame(df))
    if len(index):
        positions = df.columns.get_indexer(["value", "fixed"])
        df.iloc[index, positions[0]] = float("nan")
        df.iloc[index, positions[1]] = reasons
    return df


def derived_metrics(df: pd.DataFrame, anchors: Sequence[RoleLike] = ("capsule",)) -> pd.DataFrame:
    """All derived metrics of a reducer frame: anchor_mass and anchor_structural per anchor,
    structural_attention and special_attention per query role, island_score, entropy pooled over
    input and over guidance queries, guidance_absorption, and ``field_flow`` (the role_flow rows of the template's
    field groups ``content:<field>``, :func:`~anchorlens.analyses.derived.field_flow_rows`).

    An anchor may be ``"first_token"`` (anchor_mass only). Metrics whose inputs are absent give no rows.
    """
    return D.derived_rows(Rows.from_frame(df), anchors).frame()


def _rows_of(item: Reducer | pd.DataFrame) -> Rows:
    """A reducer's (or a ready frame's) tidy rows as columns."""
    if isinstance(item, pd.DataFrame):
        return Rows.from_frame(item)
    rows = getattr(item, "rows", None)
    return rows() if callable(rows) else Rows.from_frame(item.frame())


def metrics_rows(
    reducers: Iterable[Reducer | pd.DataFrame] | Mapping[str, Reducer | pd.DataFrame],
    *,
    anchors: Sequence[RoleLike] = ("capsule",),
    derived: bool = True,
) -> Rows:
    """:func:`metrics_frame` as integer-coded rows (:class:`~anchorlens.analyses.rows.Rows`, with a ``fixed``
    label column when ``derived``): what a capture chunk writes to its shard without building a frame."""
    items: Iterable[Reducer | pd.DataFrame] = reducers.values() if isinstance(reducers, Mapping) else reducers
    base = Rows.concat(_rows_of(item) for item in items)
    if not derived or not len(base):
        return base
    return D.with_fixed(Rows.concat([base, D.derived_rows(base, anchors)]))


def metrics_frame(
    reducers: Iterable[Reducer | pd.DataFrame] | Mapping[str, Reducer | pd.DataFrame],
    *,
    anchors: Sequence[RoleLike] = ("capsule",),
    derived: bool = True,
) -> pd.DataFrame:
    """Concatenate reducer frames (or ready frames' tidy columns), append :func:`derived_metrics` rows and flag
    the rows the mask fixes (:func:`mark_fixed`: value NaN, reason in the ``fixed`` column)."""
    return metrics_rows(reducers, anchors=anchors, derived=derived).frame()


__all__ = [
    "FIRST_TOKEN",
    "anchor_mass",
    "anchor_structural",
    "derived_metrics",
    "MASK_REASON",
    "flow_mass",
    "guidance_absorption",
    "island_score",
    "mark_fixed",
    "metrics_rows",
    "pooled_entropy",
    "metrics_frame",
    "special_attention",
    "structural_attention",
]
