"""Derived metrics and mask flags computed on :class:`~anchorlens.analyses.rows.Rows` (integer codes, no pandas).

The formulas are those of :mod:`anchorlens.analyses.metrics` (which states them and wraps these functions for
frames): pooled flow masses, pooled entropy, guidance absorption and the rows the attention mask fixes. Grouping
and matching run on integer keys (:mod:`anchorlens.analyses.groups`), so a chunk's derived rows cost
milliseconds; results and their row order equal the sorted pandas group-bys and merges they replace.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anchorlens.analyses.frames import (
    ALL,
    GUIDANCE,
    INPUT,
    NO_ROLE,
    input_labels_among,
    role_label,
    roles_label,
)
from anchorlens.analyses.groups import Groups, combined_key, key_ranks, lookup, member_of
from anchorlens.analyses.rows import NO_HEAD, Labels, Rows
from anchorlens.roles.kinds import GUIDANCE_ROLES, Role
from anchorlens.roles.table import is_field_group

RoleLike = str | int | Role
Roles = Sequence[RoleLike] | str  # explicit roles, or INPUT / GUIDANCE: the run's input or guidance roles
FIRST_TOKEN = "first_token"
SITE: tuple[str, ...] = ("example", "stack", "layer", "head")
MASK_REASON = "fixed by the causal mask"
EMPTY_REASON = "empty: no visible key after knockout"
# metrics whose (query_role, key_role) is a visibility pair; fixed when the mask decides them (the raw role_flow
# rows too: one policy for every metric, figures and tables read the same flag)
FIELD_FLOW = "field_flow"  # role_flow rows with a field group (content:<field>) on either side, under their own name
FLOW_METRICS = (
    "role_flow",
    FIELD_FLOW,
    "anchor_mass",
    "anchor_structural",
    "island_score",
    "structural_attention",
    "special_attention",
    "decomposition",
    "guidance_absorption",
)
_ABSORBING = (GUIDANCE,) + tuple(r.label for r in GUIDANCE_ROLES)


def input_labels_of(rows: Rows) -> tuple[str, ...]:
    """The input role labels among the rows' query roles (:func:`~anchorlens.analyses.frames.input_labels`)."""
    return input_labels_among(rows.labels["query_role"].present() if len(rows) else [])


def resolve_roles(roles: Roles, inputs: Sequence[str]) -> list[str]:
    """Role labels of ``roles``; ``"input"`` is ``inputs`` (the run's input roles), ``"guidance"`` the guidance
    roles (``"all"`` refused: pool explicit roles)."""
    if isinstance(roles, str):
        if roles == INPUT:
            return list(inputs)
        if roles == GUIDANCE:
            return [r.label for r in GUIDANCE_ROLES]
        roles = [roles]
    labels = [role_label(r) for r in roles]
    if ALL in labels:
        raise ValueError("pool explicit roles, not 'all'")
    return labels


