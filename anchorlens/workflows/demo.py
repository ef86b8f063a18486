"""The main job on the embedded default: per-layer anchor metrics of SmolLM2 on bundled RTE."""
from __future__ import annotations

import pandas as pd

from anchorlens.analyses.frames import ALL, INPUT


def per_layer_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """Layer x {first_token_mass, structural_attention, entropy}: means over examples and heads.

    first-token mass and structural attention are pooled over input queries (special, structural,
    content) weighted by their counts; entropy is the mean normalized entropy of all queries.
    """
    first = metrics[(metrics.metric == "anchor_mass") & (metrics.key_role == "first_token") & (metrics.query_role == INPUT)]
    structural = metrics[(metrics.metric == "structural_attention") & (metrics.query_role == ALL)]
    entropy = metrics[(metrics.metric == "entropy") & (metrics.query_role == ALL)]
    cols = {"first_token_mass": first, "structural_attention": structural, "entropy": entropy}
    table = pd.DataFrame({name: rows.groupby("layer")["value"].mean() for name, rows in cols.items()})
    table.index.name = "layer"
    return table


def format_table(table: pd.DataFrame, title: str) -> str:
    """Fixed-width text rendering of the per-layer table with a bar for first-token mass."""
    lines = [title, f"{'layer':>5}  {'->first':>8}  {'->struct':>8}  {'entropy':>8}  first-token mass"]
    for layer, row in table.iterrows():
        bar = "#" * int(round(row.first_token_mass * 40))
        lines.append(f"{layer:>5}  {row.first_token_mass:8.3f}  {row.structural_attention:8.3f}  {row.entropy:8.3f}  {bar}")
    mean = table.mean()
    lines.append(f"{'mean':>5}  {mean.first_token_mass:8.3f}  {mean.structural_attention:8.3f}  {mean.entropy:8.3f}")
    return "\n".join(lines)
