"""The pandas implementation of the derived metrics and mask flags that :mod:`anchorlens.analyses.derived` replaced:
group-bys and merges on the tidy frame, kept as the independent reference the integer-coded version must equal."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import (
    ALL,
    GUIDANCE,
    INPUT,
    NO_ROLE,
    SITE_KEYS,
    concat_frames,
    conform,
    empty_frame,
    input_labels,
    per_head,
    role_label,
    roles_label,
)
from anchorlens.roles.kinds import GUIDANCE_ROLES, Role

RoleLike = str | int | Role
FIRST_TOKEN = "first_token"
Roles = Sequence[RoleLike] | str  # explicit roles, or INPUT / GUIDANCE: the run's input or guidance roles


def _labels(roles: Roles, df: pd.DataFrame | None = None) -> list[str]:
    """Role labels of ``roles``; ``"input"`` is the frame's input roles, ``"guidance"`` the guidance roles
    (``"all"`` refused: pool explicit roles)."""
    if isinstance(roles, str):
        if roles == INPUT:
            return list(input_labels(df if df is not None else empty_frame()))
        if roles == GUIDANCE:
            return [r.label for r in GUIDANCE_ROLES]
        roles = [roles]
    labels = [role_label(r) for r in roles]
    if ALL in labels:
        raise ValueError("pool explicit roles, not 'all'")
    return labels


def _label_of(labels: Sequence[str], df: pd.DataFrame) -> str:
    """:func:`roles_label` with the frame's input roles."""
    return roles_label(labels, input_labels(df))


def _need_count(df: pd.DataFrame) -> None:
    """Raise unless ``df`` carries the ``count`` column pooling needs."""
    if "count" not in df.columns:
        raise ValueError("pooling over query roles needs the 'count' column of reducer frames")


def _pool_queries(rows: pd.DataFrame, metric: str, query_label: str, key_label: str) -> pd.DataFrame:
    """Pool rows holding one (value, count) per site and query role: sum(value*count) / sum(count)."""
    if rows.empty:
        return empty_frame()
    rows = rows.assign(_mass=rows["value"] * rows["count"])
    out = rows.groupby(list(SITE_KEYS), sort=True, dropna=False).agg(_mass=("_mass", "sum"), count=("count", "sum"))
    out = out.reset_index()
    # sites whose queries all see no key (empty rows, count 0): NaN, flagged empty by mark_fixed
    out["value"] = (out["_mass"] / out["count"]).where(out["count"] > 0)
    out["metric"], out["query_role"], out["key_role"] = metric, query_label, key_label
    return conform(out.drop(columns="_mass"))


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
    keys = _labels(key_roles, df)
    key_label = _label_of(keys, df)
    flow = df[(df["metric"] == "role_flow") & df["key_role"].isin(keys)]
    if flow.empty:
        return empty_frame()
    by_query = (
        flow.groupby(list(SITE_KEYS) + ["query_role"], sort=True, dropna=False)
        .agg(value=("value", "sum"), count=("count", "first"))
        .reset_index()
    )
    by_query["value"] = by_query["value"].where(by_query["count"] > 0)  # an empty query role has no mass
    if query_roles is None:
        by_query["metric"], by_query["key_role"] = metric, key_label
        return conform(by_query)
    queries = _labels(query_roles, df)
    rows = by_query[by_query["query_role"].isin(queries)]
    return _pool_queries(rows, metric, _label_of(queries, df), key_label)


def anchor_mass(
    df: pd.DataFrame,
    anchor: RoleLike = "capsule",
    query_roles: Roles = INPUT,
) -> pd.DataFrame:
    """``anchor_mass``: mass that queries of ``query_roles`` put on the anchor, pooled by query counts.

    anchor a role: pooled(S, {anchor}) from ``role_flow``; anchor ``"first_token"``: the
    ``first_token_mass`` rows pooled the same way, sum_s m[s] n[s] / sum_s n[s]. key_role = anchor.
    """
    if isinstance(anchor, str) and anchor == FIRST_TOKEN:
        _need_count(df)
        queries = _labels(query_roles, df)
        rows = df[(df["metric"] == "first_token_mass") & df["query_role"].isin(queries)]
        return _pool_queries(rows, "anchor_mass", _label_of(queries, df), FIRST_TOKEN)
    return flow_mass(df, [anchor], query_roles, metric="anchor_mass")


