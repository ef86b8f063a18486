"""``evidence.csv``: attention mass by weight and by norm, sink rates and massive activations, per checkpoint and layer.

Not paired and not in the Benjamini-Hochberg family of ``paired.csv`` (see :mod:`anchorlens.analyses.defaults`):
a descriptive table of the opt-in evidence reducers beside the default statistics. Per example, stack and layer
(values averaged over heads):

=================== ================ ===================================================================================
measure             key              per-example value (input queries: every non-guidance query role, pooled by count)
=================== ================ ===================================================================================
``weight``          ``first_token``  ``first_token_mass`` of input queries (the example's first valid key)
``norm``            ``first_token``  ``value_mass`` ``norm_share`` of that key, input queries (||A v W_O|| share)
``weight``          ``sink``         ``decomposition`` input → sink (the first valid input key)
``norm``            ``sink``         ``norm_share`` of the sink, input queries
``weight``          ANCHOR           ``role_flow`` input → ANCHOR (instance, capsule, soft_prompt: the checkpoint's)
``norm``            ANCHOR           ``norm_share`` of ANCHOR's keys, input queries
``sink_rate@e``     ``""``           ``sink_battery``: share of the layer's heads whose first key gets alpha > e
``sink_rate_any@e`` ``""``           the same for any of the top keys by received mass
``massive_count``   ``""``           ``massive_activations`` over INPUT positions: entries with |h| > 100 and > 1000 x
                                     their median (the positions a method inserts left out; the all-positions count
                                     stays in metrics.parquet, query_role ``all``)
=================== ================ ===================================================================================

Input-only: every measure reads input queries (or input positions), never the row of a position a method inserted
or a knockout emptied, except where its definition cannot: the sink rates count every valid query (the battery's
definition, inserted positions' rows included; queries a knockout left with no key see no key and are not
counted), and a knockout of input keys (``keys=first``, ``pos=N``) acts on input positions. The table's ``includes``
column says so for each such row (empty: input-only).

Pooling over input query roles weighs every query once: sum_s value[s] * count[s] / sum_s count[s], the same for
weight and norm, so the two columns differ only in what is measured. Sink rates count every valid query (the
battery's definition). The all-layers row of an example (``layer`` <NA> in the table) is its mean over layers
(the total over layers for ``massive_count``). The table: mean over examples, 95% percentile-bootstrap CI, n.

:class:`EvidenceSummaries` gathers the per-example values chunk by chunk into a :class:`CellSpill` on disk and
summarises one block of cells at a time, so memory does not grow with the number of examples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from anchorlens.analyses.decomposition import SINK
from anchorlens.analyses.frames import INPUT, input_labels, per_head
from anchorlens.analyses.massive import COUNT as MASSIVE_COUNT
from anchorlens.analyses.sink_battery import SINK_RATE, SINK_RATE_ANY
from anchorlens.analyses.spill import CellSpill
from anchorlens.analyses.stats import summarize
from anchorlens.analyses.value_mass import FIRST_LABEL, NORM_SHARE

WEIGHT = "weight"
NORM = "norm"
FIRST = FIRST_LABEL  # "first_token"
CELL: tuple[str, ...] = ("stack", "layer", "measure", "key")
ALL_LAYERS = -1  # the all-layers row inside the spill; <NA> in the table
TABLE_COLUMNS: tuple[str, ...] = ("checkpoint", *CELL, "mean", "ci_lo", "ci_hi", "n", "includes")
EVIDENCE_METRICS_PREFIXES = (NORM_SHARE, SINK_RATE + "@", SINK_RATE_ANY + "@", MASSIVE_COUNT)


def has_evidence(df: pd.DataFrame) -> bool:
    """Whether a tidy frame holds rows of an evidence reducer (value_mass, sink_battery, massive_activations)."""
    metrics = df["metric"].astype(str)
    return bool(metrics.str.startswith(EVIDENCE_METRICS_PREFIXES).any())


def _pool_heads(rows: pd.DataFrame, key: str, measure: str) -> pd.DataFrame:
    """Rows of one measure (one or several input query roles per head) pooled by query count, then averaged over
    heads: example, stack, layer, measure, key, value."""
    if rows.empty:
        return pd.DataFrame(columns=["example", "stack", "layer", "measure", "key", "value"])
    rows = rows.assign(_mass=rows["value"] * rows["count"], _n=rows["count"].where(rows["value"].notna(), 0.0))
    site = ["example", "stack", "layer", "head"]
    pooled = rows.groupby(site, sort=False, dropna=False)[["_mass", "_n"]].sum()
    pooled = pooled[pooled["_n"] > 0]
    value = (pooled["_mass"] / pooled["_n"]).groupby(level=["example", "stack", "layer"], sort=False).mean()
    return value.rename("value").reset_index().assign(measure=measure, key=key)


def _per_layer(rows: pd.DataFrame, measure: str, key: str = "") -> pd.DataFrame:
    """Rows already one per example and layer (head <NA>) or per head (averaged over heads)."""
    value = rows.groupby(["example", "stack", "layer"], sort=False)["value"].mean()
    return value.reset_index().assign(measure=measure, key=key)


def example_evidence(df: pd.DataFrame, anchors: Sequence[str] = ()) -> pd.DataFrame:
    """Per example, stack, layer (and the all-layers row, layer -1), measure and key: the value (module docstring).

    ``df``: the tidy rows of one checkpoint (reducer rows; derived rows are ignored); ``anchors``: the guidance
    roles whose mass is reported (e.g. ``("instance",)``). Measures whose reducer did not run give no rows.
    """
    if df.empty or not has_evidence(df):
        return pd.DataFrame(columns=["example", *CELL, "value"])
    inputs = list(input_labels(df))
    heads = per_head(df)
    from_inputs = heads[heads["query_role"].isin(inputs)]
    parts = [_pool_heads(from_inputs[from_inputs["metric"] == "first_token_mass"], FIRST, WEIGHT)]
    norm = from_inputs[from_inputs["metric"] == NORM_SHARE]
    if len(norm):
        parts.append(_pool_heads(norm[norm["key_role"] == FIRST], FIRST, NORM))
        decomposition = heads[
            (heads["metric"] == "decomposition") & (heads["query_role"] == INPUT) & (heads["key_role"] == SINK)
        ]
        parts.append(_per_layer(decomposition, WEIGHT, SINK))
        parts.append(_pool_heads(norm[norm["key_role"] == SINK], SINK, NORM))
    flow = from_inputs[from_inputs["metric"] == "role_flow"]
    for anchor in anchors:
        parts.append(_pool_heads(flow[flow["key_role"] == anchor], anchor, WEIGHT))
        if len(norm):
            parts.append(_pool_heads(norm[norm["key_role"] == anchor], anchor, NORM))
    metric = df["metric"].astype(str)
    for name in sorted(set(metric[metric.str.startswith((SINK_RATE + "@", SINK_RATE_ANY + "@"))])):
        parts.append(_per_layer(df[metric == name], name))
    massive = df[metric == MASSIVE_COUNT]
    if len(massive) and (massive["query_role"] == INPUT).any():
        massive = massive[massive["query_role"] == INPUT]  # input positions only (not inserted/knocked-out rows)
    if len(massive):
        parts.append(_per_layer(massive, MASSIVE_COUNT))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=["example", *CELL, "value"])
    layers = pd.concat(parts, ignore_index=True)
    layers["layer"] = layers["layer"].astype(np.int64)
    group = layers.groupby(["example", "stack", "measure", "key"], sort=False)["value"]
    mean, total = group.mean(), group.sum(min_count=1)
    overall = mean.where(mean.index.get_level_values("measure") != MASSIVE_COUNT, total).reset_index()
    overall["layer"] = ALL_LAYERS
    return pd.concat([layers, overall], ignore_index=True)[["example", *CELL, "value"]]


class EvidenceSummaries:
    """The evidence table of a comparison, gathered chunk by chunk: per-example values spilled to disk (bounded
    memory), summarised block by block at the end."""

    def __init__(
        self,
        folder: Path,
        n_examples: int,
        anchors: Mapping[str, Sequence[str]],
        knocked_out: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """``anchors``: checkpoint -> the guidance roles it inserts; ``knocked_out``: checkpoint -> the keys its
        knockouts remove (``instance``, ``first``, ``pos=N``), for the ``includes`` column."""
        self.spill = CellSpill(folder, CELL, n_examples)
        self.anchors = {k: tuple(v) for k, v in anchors.items()}
        self.knocked_out = {k: tuple(v) for k, v in (knocked_out or {}).items()}

    def add(self, checkpoint: str, df: pd.DataFrame) -> None:
        """Fold one checkpoint's chunk of tidy rows in."""
        rows = example_evidence(df, self.anchors.get(checkpoint, ()))
        self.spill.add(checkpoint, rows)

    def table(self, checkpoints: Sequence[str], n_boot: int = 2000) -> pd.DataFrame:
        """The evidence table (:data:`TABLE_COLUMNS`): per checkpoint, stack, layer (<NA>: all layers), measure,
        key: mean over examples, 95% bootstrap CI, n. Empty when no evidence reducer ran."""
        parts = []
        for side in self.spill.sides:
            for ids, values in self.spill.blocks(side):
                rows = self.spill.long_rows(side, ids, values)
                if len(rows):
                    parts.append(summarize(rows, list(CELL), n_boot=n_boot).assign(checkpoint=side))
        if not parts:
            return pd.DataFrame(columns=list(TABLE_COLUMNS))
        table = pd.concat(parts, ignore_index=True)
        return order_table(with_includes(table, self.anchors, self.knocked_out), checkpoints)


