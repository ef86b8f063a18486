"""The demo: the base and an instance token compared on the bundled RTE examples, the anchor effect per layer.

It is :func:`anchorlens.workflows.compare.compare` on the demo's checkpoints (one statistics path:
the per-layer table of :mod:`anchorlens.reports.demo` reads the compare run's metrics, the finding
its headline rows with their bootstrap CIs and paired differences); this module picks the demo's
defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses.headline import CONTENT_MASS, GUIDANCE_MASS, SINK_MASS, STRUCTURAL_MASS, HeadlineMetric
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.compare import Comparison, compare
from anchorlens.workflows.mean_maps import MAP_EXAMPLES

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
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    map_examples: int = MAP_EXAMPLES,
    map_layers: Sequence[int] | None = None,
) -> Comparison:
    """Compare ``checkpoints`` (default: base and instance) on the task's examples: the compare workflow itself
    (``field_map``/``prompt``: the inputs' column renames and chat / few-shot options), and average each
    checkpoint's maps of ``map_layers`` (default: 0, 1, the middle and the last layer) over its first
    ``map_examples`` examples."""
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
        field_map=field_map,
        prompt=prompt,
        map_examples=map_examples,
        map_layers=map_layers,
    )


def headline_of(result: Comparison, checkpoint: str, name: str) -> pd.Series | None:
    """The headline row ``name`` (``sink``, ``structural``, ``anchor_mass:instance`` ...) of one checkpoint."""
    rows = result.headline[(result.headline["checkpoint"] == checkpoint) & (result.headline["name"] == name)]
    return rows.iloc[0] if len(rows) else None