def _nan0(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN as 0 (pandas' skipna sums)."""
    return np.where(np.isnan(values), 0.0, values)


def _grouped(
    rows: Rows,
    first: np.ndarray,
    value: np.ndarray,
    count: np.ndarray,
    metric: str,
    query_role: str | None = None,
    key_role: str | None = None,
) -> Rows:
    """Rows of groups whose keys are those of the rows ``first``; labels given replace theirs."""
    picked = rows.take(first)
    labels = dict(picked.labels)
    labels["metric"] = Labels.constant(metric, len(first))
    if query_role is not None:
        labels["query_role"] = Labels.constant(query_role, len(first))
    if key_role is not None:
        labels["key_role"] = Labels.constant(key_role, len(first))
    return Rows(picked.example, picked.layer, picked.head, value, count, labels)


def pool_queries(rows: Rows, metric: str, query_label: str, key_label: str) -> Rows:
    """Pool rows holding one (value, count) per site and query role: sum(value*count) / sum(count) per site, sorted by
    site. A site whose rows are all empty (count 0: queries that see no key) gives value NaN and count 0, flagged
    ``empty`` by :func:`with_fixed`."""
    if not len(rows):
        return Rows.empty()
    groups = Groups.of(rows, SITE)
    mass, count = groups.sum(_nan0(rows.value * rows.count)), groups.sum(_nan0(rows.count))
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(count > 0, mass / np.maximum(count, 1e-300), np.nan)
    return _grouped(rows, groups.first, value, count, metric, query_label, key_label)


def flow_rows(rows: Rows, key_roles: Roles, query_roles: Roles | None = None, metric: str = "flow_mass") -> Rows:
    """Attention mass on keys of ``key_roles`` from ``role_flow`` rows, per query role (None) or pooled over
    ``query_roles`` (:func:`anchorlens.analyses.metrics.flow_mass`)."""
    inputs = input_labels_of(rows)
    keys = resolve_roles(key_roles, inputs)
    queries = None if query_roles is None else resolve_roles(query_roles, inputs)
    key_label = roles_label(keys, inputs)
    flow = rows.take(rows.where("metric", ["role_flow"]) & rows.where("key_role", keys))
    if not len(flow):
        return Rows.empty()
    groups = Groups.of(flow, SITE + ("query_role",))
    count = flow.count[groups.first]
    # a query role whose queries see no key (empty rows: count 0, value NaN) has no mass to report: NaN, not 0
    mass = np.where(count > 0, groups.sum(_nan0(flow.value)), np.nan)
    by_query = _grouped(flow, groups.first, mass, count, metric, None, key_label)
    if queries is None:
        return by_query
    chosen = by_query.take(by_query.where("query_role", queries))
    return pool_queries(chosen, metric, roles_label(queries, inputs), key_label)


def anchor_rows(rows: Rows, anchor: RoleLike = "capsule", query_roles: Roles = INPUT) -> Rows:
    """``anchor_mass`` of queries of ``query_roles`` on the anchor (a role, or ``"first_token"``)."""
    if isinstance(anchor, str) and anchor == FIRST_TOKEN:
        inputs = input_labels_of(rows)
        queries = resolve_roles(query_roles, inputs)
        chosen = rows.take(rows.where("metric", ["first_token_mass"]) & rows.where("query_role", queries))
        return pool_queries(chosen, "anchor_mass", roles_label(queries, inputs), FIRST_TOKEN)
    return flow_rows(rows, [anchor], query_roles, metric="anchor_mass")


def _keys(rows: Rows, *columns: str) -> np.ndarray:
    """[n] one int64 key per row of ``columns`` (comparable between subsets of these rows only)."""
    return combined_key([key_ranks(rows, c) for c in columns])


def entropy_rows(rows: Rows) -> Rows:
    """``entropy`` pooled over input queries (leaving out query roles whose queries see a single key) and over
    guidance queries (:func:`anchorlens.analyses.metrics.pooled_entropy`)."""
    is_entropy = rows.where("metric", ["entropy"]) & (rows.head != NO_HEAD)
    if not is_entropy.any():
        return Rows.empty()
    entropy = rows.take(is_entropy)
    inputs_mask = np.ones(len(entropy), dtype=bool)
    seen = rows.where("metric", ["visible_keys"])
    if seen.any():
        part = is_entropy | seen  # keys of the rows that take part only
        sub = rows.take(part)
        key = _keys(sub, "example", "stack", "layer", "query_role")
        single = key[seen[part] & (sub.value <= 1)]
        inputs_mask = ~member_of(key[is_entropy[part]], single)
    inputs = input_labels_of(entropy)
    guidance = resolve_roles(GUIDANCE, inputs)
    parts = [
        pool_queries(
            entropy.take(inputs_mask & entropy.where("query_role", inputs)),
            "entropy",
            roles_label(inputs, inputs),
            NO_ROLE,
        ),
        pool_queries(
            entropy.take(entropy.where("query_role", guidance)), "entropy", roles_label(guidance, inputs), NO_ROLE
        ),
    ]
    return Rows.concat(parts)


def absorption_rows(rows: Rows) -> Rows:
    """``guidance_absorption``: decomposition[input, K] / visible_share[input, K] where keys of K exist
    (:func:`anchorlens.analyses.metrics.guidance_absorption`)."""
    is_mass, visible = rows.where("metric", ["decomposition"]), rows.where("metric", ["visible_share"])
    if not is_mass.any() or not visible.any():
        return Rows.empty()
    rows = rows.take(is_mass | visible)  # keys of the rows that take part only (not the role_flow bulk)
    pair = rows.where("query_role", [INPUT]) & rows.where("key_role", _ABSORBING)
    visible = rows.where("metric", ["visible_share"])
    mass, share = rows.where("metric", ["decomposition"]) & pair, visible & pair
    if not mass.any() or not share.any():
        return Rows.empty()
    key = _keys(rows, "example", "stack", "layer", "key_role")
    known, at = np.unique(key[share], return_index=True)  # one share per key (the first, as a merge on it)
    found, shares = lookup(key[mass], known, rows.value[share][at])
    present = member_of(key[mass], key[visible & (rows.value > 0)])
    kept = np.nonzero(mass)[0][found & present]
    shares = shares[found & present]
    out = rows.take(kept)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(shares > 0, out.value / shares, np.nan)
    labels = {**out.labels, "metric": Labels.constant("guidance_absorption", len(out))}
    return Rows(out.example, out.layer, out.head, value, out.count, labels)


def field_flow_rows(rows: Rows) -> Rows:
    """``field_flow``: the ``role_flow`` rows whose query or key group is a field group (``content:<field>``), the
    same values and counts under their own metric name, so that the paired statistics can test the template's fields
    (``content:hypothesis`` -> ``content:premise``) without every role-flow cell (:data:`FIELD_FLOW`)."""
    flow = rows.where("metric", ["role_flow"])
    if not flow.any():
        return Rows.empty()
    queries, keys = rows.labels["query_role"], rows.labels["key_role"]
    in_query = np.array([is_field_group(v) for v in queries.vocab], dtype=bool)[queries.codes]
    in_key = np.array([is_field_group(v) for v in keys.vocab], dtype=bool)[keys.codes]
    picked = rows.take(np.nonzero(flow & (in_query | in_key))[0])
    if not len(picked):
        return Rows.empty()
    labels = {**picked.labels, "metric": Labels.constant(FIELD_FLOW, len(picked))}
    return Rows(picked.example, picked.layer, picked.head, picked.value, picked.count, labels)


def derived_rows(rows: Rows, anchors: Sequence[RoleLike] = ("capsule",)) -> Rows:
    """All derived metrics of reducer rows (:func:`anchorlens.analyses.metrics.derived_metrics`)."""
    absorption = absorption_rows(rows)
    entropy = entropy_rows(rows)
    flow = rows.take(rows.where("metric", ["role_flow", "first_token_mass"]))
    parts = []
    for anchor in anchors:
        parts.append(anchor_rows(flow, anchor))
        if not (isinstance(anchor, str) and anchor == FIRST_TOKEN):
            parts.append(flow_rows(flow, [Role.STRUCTURAL], [anchor], metric="anchor_structural"))
    parts += [
        flow_rows(flow, [Role.STRUCTURAL], None, metric="structural_attention"),
        flow_rows(flow, [Role.SPECIAL], None, metric="special_attention"),
        flow_rows(flow, GUIDANCE, GUIDANCE, metric="island_score"),
        entropy,
        absorption,
        field_flow_rows(flow),
    ]
    return Rows.concat(parts)


def fixed_reasons(rows: Rows) -> tuple[np.ndarray, list[str]]:
    """(row indices [k], reasons [k]) of the rows that are not measurements (:func:`anchorlens.analyses.metrics.
    mark_fixed`): the one n/a policy of every metric, figure and table.

    - ``empty``: rows of queries that see no key at all after every edit (a knockout removed every key they could
      see): the reducers give them NaN and count 0 (:data:`EMPTY_REASON`); their query roles' other rows too, where
      ``visible_keys`` says they see none;
    - fixed by the mask, from the ``visible_share`` / ``visible_keys`` rows: a query role that sees no key of a key
      role (value 0) or only keys of it (value 1) while such keys exist in the example, a query role that sees a
      single key (entropy 0) (:data:`MASK_REASON` with the detail).
    """
    metrics = ["visible_share", "visible_keys", "entropy", *FLOW_METRICS]
    part = np.nonzero(rows.where("metric", metrics))[0]  # keys of the rows that take part only
    if not len(part):
        return np.zeros(0, dtype=np.int64), []
    index, reasons = _fixed_among(rows.take(part))
    return part[index], reasons


def _fixed_among(rows: Rows) -> tuple[np.ndarray, list[str]]:
    """:func:`fixed_reasons` of rows holding the visibility rows and the candidates only."""
    candidate = rows.where("metric", [*FLOW_METRICS, "entropy"])
    seen = rows.where("metric", ["visible_keys"])
    by_query = _keys(rows, "example", "stack", "layer", "query_role")
    blind = by_query[seen & (rows.value <= 0)]  # query roles that see no key at all
    empty = candidate & ((np.isnan(rows.value) & (rows.count <= 0)) | member_of(by_query, blind))
    empty_hits = np.nonzero(empty)[0]
    empty_reasons = [EMPTY_REASON] * len(empty_hits)
    if not rows.where("metric", ["visible_share"]).any():
        return empty_hits, empty_reasons
    measured = ~empty
    visible = rows.where("metric", ["visible_share"])
    by_key = _keys(rows, "example", "stack", "layer", "key_role")
    by_pair = _keys(rows, "example", "stack", "layer", "query_role", "key_role")
    candidate = rows.where("metric", FLOW_METRICS) & measured
    known, at = np.unique(by_pair[visible], return_index=True)
    found, share = lookup(by_pair[candidate], known, rows.value[visible][at])
    cand_key = by_key[candidate]
    zero = found & (share == 0) & member_of(cand_key, by_key[visible & (rows.value > 0)])
    only = found & (share == 1) & member_of(cand_key, by_key[visible & (rows.value < 1)])
    flow_hits = np.nonzero(candidate)[0][zero | only]
    templates = np.where(zero[zero | only], " queries see no {k} key", " queries see only {k} keys")
    entropy = rows.where("metric", ["entropy"]) & measured
    single = by_query[seen & (rows.value <= 1) & (rows.value > 0)]
    entropy_hits = np.nonzero(entropy & member_of(by_query, single))[0]
    queries, keys = rows.labels["query_role"], rows.labels["key_role"]
    reasons = [
        MASK_REASON + ": " + queries.vocab[queries.codes[i]] + t.format(k=keys.vocab[keys.codes[i]])
        for i, t in zip(flow_hits, templates)
    ]
    reasons += [
        MASK_REASON + ": " + queries.vocab[queries.codes[i]] + " queries see a single key" for i in entropy_hits
    ]
    return np.concatenate([empty_hits, flow_hits, entropy_hits]), empty_reasons + reasons


def with_fixed(rows: Rows) -> Rows:
    """The rows with a ``fixed`` label column (the reason, or ``""``) and value NaN where the mask fixes them."""
    index, reasons = fixed_reasons(rows)
    value = rows.value.copy()
    value[index] = np.nan
    vocab = ("",) + tuple(dict.fromkeys(reasons))
    code_of = {r: i for i, r in enumerate(vocab)}
    codes = np.zeros(len(rows), dtype=np.int64)
    codes[index] = [code_of[r] for r in reasons]
    return Rows(rows.example, rows.layer, rows.head, value, rows.count, {**rows.labels, "fixed": Labels(codes, vocab)})
