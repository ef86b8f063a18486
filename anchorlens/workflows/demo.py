"""The demo: the base and an instance token compared on the bundled RTE examples, the anchor effect per layer.

It is :func:`anchorlens.workflows.compare.compare` on the demo's checkpoints (one statistics path:
the per-layer table reads the compare run's metrics, the summary its headline rows with their
bootstrap CIs and paired differences); this module only picks the demo's defaults and shapes the
per-layer view.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import ALL, per_head
from anchorlens.analyses.headline import CONTENT_MASS, GUIDANCE_MASS, SINK_MASS, STRUCTURAL_MASS, HeadlineMetric
from anchorlens.roles.kinds import GUIDANCE_ROLES
from anchorlens.workflows.compare import Comparison, compare

# The training-free instance token at position 0 (the paper's anchor) against the bare base. A soft
# prompt is not in the default: no trained prompt ships with the package, and an untrained one is not
# the paper's soft prompt (add one with --ckpt prompt:n=20 to see where a prefix moves the sink).
DEMO_CHECKPOINTS: tuple[str, ...] = ("base", "instance")
# (column, headline metric) of the per-layer view: where input queries' attention goes
DEMO_PARTS: tuple[tuple[str, HeadlineMetric], ...] = (
    ("sink", SINK_MASS),
    ("anchor", GUIDANCE_MASS),
    ("structural", STRUCTURAL_MASS),
    ("content", CONTENT_MASS),
)
GUIDANCE_NAMES = tuple(r.label for r in GUIDANCE_ROLES)


def run_demo(
    checkpoints: Sequence[str] = DEMO_CHECKPOINTS,
    *,
    base: str = "smollm2-135m",
    task: str = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    batch_size: int = 8,
    dtype: str | None = None,
    device: str | None = None,
    allow_other_base: bool = False,
    progress: bool = False,
) -> Comparison:
    """Compare ``checkpoints`` (default: base and instance) on the task's examples: the compare workflow itself."""
    return compare(
        list(checkpoints),
        base=base,
        task=task,
        data=data,
        n=n,
        batch_size=batch_size,
        dtype=dtype,
        device=device,
        allow_other_base=allow_other_base,
        progress=progress,
    )


def guidance_of(result: Comparison) -> dict[str, str | None]:
    """Each checkpoint's guidance role (the anchor input queries can attend to), None for the bare base.

    Read from the run: a role is present when it occurs as a query role (every position is a query).
    """
    flow = result.metrics[(result.metrics["metric"] == "role_flow") & (result.metrics["query_role"] != ALL)]
    out: dict[str, str | None] = {}
    for name in result.checkpoints:
        roles = set(flow.loc[flow["checkpoint"] == name, "query_role"].astype(str))
        out[name] = next((g for g in GUIDANCE_NAMES if g in roles), None)
    return out


def per_layer_table(result: Comparison) -> pd.DataFrame:
    """Layer x (checkpoint, part) means over examples and heads of the sink-aware decomposition of input queries.

    Parts: sink (the first input token), anchor (the checkpoint's guidance; NaN for a checkpoint
    without one, so it reads "–" rather than 0.000), structural and content (the sink excluded).
    """
    guidance = guidance_of(result)
    columns = {}
    for name in result.checkpoints:
        rows = result.metrics[result.metrics["checkpoint"] == name]
        for part, metric in DEMO_PARTS:
            series = per_head(metric.rows(rows)).groupby("layer")["value"].mean()
            if part == "anchor" and guidance[name] is None:
                series = series * np.nan
            columns[(name, part)] = series
    table = pd.DataFrame(columns)
    table.index = pd.Index([int(v) for v in table.index], name="layer")
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["checkpoint", "part"])
    return table


def headline_of(result: Comparison, checkpoint: str, name: str) -> pd.Series | None:
    """The headline row ``name`` (``sink``, ``structural``, ``anchor_mass:instance`` ...) of one checkpoint."""
    rows = result.headline[(result.headline["checkpoint"] == checkpoint) & (result.headline["name"] == name)]
    return rows.iloc[0] if len(rows) else None
