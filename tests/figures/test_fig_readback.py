"""One test per figure: the saved figure's axis labels, tick labels and colour-bar labels, read back, against
the run's metrics and roles (a run with a task's own role, ``scaffold``, beside the built-in ones).

What a reviewer rejects: heads labelled 0.0, 1.0 ...; a colour bar that says "decomposition" instead
of the measure and its unit; a tick reading 0.000561; a column for a role the run has not got.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from anchorlens.analyses import compare_frames
from anchorlens.figures import (
    ROLE_COLORS,
    attention_budget,
    attention_map_figure,
    head_diff_grid,
    head_grid,
    head_grids,
    layer_curves,
    position_sweep,
    role_flow_heatmaps,
    role_palette,
    sweep_curve,
)
from anchorlens.figures._roles import FALLBACK_COLORS

from . import runs
from .runs import (
    CUSTOM,
    assert_integer_ticks,
    assert_nice_ticks,
    colorbar_label,
    colorbar_ticks,
    colorbars,
    panels,
    saved_texts,
    texts,
)

CHECKPOINTS = ("base", "instance", "prompt")


@pytest.fixture(scope="module")
def run() -> pd.DataFrame:
    return runs.run_frame(CHECKPOINTS)


def _saved(fig, tmp_path, *labels: str) -> list[str]:
    """Save ``fig`` and check every given label is in the saved file (drawn, not only set)."""
    found = saved_texts(fig, tmp_path / "figure.svg")
    for label in labels:
        for line in label.split("\n"):
            assert any(line in t for t in found), (line, found[:40])
    return found


def test_attention_budget_reads_back_parts_roles_and_scale(run, tmp_path):
    fig = attention_budget(run, list(CHECKPOINTS))
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == ["base", "instance (anchor: instance)", "prompt (anchor: soft_prompt)"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    # top of the stack first; roles from the data (the task's own role included), absent ones omitted
    assert legend == [
        f"{CUSTOM} (sink excluded)",
        "content (sink excluded)",
        "structural (sink excluded)",
        "instance",
        "soft_prompt",
        "sink (first input token)",
    ]
    assert not any("special" in t or "capsule" in t for t in legend)
    for ax in axes:
        assert ax.get_xlabel() == "layer"
        assert_integer_ticks(texts(ax.get_xticklabels()))
    assert "attention mass" in axes[0].get_ylabel() and "input queries" in axes[0].get_ylabel()
    assert_nice_ticks(texts(axes[0].get_yticklabels()))
    # bars: one per layer and part, heights the frame's means, stacking to 1
    instance = axes[1]
    sink = [p for p in instance.patches if p.get_gid() == "part:sink"]
    rows = run[(run.checkpoint == "instance") & (run.metric == "decomposition") & (run.key_role == "sink")]
    assert [p.get_height() for p in sink] == pytest.approx(rows.groupby("layer")["value"].mean().tolist())
    tops = {}
    for p in instance.patches:
        tops[round(p.get_x(), 6)] = max(tops.get(round(p.get_x(), 6), 0), p.get_y() + p.get_height())
    assert list(tops.values()) == pytest.approx([1.0] * 4)
    colors = {p.get_gid(): p.get_facecolor() for p in instance.patches}
    from matplotlib.colors import to_rgba

    assert colors["part:guidance"] == to_rgba(ROLE_COLORS["instance"])
    assert colors[f"part:{CUSTOM}"] == to_rgba(FALLBACK_COLORS[0])  # the first role beyond the built-ins
    _saved(fig, tmp_path, *legend, "layer", axes[0].get_ylabel())


def test_role_flow_reads_back_the_runs_roles_and_marks_absent_ones(run, tmp_path):
    flow = run[run.metric == "role_flow"]
    fig = role_flow_heatmaps(flow, checkpoints=list(CHECKPOINTS))
    axes = panels(fig)
    expected = ["structural", "content", "soft_prompt", "instance", CUSTOM]  # built-ins in Role order, then others
    for ax in axes:
        assert texts(ax.get_yticklabels()) in ([], expected), texts(ax.get_yticklabels())
        assert texts(ax.get_xticklabels()) in ([], expected)
    assert texts(axes[-1].get_xticklabels()) == expected  # last row carries the key labels
    assert axes[0].get_ylabel() == "query role (attending)" and axes[-1].get_xlabel() == "key role (attended to)"
    # special and capsule (zero mass everywhere, never a query) are not drawn; a role one checkpoint lacks is n/a
    base = axes[0]
    na = [t for t in base.texts if t.get_text() == "n/a"]
    assert len(na) == 2 * len(expected) + 2 * (len(expected) - 2)  # soft_prompt and instance rows and columns
    assert not any(t.get_text() == "0.00" for t in base.texts)
    values = [t for t in base.texts if t.get_text() not in ("n/a",)]
    table = flow[flow.checkpoint == "base"].groupby(["query_role", "key_role"])["value"].mean()
    assert values[0].get_text() == f"{table[('structural', 'structural')]:.2f}"
    (cbar,) = colorbars(fig)
    assert colorbar_label(cbar) == "query role → key role (attention mass)"
    assert_nice_ticks(colorbar_ticks(cbar))
    palette = role_palette(expected)
    labels = axes[-1].get_xticklabels()
    assert {t.get_text(): t.get_color() for t in labels} == {r: palette[r] for r in expected}
    assert palette[CUSTOM] not in ROLE_COLORS.values()
    _saved(fig, tmp_path, *expected, colorbar_label(cbar), *colorbar_ticks(cbar))


def test_head_grid_reads_back_integer_heads_and_the_measure(run, tmp_path):
    fig = head_grid(run, "decomposition", "instance", query_role="input", key_role="sink")
    ax = panels(fig)[0]
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert texts(ax.get_xticklabels()) == ["0", "1", "2"] and texts(ax.get_yticklabels()) == ["0", "1", "2", "3"]
    (cbar,) = colorbars(fig)
    assert colorbar_label(cbar) == "input → sink (attention mass)"
    assert_nice_ticks(colorbar_ticks(cbar))
    lo, hi = cbar.get_ylim()
    cells = run[(run.checkpoint == "instance") & (run.key_role == "sink") & (run.metric == "decomposition")]
    means = cells.groupby(["layer", "head"])["value"].mean()
    assert lo <= means.min() and means.max() <= hi  # the nice scale holds the data
    _saved(fig, tmp_path, "head", "layer", colorbar_label(cbar), *colorbar_ticks(cbar))


def test_head_grids_read_back_one_nice_scale_for_the_custom_role(run, tmp_path):
    fig = head_grids(run, "decomposition", list(CHECKPOINTS), query_role="input", key_role=CUSTOM)
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == list(CHECKPOINTS)
    for ax in axes:
        assert_integer_ticks(texts(ax.get_xticklabels()))
        assert_integer_ticks(texts(ax.get_yticklabels()))
    (cbar,) = colorbars(fig)
    assert colorbar_label(cbar).split("\n")[0] == f"input → {CUSTOM} (sink excluded) (attention mass)"
    assert_nice_ticks(colorbar_ticks(cbar))
    assert len({ax.collections[0].get_clim() for ax in axes}) == 1
    _saved(fig, tmp_path, colorbar_label(cbar), *colorbar_ticks(cbar))


def test_head_diff_grid_reads_back_a_symmetric_nice_scale_and_the_measure(run, tmp_path):
    frames = {
        ck: run[(run.checkpoint == ck) & (run.metric == "decomposition")].drop(columns="checkpoint")
        for ck in CHECKPOINTS
    }
    paired = compare_frames(frames, "base", n_boot=200, n_perm=200, family=["checkpoint", "metric"])
    fig = head_diff_grid(paired, "decomposition", checkpoint="instance", query_role="input", key_role="sink")
    ax = panels(fig)[0]
    assert texts(ax.get_xticklabels()) == ["0", "1", "2"] and texts(ax.get_yticklabels()) == ["0", "1", "2", "3"]
    (cbar,) = colorbars(fig)
    assert colorbar_label(cbar) == "Δ input → sink (attention mass)"
    ticks = colorbar_ticks(cbar)
    assert_nice_ticks(ticks)
    assert ticks[0] == "−" + ticks[-1] and "0" in ticks  # centred on no difference
    shown = paired[(paired.checkpoint == "instance") & (paired.key_role == "sink")]
    assert float(ticks[-1]) >= shown["diff"].abs().max()
    assert "instance − base" in " ".join(fig.get_suptitle().split())
    _saved(fig, tmp_path, colorbar_label(cbar), *ticks)


def test_layer_curves_read_back_measures_with_units(run, tmp_path):
    fig = layer_curves(
        pd.concat([run[(run.metric == "decomposition") & (run.key_role == "sink")], run[run.metric == "entropy"]]),
        ["decomposition", "entropy"],
        order=list(CHECKPOINTS),
    )
    axes = panels(fig)
    assert [ax.get_ylabel() for ax in axes] == [
        "input → sink (attention mass)",
        "entropy of input queries (normalized entropy, 0–1)",
    ]
    assert [ax.get_title() for ax in axes] == ["input → sink", "entropy of input queries"]
    assert axes[-1].get_xlabel() == "layer"
    assert_integer_ticks(texts(axes[-1].get_xticklabels()))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(CHECKPOINTS)
    _saved(fig, tmp_path, *[ax.get_ylabel() for ax in axes], *CHECKPOINTS)


def test_position_sweep_reads_back_the_anchor_measure(tmp_path):
    rows = []
    for pos in ("last", "first", "middle"):
        for ex in range(4):
            for layer in range(2):
                rows.append(
                    ("capsule", ex, "decoder", layer, pd.NA, "anchor_mass", "input", "capsule", pos, 0.1 + 0.01 * ex)
                )
    df = pd.DataFrame(rows, columns=[*runs.COLUMNS[:-1], "position", "value"])
    fig = position_sweep(df, "anchor_mass")
    ax = panels(fig)[0]
    assert texts(ax.get_xticklabels()) == ["first", "middle", "last"]
    assert ax.get_ylabel() == "input → capsule (attention mass)" and ax.get_xlabel() == "anchor position"
    _saved(fig, tmp_path, ax.get_ylabel(), "first", "middle", "last")


def test_sweep_curve_reads_back_integer_counts_and_the_measure(tmp_path):
    table = pd.DataFrame(
        {"k": [0, 1, 2, 4], "position": ["first"] * 4, "anchor_mass": [np.nan, 0.2, 0.3, 0.35], "accuracy": 0.5}
    )
    fig = sweep_curve(table, "k", "anchor_mass", lo=None, hi=None, by="position")
    ax = panels(fig)[0]
    assert texts(ax.get_xticklabels()) == ["0", "1", "2", "4"] and ax.get_xlabel() == "instance tokens (k)"
    assert ax.get_ylabel() == "input → anchor (attention mass)"
    _saved(fig, tmp_path, ax.get_ylabel(), ax.get_xlabel())


class _Maps:
    """Maps of an input whose roles are names (a task's own role among them), as open roles will carry them."""

    def __init__(self, roles: list[str], guidance: str | None = None) -> None:
        names = ([guidance] if guidance else []) + roles
        n = len(names)
        probs = torch.tril(torch.rand(2, 2, n, n) + 0.05)
        self.probs = probs / probs.sum(-1, keepdim=True)
        self.layers, self.heads = [0, 1], [0, 1]
        self.q_roles = self.k_roles = names
        self.q_tokens = self.k_tokens = [f"t{i}" for i in range(n)]


def test_attention_map_reads_back_token_roles_legend_and_scale(tmp_path):
    roles = ["special", CUSTOM, CUSTOM, "structural", "content", "content", CUSTOM]
    fig = attention_map_figure({"base": _Maps(roles), "instance": _Maps(roles, "instance")}, layer="mean", head="mean")
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == ["base", "instance"]
    assert axes[0].get_xlabel() == "key position (attended to)" and axes[0].get_ylabel() == "query position (attending)"
    palette = role_palette(["instance", *roles])
    labels = axes[1].get_xticklabels()
    assert [t.get_text() for t in labels] == [f"t{i}" for i in range(8)]
    assert [t.get_color() for t in labels] == [palette[r] for r in ["instance", *roles]]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "instance (outlined)",
        "structural (dashed)",
        "special (tick colour)",
        "content (tick colour)",
        f"{CUSTOM} (tick colour)",
        "masked (causal)",
    ]
    (cbar,) = colorbars(fig)
    assert colorbar_label(cbar).startswith("query → key attention (probability), sqrt colour scale")
    assert_nice_ticks(colorbar_ticks(cbar))
    _saved(fig, tmp_path, *legend, *colorbar_ticks(cbar))
