"""Where the queries of a role attend, per layer and key role: the run's roles, whatever its task named.

``flow_by_layer(metrics, queries="content")`` is the layer x key-role table of the mean mass that queries of
``queries`` (a role, ``input`` for every non-guidance role, or ``all``) put on keys of each role, from the
``role_flow`` rows: pooled over the query roles by query counts within each example, averaged over heads,
then over examples. Rows sum to 1 over the roles (every key has a role). Columns are the key roles of the run, in
the order of its role table when given, then its field groups (``content:<field>``: the content keys of each
template field, a finer partition of the ``content`` column, not counted in the sum); ``queries`` may be a field
group too.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from anchorlens.analyses.frames import ALL, INPUT, average_heads, input_labels, role_label
from anchorlens.roles.table import is_field_group


def flow_by_layer(
    metrics: pd.DataFrame,
    queries: str = INPUT,
    *,
    roles: Sequence[str] | None = None,
    stack: str | None = None,
) -> pd.DataFrame:
    """[layer x key role] mean attention mass of ``queries``' tokens on each key role (module docstring).

    ``roles``: the run's role names in table order (column order); ``stack``: which stack (default: the first,
    ``decoder`` or ``encoder``). ValueError when the frame has no ``role_flow`` rows or no query of the role.
    """
    flow = metrics[metrics["metric"] == "role_flow"]
    if "checkpoint" in flow.columns and flow["checkpoint"].nunique() > 1:
        raise ValueError("the frame holds several checkpoints; select one (metrics[metrics.checkpoint == NAME])")
    if flow.empty:
        raise ValueError("no role_flow rows in the metrics (capture with the default reducers)")
    stacks = list(dict.fromkeys(flow["stack"]))
    stack = stack or next((s for s in ("decoder", "encoder") if s in stacks), stacks[0])
    flow = flow[flow["stack"] == stack]
    if flow["head"].notna().any():
        flow = average_heads(flow)
    if queries == INPUT:
        wanted = list(input_labels(flow))
    elif queries == ALL:
        wanted = [ALL]
    else:
        wanted = [role_label(queries)]
    flow = flow[flow["query_role"].isin(wanted)]
    if flow.empty:
        raise ValueError(
            f"no queries of role {queries!r} in this run (query roles: {sorted(set(metrics['query_role']))})"
        )
    flow = flow.assign(_mass=flow["value"] * flow["count"])
    per_example = flow.groupby(["example", "layer", "key_role"], sort=False)[["_mass", "count"]].sum()
    per_example["value"] = per_example["_mass"] / per_example["count"].where(per_example["count"] > 0)
    table = per_example["value"].groupby(["layer", "key_role"]).mean().unstack("key_role").fillna(0.0)
    # roles the run has: every token is a query too, so a role with queries is present (keys-only positions, such
    # as prefix-tuning keys, show as mass); a role of the table that no example has is left out, never shown as 0
    present = set(metrics.loc[metrics["metric"] == "role_flow", "query_role"]) | {
        c for c in table.columns if (table[c] != 0).any()
    }
    named = [r for r in (roles or []) if r in table.columns]
    rest = sorted(c for c in table.columns if c not in named and not is_field_group(c))
    seen = dict.fromkeys(str(k) for k in flow["key_role"])  # the frame's order: the template's fields in order
    groups = [c for c in seen if c in table.columns and is_field_group(c) and c not in named]
    order = [r for r in named if not is_field_group(r)] + rest + [r for r in named if is_field_group(r)] + groups
    table = table[[c for c in order if c in present]]
    table.columns.name = "key role"
    return table
