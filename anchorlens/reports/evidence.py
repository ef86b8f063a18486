"""The evidence section of a comparison (``evidence.csv``): weight vs norm mass, sink rates, massive activations."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from matplotlib.figure import Figure

from anchorlens.analyses.evidence_table import NORM, WEIGHT
from anchorlens.analyses.massive import DEFAULT_ABS, DEFAULT_RATIO, TOP
from anchorlens.analyses.sink_battery import ALPHA_FIRST, SINK_RATE, SINK_RATE_ANY
from anchorlens.analyses.value_mass import NORM_SHARE
from anchorlens.figures._roles import ordered_roles
from anchorlens.figures.sinks import (
    RATE_LABEL,
    evidence_curves,
    massive_activations_figure,
    sink_alpha_grid,
    sink_rate_curves,
    sink_top_roles,
    value_mass_curves,
)
from anchorlens.roles.table import GUIDANCE_NAMES

EVIDENCE_NOTE = (
    "Evidence beyond attention weights (opt-in --evidence; descriptive, not in the paired tests or their "
    "Benjamini-Hochberg family). Mass that input queries give the first token, the sink (first input token) and the "
    "checkpoint's anchor, by weight (attention probability) and by norm (share of ||α v W_O||, Kobayashi et al. "
    "2020): a key can be weighted heavily and still write little. Sink rate@ε: share of heads whose first key gets "
    "mean attention α > ε (Gu et al. 2024); any-key: one of the top keys does. Massive activations: hidden entries "
    "with |h| > 100 and > 1000 × the layer's median (Sun et al. 2024), total over layers. Each example is averaged "
    "over heads and layers; mean over examples with 95% bootstrap CI. Per layer: evidence.csv."
)


def measure_label(measure: str, key: str) -> str:
    """Row label of one (measure, key) of the evidence table."""
    if measure in (WEIGHT, NORM):
        return f"input → {key}, by {measure}"
    name, _, eps = measure.partition("@")
    if name == "sink_rate":
        return f"sink rate (first key), ε = {eps}"
    if name == "sink_rate_any":
        return f"sink rate (any top key), ε = {eps}"
    if name == "massive_count":
        return "massive activations (total over layers)"
    return f"{measure} {key}".strip()


INCLUDES_MARK = " †"  # a cell whose measure includes an inserted or knocked-out position (see includes_notes)


def _includes(row: pd.Series) -> str:
    """The evidence row's ``includes`` text (empty when the measure reads input positions only)."""
    value = row.get("includes")
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def includes_notes(table: pd.DataFrame, stack: str | None = None) -> list[str]:
    """One line per (checkpoint, measure) of the all-layers evidence rows whose value includes an inserted or
    knocked-out position: what ``†`` in the evidence grid means for that cell."""
    if table is None or table.empty or "includes" not in table.columns:
        return []
    rows = table[table["layer"].isna()]
    if stack is not None:
        rows = rows[rows["stack"] == stack]
    lines = []
    for _, row in rows.iterrows():
        if _includes(row):
            label = measure_label(str(row["measure"]), "" if pd.isna(row["key"]) else str(row["key"]))
            lines.append(f"†{row['checkpoint']}, {label}: includes {_includes(row)}")
    return list(dict.fromkeys(lines))


def evidence_grid(table: pd.DataFrame, checkpoints: list[str], stack: str | None = None) -> pd.DataFrame:
    """The all-layers rows of the evidence table as a measure x checkpoint grid of ``mean [95% CI]`` cells
    (empty without evidence rows); ``stack`` defaults to the first (decoder, or the table's first)."""
    if table is None or table.empty:
        return pd.DataFrame()
    rows = table[table["layer"].isna()]
    stacks = list(dict.fromkeys(rows["stack"]))
    if not stacks:
        return pd.DataFrame()
    chosen = stack or ("decoder" if "decoder" in stacks else stacks[0])
    rows = rows[rows["stack"] == chosen]
    key_rank = rows["key"].map(lambda k: 0 if k == "first_token" else 1 if k == "sink" else 2 if k else 3)
    measure_rank = rows["measure"].map(
        lambda m: 0 if m == WEIGHT else 1 if m == NORM else 3 if m == "massive_count" else 2
    )
    rows = rows.assign(_k=key_rank, _m=measure_rank).sort_values(["_k", "key", "_m", "measure"], kind="stable")
    cells: dict[str, dict[str, str]] = {}
    for _, row in rows.iterrows():
        fmt = ".1f" if row["measure"] == "massive_count" else ".3f"
        text = f"{row['mean']:{fmt}} [{row['ci_lo']:{fmt}}, {row['ci_hi']:{fmt}}]"
        if _includes(row):
            text += INCLUDES_MARK
        cells.setdefault(measure_label(str(row["measure"]), str(row["key"])), {})[str(row["checkpoint"])] = text
    grid = pd.DataFrame.from_dict(cells, orient="index").reindex(columns=checkpoints)
    return grid.fillna("n/a (no such tokens)")