_INPUT_KEYS = ("first", "pos=")  # knockout keys that are input positions (a role name is a role's keys)


def includes_note(measure: str, key: str, anchors: Sequence[str], knocked_out: Sequence[str]) -> str:
    """What a measure of a checkpoint includes beyond input queries and positions (``""``: input-only): the rows of
    inserted positions (``anchors``: the guidance roles the checkpoint inserts), knocked-out keys or positions
    (``knocked_out``: its knockouts' keys, ``instance``, ``first``, ``pos=N``)."""
    notes = []
    input_knockouts = [k for k in knocked_out if k.startswith(_INPUT_KEYS)]
    if measure.startswith((SINK_RATE + "@", SINK_RATE_ANY + "@")):
        if anchors:
            notes.append(f"rows of inserted {'/'.join(anchors)} positions")
        notes += [f"knocked-out {k} key" for k in knocked_out]
    elif measure == MASSIVE_COUNT:
        notes += [f"knocked-out {k} position" for k in input_knockouts]
    elif measure in (WEIGHT, NORM):
        if key == FIRST and anchors:
            notes.append(f"first key: an inserted {'/'.join(anchors)} position where it comes first")
        if key in knocked_out or (key in (FIRST, SINK) and input_knockouts):
            notes.append(f"knocked-out key ({', '.join([k for k in knocked_out if k == key] or input_knockouts)})")
    return "; ".join(notes)


