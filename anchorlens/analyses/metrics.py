"""Metrics derived from reducer frames (role_flow, first_token_mass), pooled with query counts.

Notation, per (example, stack, layer, head): F[s, r] is the ``role_flow`` value (mean mass a query
of role s puts on keys of role r) and n[s] its ``count`` (number of valid queries of role s), so
M[s, r] = F[s, r] * n[s] is the summed mass. Pooling over a query-role set S is weighted by query
counts (every query counts once; not a mean of per-role means):

    pooled(S, R) = sum_{s in S} sum_{r in R} M[s, r] / sum_{s in S} n[s],   count = sum_{s in S} n[s].

Query roles of S without queries in an example drop out of that example's sums; an example with
no query of S gives no row.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import pandas as pd

from anchorlens.analyses.frames import ALL, SITE_KEYS, concat_frames, conform, empty_frame, role_label, roles_label
from anchorlens.capture.reducer import Reducer
from anchorlens.roles.kinds import GUIDANCE_ROLES, INPUT_ROLES, Role

RoleLike = str | int | Role
FIRST_TOKEN = "first_token"


def _labels(roles: Iterable[RoleLike]) -> list[str]:
    """Role labels of ``roles`` (``"all"`` refused: pool explicit roles)."""
    labels = [role_label(r) for r in roles]
    if ALL in labels:
        raise ValueError("pool explicit roles, not 'all'")
    return labels


def _need_count(df: pd.DataFrame) -> None:
    """Raise unless ``df`` carries the ``count`` column pooling needs."""
    if "count" not in df.columns:
        raise ValueError("pooling over query roles needs the 'count' column of reducer frames")


def _pool_queries(rows: pd.DataFrame, metric: str, query_label: str, key_label: str) -> pd.DataFrame:
    """Pool rows holding one (value, count) per site and query role: sum(value*count) / sum(count)."""
    if rows.empty:
        return empty_frame()
    rows = rows.assign(_mass=rows["value"] * rows["count"])
    out = rows.groupby(list(SITE_KEYS), sort=True).agg(_mass=("_mass", "sum"), count=("count", "sum"))
    out = out[out["count"] > 0].reset_index()
    out["value"] = out["_mass"] / out["count"]
    out["metric"], out["query_role"], out["key_role"] = metric, query_label, key_label
    return conform(out.drop(columns="_mass"))


def flow_mass(
    df: pd.DataFrame,
    key_roles: Sequence[RoleLike],
    query_roles: Sequence[RoleLike] | None = None,
    *,
    metric: str = "flow_mass",
) -> pd.DataFrame:
    """Attention mass on keys of ``key_roles`` R from ``role_flow`` rows.

    query_roles None: one row per query role s present (including ``"all"``), value =
    sum_{r in R} F[s, r]. Otherwise one pooled row per site: value = pooled(S, R) (module
    docstring), query_role = :func:`roles_label` of S. key_role = ``roles_label(R)``.
    """
    _need_count(df)
    keys = _labels(key_roles)
    key_label = roles_label(keys)
    flow = df[(df["metric"] == "role_flow") & df["key_role"].isin(keys)]
    if flow.empty:
        return empty_frame()
    by_query = flow.groupby(list(SITE_KEYS) + ["query_role"], sort=True).agg(
        value=("value", "sum"), count=("count", "first")).reset_index()
    if query_roles is None:
        by_query["metric"], by_query["key_role"] = metric, key_label
        return conform(by_query)
    queries = _labels(query_roles)
    rows = by_query[by_query["query_role"].isin(queries)]
    return _pool_queries(rows, metric, roles_label(queries), key_label)


def anchor_mass(
    df: pd.DataFrame,
    anchor: RoleLike = "capsule",
    query_roles: Sequence[RoleLike] = INPUT_ROLES,
) -> pd.DataFrame:
    """``anchor_mass``: mass that queries of ``query_roles`` put on the anchor, pooled by query counts.

    anchor a role: pooled(S, {anchor}) from ``role_flow``; anchor ``"first_token"``: the
    ``first_token_mass`` rows pooled the same way, sum_s m[s] n[s] / sum_s n[s]. key_role = anchor.
    """
    if isinstance(anchor, str) and anchor == FIRST_TOKEN:
        _need_count(df)
        queries = _labels(query_roles)
        rows = df[(df["metric"] == "first_token_mass") & df["query_role"].isin(queries)]
        return _pool_queries(rows, "anchor_mass", roles_label(queries), FIRST_TOKEN)
    return flow_mass(df, [anchor], query_roles, metric="anchor_mass")


def structural_attention(df: pd.DataFrame, query_roles: Sequence[RoleLike] | None = None) -> pd.DataFrame:
    """``structural_attention``: F[s, structural] per query role (None) or pooled over ``query_roles``."""
    return flow_mass(df, [Role.STRUCTURAL], query_roles, metric="structural_attention")


def special_attention(df: pd.DataFrame, query_roles: Sequence[RoleLike] | None = None) -> pd.DataFrame:
    """``special_attention``: F[s, special] per query role (None) or pooled over ``query_roles``."""
    return flow_mass(df, [Role.SPECIAL], query_roles, metric="special_attention")


def island_score(df: pd.DataFrame, roles: Sequence[RoleLike] = GUIDANCE_ROLES) -> pd.DataFrame:
    """``island_score``: share of guidance queries' attention kept on guidance keys, pooled(G, G).

    value = sum_{s in G} sum_{r in G} M[s, r] / sum_{s in G} n[s]: every guidance query weighs
    the same, whatever its role (one capsule query and ten soft-prompt queries -> 11 queries).
    """
    return flow_mass(df, roles, roles, metric="island_score")


def anchor_structural(
    df: pd.DataFrame,
    anchor: RoleLike = "capsule",
    key_roles: Sequence[RoleLike] = (Role.STRUCTURAL,),
) -> pd.DataFrame:
    """``anchor_structural``: mass the anchor role's own queries put on ``key_roles``, F[anchor, R]."""
    return flow_mass(df, key_roles, [anchor], metric="anchor_structural")


