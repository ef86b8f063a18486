"""The main job on the embedded default: per-layer anchor metrics of SmolLM2 on bundled RTE."""

from __future__ import annotations

import pandas as pd

from anchorlens.analyses.headline import CONTENT_MASS, GUIDANCE_MASS, INPUT_ENTROPY, SINK_MASS, STRUCTURAL_MASS

# (column, headline metric) of the per-layer table, in order
DEMO_COLUMNS = (
    ("sink", SINK_MASS),
    ("guidance", GUIDANCE_MASS),
    ("structural", STRUCTURAL_MASS),
    ("content", CONTENT_MASS),
    ("entropy", INPUT_ENTROPY),
)


def per_layer_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """Layer x {sink, guidance, structural, content, entropy}: means over examples and heads.

    The first four are the sink-aware decomposition of input queries' attention (structural and
    content exclude the sink); entropy is the normalized entropy of input queries.
    """
    table = pd.DataFrame({col: m.rows(metrics).groupby("layer")["value"].mean() for col, m in DEMO_COLUMNS})
    table.index.name = "layer"
    return table


def format_table(table: pd.DataFrame, title: str) -> str:
    """Fixed-width text rendering of the per-layer table with a bar for the sink mass."""
    head = "  ".join(f"{c:>10}" for c, _ in DEMO_COLUMNS)
    lines = [
        title,
        "input queries: sink = first input token; structural/content exclude the sink",
        f"{'layer':>5}  {head}  sink mass",
    ]
    for layer, row in table.iterrows():
        bar = "#" * int(round(row["sink"] * 40))
        lines.append(f"{layer:>5}  " + "  ".join(f"{row[c]:10.3f}" for c, _ in DEMO_COLUMNS) + f"  {bar}")
    mean = table.mean()
    lines.append(f"{'mean':>5}  " + "  ".join(f"{mean[c]:10.3f}" for c, _ in DEMO_COLUMNS))
    return "\n".join(lines)
