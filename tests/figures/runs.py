"""Run-shaped frames for figure tests (the columns and role labels capture writes), with a task's own roles.

``run_frame`` builds what ``compare`` holds in ``metrics``: the sink-aware decomposition of input
queries, role flow between every role the run has, and input entropy, per checkpoint, example,
layer and head. Like the real reducers it also emits key roles the inputs lack (``special``,
``capsule``) with zero mass, so the figures must tell absent roles from small ones. ``scaffold`` is
a role a task defines (open roles): no figure may need it listed anywhere but in the data.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rcParams
from matplotlib.figure import Figure

from anchorlens.analyses.frames import GUIDANCE, INPUT

CUSTOM = "scaffold"  # a task-defined role (chat template tokens)
INPUT_ROLES = ("structural", "content", CUSTOM)
ABSENT = ("special", "capsule")  # emitted by the reducers with zero mass: the inputs have none
GUIDANCE_OF = {"base": None, "instance": "instance", "prompt": "soft_prompt"}
COLUMNS = ["checkpoint", "example", "stack", "layer", "head", "metric", "query_role", "key_role", "value"]


def run_frame(
    checkpoints: tuple[str, ...] = ("base", "instance"),
    *,
    examples: int = 5,
    layers: int = 4,
    heads: int = 3,
    seed: int = 0,
    roles: tuple[str, ...] = INPUT_ROLES,
) -> pd.DataFrame:
    """Raw tidy rows of a comparison of ``checkpoints`` (names from GUIDANCE_OF) on inputs with ``roles``."""
    rng = np.random.default_rng(seed)
    rows: list[tuple] = []
    for ck in checkpoints:
        guidance = GUIDANCE_OF[ck]
        keys = ["sink", *([guidance] if guidance else []), *roles]
        for ex in range(examples):
            for layer in range(layers):
                for head in range(heads):
                    weights = rng.dirichlet(np.ones(len(keys)) * 3)
                    if guidance:
                        weights[1] += 0.4 * (layer + 1) / layers  # the anchor draws more in later layers
                        weights /= weights.sum()
                    part = dict(zip(keys, weights))
                    site = (ck, ex, "decoder", layer, head)
                    for key, value in part.items():
                        rows.append((*site, "decomposition", INPUT, key, float(value)))
                    rows.append((*site, "decomposition", INPUT, GUIDANCE, float(part.get(guidance, 0.0))))
                    for key in ABSENT:
                        rows.append((*site, "decomposition", INPUT, key, 0.0))
                    queries = [*roles, *([guidance] if guidance else [])]
                    visible = [*roles, *([guidance] if guidance else [])]
                    for q in queries:
                        flow = rng.dirichlet(np.ones(len(visible)))
                        for k, v in zip(visible, flow):
                            rows.append((*site, "role_flow", q, k, float(v)))
                        for k in ABSENT + tuple(g for g in ("instance", "soft_prompt") if g != guidance):
                            rows.append((*site, "role_flow", q, k, 0.0))
                    rows.append((*site, "entropy", INPUT, "", float(rng.uniform(0.3, 0.8))))
    df = pd.DataFrame(rows, columns=COLUMNS).astype({"head": "Int64"})
    keys = [c for c in COLUMNS if c not in ("head", "value")]
    means = df.groupby(keys, sort=False)["value"].mean().reset_index().assign(head=pd.NA)  # head <NA>: head means
    return pd.concat([df, means[COLUMNS].astype({"head": "Int64"})], ignore_index=True)


# ---------------------------------------------------------------------------- reading a saved figure back
def saved_texts(fig: Figure, path: Path) -> list[str]:
    """Every text string of ``fig`` as written to an SVG file (text kept as text), read back from the file."""
    old = rcParams["svg.fonttype"]
    rcParams["svg.fonttype"] = "none"
    try:
        fig.savefig(path, format="svg")
    finally:
        rcParams["svg.fonttype"] = old
    svg = path.read_text()
    texts = re.findall(r"<text[^>]*>(.*?)</text>", svg, flags=re.S)
    return [re.sub(r"<[^>]+>", "", t).replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&") for t in texts]


def panels(fig: Figure) -> list:
    """The data axes of a figure (colour bars and twin axes of no title excluded)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def colorbars(fig: Figure) -> list:
    """The colour-bar axes of a figure."""
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def colorbar_label(cax) -> str:
    """The label of a colour bar (vertical: its y label; horizontal: its x label)."""
    return cax.get_ylabel() or cax.get_xlabel()


def colorbar_ticks(cax) -> list[str]:
    """The tick labels of a colour bar, as drawn."""
    labels = cax.get_yticklabels() if cax.get_ylabel() or not cax.get_xlabel() else cax.get_xticklabels()
    return [t.get_text() for t in labels if t.get_text()]


def texts(labels) -> list[str]:
    """The strings of tick-label artists."""
    return [t.get_text() for t in labels if t.get_text()]


def assert_integer_ticks(labels: list[str]) -> None:
    """Layer / head ticks: whole numbers, never 0.0 or 1.5."""
    assert labels and all(re.fullmatch(r"\d+", t) for t in labels), labels


def assert_nice_ticks(labels: list[str]) -> None:
    """Colour-bar ticks: round numbers a nice step apart (1, 2, 2.5 or 5 times a power of ten), one format."""
    assert len(labels) >= 2, labels
    values = [float(t.replace("−", "-")) for t in labels]
    steps = np.diff(values)
    assert np.allclose(steps, steps[0], rtol=1e-6), labels
    mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
    assert any(np.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), labels
    assert all(np.isclose(v / steps[0], round(v / steps[0]), atol=1e-6) for v in values), labels
    decimals = {len(t.split(".")[1]) if "." in t else 0 for t in labels if float(t.replace("−", "-")) != 0}
    assert len(decimals) == 1 and max(decimals) <= 4, labels  # same format, no 0.000561