def with_includes(
    table: pd.DataFrame, anchors: Mapping[str, Sequence[str]], knocked_out: Mapping[str, Sequence[str]]
) -> pd.DataFrame:
    """``table`` (checkpoint, measure, key columns) with the ``includes`` column of :func:`includes_note`."""
    notes = [
        includes_note(str(m), str(k), anchors.get(str(c), ()), knocked_out.get(str(c), ()))
        for c, m, k in zip(table["checkpoint"], table["measure"], table["key"], strict=True)
    ]
    return table.assign(includes=notes)


def order_table(table: pd.DataFrame, checkpoints: Sequence[str]) -> pd.DataFrame:
    """Rows ordered by checkpoint (as given), stack, measure (weight, norm, rates, count), key, layer (all layers
    first); ``layer`` nullable with <NA> for the all-layers rows."""
    table = table.copy()
    layer = table["layer"].astype(np.int64)
    rank = {name: i for i, name in enumerate(checkpoints)}
    measure_rank = table["measure"].map(
        lambda m: 0 if m == WEIGHT else 1 if m == NORM else 3 if m == MASSIVE_COUNT else 2
    )
    key_rank = table["key"].map(lambda k: 0 if k == FIRST else 1 if k == SINK else 2)
    table = table.assign(
        _c=table["checkpoint"].map(rank).fillna(len(rank)), _k=key_rank, _m=measure_rank, _l=layer
    ).sort_values(["_c", "stack", "_k", "key", "_m", "measure", "_l"], kind="stable")
    table["layer"] = nullable_layers(table["_l"])
    table["n"] = table["n"].astype(np.int64)
    if "includes" not in table.columns:
        table["includes"] = ""
    return table[list(TABLE_COLUMNS)].reset_index(drop=True)


def nullable_layers(layers: Iterable[int]) -> pd.arrays.IntegerArray:
    """Layer indices as a nullable integer column, ``ALL_LAYERS`` (the all-layers row) as <NA>."""
    return pd.array([None if v == ALL_LAYERS else int(v) for v in layers], dtype="Int64")


def evidence_table(
    frame: pd.DataFrame,
    anchors: Mapping[str, Sequence[str]],
    n_boot: int = 2000,
    knocked_out: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The evidence table of an in-memory tidy frame with a ``checkpoint`` column (what :class:`EvidenceSummaries`
    gives chunk by chunk): per-example values, then mean and bootstrap CI over examples, and ``includes``."""
    parts = [
        example_evidence(rows, anchors.get(str(name), ())).assign(checkpoint=str(name))
        for name, rows in frame.groupby("checkpoint", sort=False)
    ]
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if rows.empty:
        return pd.DataFrame(columns=list(TABLE_COLUMNS))
    out = summarize(rows, ["checkpoint", *CELL], n_boot=n_boot)
    out = with_includes(out, {str(k): tuple(v) for k, v in anchors.items()}, dict(knocked_out or {}))
    return order_table(out, list(dict.fromkeys(frame["checkpoint"].astype(str))))


__all__ = [
    "ALL_LAYERS",
    "CELL",
    "EvidenceSummaries",
    "NORM",
    "TABLE_COLUMNS",
    "WEIGHT",
    "evidence_table",
    "example_evidence",
    "has_evidence",
    "includes_note",
    "nullable_layers",
    "order_table",
]