def table_figures(table: pd.DataFrame, checkpoints: list[str]) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) of what the evidence table reports, per layer, every checkpoint overlaid with
    its 95% interval: mass by weight and by norm per key (input queries, as ``evidence.csv``) and the sink rates."""
    if table is None or table.empty:
        return []
    per_layer = table[table["layer"].notna()]
    out: list[tuple[str, str, Figure]] = []
    mass = per_layer[per_layer["measure"].isin([WEIGHT, NORM])]
    keys = sorted(set(mass["key"].fillna("").astype(str)), key=lambda k: (k != "first_token", k != "sink", k))
    for key in keys:
        what = {"first_token": "the first token", "sink": "the sink (first input token)"}.get(key, key)
        out.append(
            (
                f"value_mass_{safe_stem(key)}",
                f"Input queries' attention to {what} per layer, by weight and by norm ||α v W_O|| "
                "(Kobayashi et al. 2020); the evidence table's per-layer rows, checkpoints overlaid",
                evidence_curves(
                    table,
                    [WEIGHT, NORM],
                    key=key,
                    checkpoints=checkpoints,
                    ylabel=f"input → {key}: share of the attention (0–1)",
                    title=f"Input queries → {what}: weight vs value-aware mass",
                ),
            )
        )
    rates = sorted(
        {str(m) for m in per_layer["measure"] if str(m).startswith((SINK_RATE + "@", SINK_RATE_ANY + "@"))},
        key=lambda m: (float(m.partition("@")[2]), m.startswith(SINK_RATE_ANY)),
    )
    if rates:
        out.append(
            (
                "sink_rate",
                "Sink rate per layer: share of heads whose first key (or any top key) gets mean attention α > ε "
                "(Gu et al. 2024), checkpoints overlaid",
                evidence_curves(
                    table, rates, checkpoints=checkpoints, ylabel=RATE_LABEL, title="Sink heads: α > ε per layer"
                ),
            )
        )
    return out


def evidence_figures(
    means: pd.DataFrame, checkpoints: list[str], options: dict | None = None, *, table: pd.DataFrame | None = None
) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) of the sink and value-mass figures; none where the evidence reducers did not run.

    With ``table`` (the evidence table, ``evidence.csv``) the value-mass and sink-rate figures draw its per-layer rows:
    input queries, 95% intervals, every checkpoint overlaid in one figure (:func:`table_figures`). The per-head α grid,
    the top-key roles and the massive activations stay one figure per checkpoint, drawn from compare's bounded
    ``means`` (every cell's mean over examples with its rows ``n``). Without ``table`` every figure is drawn from
    ``means`` per checkpoint (all queries). ``options``: the run's ``evidence`` record (massive-activation thresholds).
    """
    if means is None or means.empty or "metric" not in means.columns:
        return []
    from_table = table_figures(table, checkpoints) if table is not None else []
    drawn_from_table = {"value_mass" if stem.startswith("value_mass_") else stem for stem, _, _ in from_table}
    metrics = set(means["metric"].astype(str))
    massive = dict((options or {}).get("massive_activations") or {})
    out: list[tuple[str, str, str, Callable[..., Figure]]] = []  # stem, caption, checkpoint, draw
    for name in checkpoints:
        rows = means[means["checkpoint"] == name]
        if rows.empty:
            continue
        stem = safe_stem(name)
        if ALPHA_FIRST in metrics:
            out.append(
                (
                    f"sink_alpha_{stem}",
                    f"{name}: α of the first key per layer and head (Gu et al. 2024)",
                    name,
                    sink_alpha_grid,
                )
            )
            if "sink_rate" not in drawn_from_table:
                out.append(
                    (
                        f"sink_rate_{stem}",
                        f"{name}: sink rate per layer, first-key and any-key sinks, each ε",
                        name,
                        sink_rate_curves,
                    )
                )
            out += [
                (
                    f"sink_top_roles_{stem}",
                    f"{name}: role of the key each head sinks on most (top-1 by mass)",
                    name,
                    sink_top_roles,
                ),
            ]
        if f"{TOP}1" in metrics:
            abs_threshold = float(massive.get("abs_threshold", DEFAULT_ABS))
            ratio = float(massive.get("ratio", DEFAULT_RATIO))
            out.append(
                (
                    f"massive_{stem}",
                    f"{name}: largest |h| per layer against |h| = {abs_threshold:g} and {ratio:g} × median (Sun et al. 2024)",
                    name,
                    lambda frame, checkpoint, a=abs_threshold, r=ratio: massive_activations_figure(
                        frame, abs_threshold=a, ratio=r, checkpoint=checkpoint
                    ),
                )
            )
        if NORM_SHARE in metrics and "value_mass" not in drawn_from_table:
            flow = rows[(rows["metric"] == "role_flow") & rows["query_role"].isin(sorted(GUIDANCE_NAMES))]
            for key in ["first_token", *ordered_roles(flow["query_role"].unique())]:
                out.append(
                    (
                        f"value_mass_{key}_{stem}",
                        f"{name}: all queries → {key}, by weight and by norm ||α v W_O|| (Kobayashi et al. 2020)",
                        name,
                        lambda frame, checkpoint, k=key: value_mass_curves(frame, key_role=k, checkpoint=checkpoint),
                    )
                )
    drawn = list(from_table)
    for stem, caption, name, draw in out:
        try:
            drawn.append((stem, caption, draw(means, checkpoint=name)))
        except ValueError:  # a measure this checkpoint has no rows of
            continue
    return drawn


def safe_stem(name: str) -> str:
    """``name`` as a file stem: characters other than letters, digits, ``-``, ``_`` and ``.`` become ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