def structural_attention(df: pd.DataFrame, query_roles: Roles | None = None) -> pd.DataFrame:
    """``structural_attention``: F[s, structural] per query role (None) or pooled over ``query_roles``.

    This includes the sink when the first input token is structural; ``decomposition`` splits it off.
    """
    return flow_mass(df, [Role.STRUCTURAL], query_roles, metric="structural_attention")


def special_attention(df: pd.DataFrame, query_roles: Roles | None = None) -> pd.DataFrame:
    """``special_attention``: F[s, special] per query role (None) or pooled over ``query_roles``."""
    return flow_mass(df, [Role.SPECIAL], query_roles, metric="special_attention")


def island_score(df: pd.DataFrame, roles: Roles = GUIDANCE) -> pd.DataFrame:
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
    input roles whose queries see a single key (entropy 0 by definition) are left out."""
    rows = per_head(df[df["metric"] == "entropy"])
    if rows.empty:
        return empty_frame()
    _need_count(rows)
    # a query role whose queries each see a single key (BOS at position 0 under a causal mask) has
    # entropy 0 by definition; pooling it would move the pooled entropy whenever a token is inserted
    # before it, so such roles are left out (needs the decomposition reducer's visible_keys rows)
    inputs = rows
    keys = df[df["metric"] == "visible_keys"]
    if len(keys):
        site = ["example", "stack", "layer", "query_role"]
        single = keys[keys["value"] <= 1][site].assign(_single=True)
        inputs = rows.merge(single, on=site, how="left")
        inputs = inputs[inputs["_single"].isna()].drop(columns="_single")
    parts = []
    for labels, source in (
        (_labels(INPUT, rows), inputs),
        (_labels(GUIDANCE), rows),
    ):  # guidance: flagged by mark_fixed
        parts.append(
            _pool_queries(source[source["query_role"].isin(labels)], "entropy", _label_of(labels, rows), NO_ROLE)
        )
    return concat_frames(parts)


_ABSORBING = (GUIDANCE,) + tuple(r.label for r in GUIDANCE_ROLES)


def guidance_absorption(df: pd.DataFrame) -> pd.DataFrame:
    """``guidance_absorption``: mass input queries give guidance keys divided by the guidance
    keys' share of the positions they can see (> 1: the guidance attracts more than its share).

    value = decomposition[input, K] / visible_share[input, K] for K = ``guidance`` and each guidance
    role; rows only where keys of K exist in the example. Share 0 (keys hidden by the mask) gives
    NaN, flagged by :func:`mark_fixed`.
    """
    mass = df[(df["metric"] == "decomposition") & (df["query_role"] == INPUT) & df["key_role"].isin(_ABSORBING)]
    share = df[(df["metric"] == "visible_share") & (df["query_role"] == INPUT) & df["key_role"].isin(_ABSORBING)]
    if mass.empty or share.empty:
        return empty_frame()
    on = ["example", "stack", "layer", "key_role"]
    out = mass.merge(share[on + ["value"]].rename(columns={"value": "_share"}), on=on, how="inner")
    out = out.merge(_present_keys(df), on=on, how="inner")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["value"] = np.where(out["_share"] > 0, out["value"] / out["_share"], np.nan)
    out["metric"] = "guidance_absorption"
    return conform(out.drop(columns=["_share"]))


def _present_keys(df: pd.DataFrame) -> pd.DataFrame:
    """(example, stack, layer, key_role) of keys some query of the example can see."""
    vis = df[(df["metric"] == "visible_share") & (df["value"] > 0)]
    return vis[["example", "stack", "layer", "key_role"]].drop_duplicates()


# metrics whose (query_role, key_role) is a visibility pair; fixed when the mask decides them. The raw
# role_flow rows (the bulk of a frame) are left as measured: the derived metrics above carry the flags.
_FLOW_METRICS = (
    "role_flow",
    "field_flow",
    "anchor_mass",
    "anchor_structural",
    "island_score",
    "structural_attention",
    "special_attention",
    "decomposition",
    "guidance_absorption",
)
MASK_REASON = "fixed by the causal mask"
EMPTY_REASON = "empty: no visible key after knockout"


def mark_fixed(df: pd.DataFrame) -> pd.DataFrame:
    """Set value NaN and ``fixed`` to the reason on rows the attention mask decides (module docstring).

    Needs the ``visible_share``/``visible_keys`` rows of the ``decomposition`` reducer; without them
    every row is kept as measured (``fixed == ""``).
    """
    df = df.assign(fixed="") if "fixed" not in df.columns else df.copy()
    site = ["example", "stack", "layer"]
    candidates = df["metric"].isin(_FLOW_METRICS + ("entropy",))
    blind = df[(df["metric"] == "visible_keys") & (df["value"] <= 0)][site + ["query_role"]].drop_duplicates()
    in_blind = df[site + ["query_role"]].merge(blind.assign(_blind=True), on=site + ["query_role"], how="left")
    empty = candidates & ((df["value"].isna() & (df["count"] <= 0)) | in_blind["_blind"].eq(True).to_numpy())
    df.loc[empty, "value"] = np.nan
    df.loc[empty, "fixed"] = EMPTY_REASON
    vis = df[df["metric"] == "visible_share"]
    if vis.empty:
        return df
    present = _present_keys(df).assign(_present=True)
    other = vis[vis["value"] < 1][site + ["key_role"]].drop_duplicates().assign(_other=True)
    share = vis[site + ["query_role", "key_role", "value"]].rename(columns={"value": "_share"})
    flow = df["metric"].isin(_FLOW_METRICS) & ~empty
    cand = df.loc[flow, site + ["query_role", "key_role"]].reset_index()
    cand = cand.merge(share, on=site + ["query_role", "key_role"], how="inner")
    cand = cand.merge(present, on=site + ["key_role"], how="left").merge(other, on=site + ["key_role"], how="left")
    zero = (cand["_share"] == 0) & cand["_present"].eq(True)
    one = (cand["_share"] == 1) & cand["_other"].eq(True)
    reasons = np.where(
        zero, MASK_REASON + ": {q} queries see no {k} key", MASK_REASON + ": {q} queries see only {k} keys"
    )
    hit = cand[zero | one].assign(_why=reasons[(zero | one).to_numpy()])
    keys_seen = df[df["metric"] == "visible_keys"][site + ["query_role", "value"]].rename(columns={"value": "_keys"})
    ent = df.loc[(df["metric"] == "entropy") & ~empty, site + ["query_role", "key_role"]].reset_index()
    single = keys_seen[(keys_seen["_keys"] <= 1) & (keys_seen["_keys"] > 0)]
    ent = ent.merge(single, on=site + ["query_role"], how="inner")
    ent = ent.assign(_why=MASK_REASON + ": {q} queries see a single key")
    hits = pd.concat(
        [hit[["index", "query_role", "key_role", "_why"]], ent[["index", "query_role", "key_role", "_why"]]]
    )
    if len(hits):
        why = [w.format(q=q, k=k) for w, q, k in zip(hits["_why"], hits["query_role"], hits["key_role"])]
        idx = hits["index"].to_numpy()
        df.loc[idx, "value"] = np.nan
        df.loc[idx, "fixed"] = why
    return df


def field_flow(df: pd.DataFrame) -> pd.DataFrame:
    """``role_flow`` rows with a field group (``content:<field>``) as query or key role, as metric ``field_flow``."""
    flow = df[df["metric"] == "role_flow"]
    group = flow["query_role"].astype(str).str.startswith("content:") | flow["key_role"].astype(str).str.startswith(
        "content:"
    )
    return conform(flow[group].assign(metric="field_flow"))


def derived_metrics(df: pd.DataFrame, anchors: Sequence[RoleLike] = ("capsule",)) -> pd.DataFrame:
    """All derived metrics of a reducer frame: anchor_mass and anchor_structural per anchor,
    structural_attention and special_attention per query role, island_score, entropy pooled over
    input and over guidance queries, guidance_absorption.

    An anchor may be ``"first_token"`` (anchor_mass only). Metrics whose inputs are absent give no rows.
    """
    absorption = guidance_absorption(df)
    entropy = pooled_entropy(df)
    df = df[df["metric"].isin(["role_flow", "first_token_mass"])]
    parts = []
    for anchor in anchors:
        parts.append(anchor_mass(df, anchor))
        if not (isinstance(anchor, str) and anchor == FIRST_TOKEN):
            parts.append(anchor_structural(df, anchor))
    parts += [structural_attention(df), special_attention(df), island_score(df), entropy, absorption, field_flow(df)]
    return concat_frames(parts)