def derived_metrics(df: pd.DataFrame, anchors: Sequence[RoleLike] = ("capsule",)) -> pd.DataFrame:
    """All derived metrics of a reducer frame: anchor_mass and anchor_structural per anchor,
    structural_attention and special_attention per query role, island_score.

    An anchor may be ``"first_token"`` (anchor_mass only). Metrics whose inputs are absent give no rows.
    """
    df = df[df["metric"].isin(["role_flow", "first_token_mass"])]
    parts = []
    for anchor in anchors:
        parts.append(anchor_mass(df, anchor))
        if not (isinstance(anchor, str) and anchor == FIRST_TOKEN):
            parts.append(anchor_structural(df, anchor))
    parts += [structural_attention(df), special_attention(df), island_score(df)]
    return concat_frames(parts)


def metrics_frame(
    reducers: Iterable[Reducer | pd.DataFrame] | Mapping[str, Reducer | pd.DataFrame],
    *,
    anchors: Sequence[RoleLike] = ("capsule",),
    derived: bool = True,
) -> pd.DataFrame:
    """Concatenate reducer frames (or ready frames) and append :func:`derived_metrics` rows."""
    items = reducers.values() if isinstance(reducers, Mapping) else reducers
    base = concat_frames(item if isinstance(item, pd.DataFrame) else item.frame() for item in items)
    if not derived or base.empty:
        return base
    return concat_frames([base, derived_metrics(base, anchors)])


__all__ = [
    "FIRST_TOKEN",
    "anchor_mass",
    "anchor_structural",
    "derived_metrics",
    "flow_mass",
    "island_score",
    "metrics_frame",
    "special_attention",
    "structural_attention",
]
