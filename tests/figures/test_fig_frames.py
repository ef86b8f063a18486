"""Curves, head grids, role flow and position sweeps from synthetic frames."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from anchorlens.figures import head_diff_grid, head_grid, layer_curves, position_sweep, role_flow_heatmaps

from . import synth


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_layer_curves_summary_one_line_per_checkpoint():
    fig = layer_curves(synth.summary(synth.tidy()), "anchor_mass")
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2 and len(ax.collections) == 2  # lines + CI bands
    assert ax.get_xlabel() == "layer" and ax.get_ylabel() == "content → anchor (attention mass)"
    assert "n = 6" in _flat(fig.get_suptitle())
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["capt", "prompt_tuning"]


def test_layer_curves_raw_facets_by_metric_and_rejects_mixed_roles():
    raw = synth.tidy()
    fig = layer_curves(raw, ["anchor_mass", "entropy"])
    assert len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == ["content → anchor", "entropy of content queries"]
    mixed = raw.copy()
    mixed.loc[mixed["example"] == 0, "query_role"] = "structural"
    with pytest.raises(ValueError, match="query_role"):
        layer_curves(mixed, "anchor_mass")
    assert len(layer_curves(mixed, "anchor_mass", query_role="structural").axes) == 1


def test_head_grid_layer_by_head():
    fig = head_grid(synth.tidy(layers=4, heads=3), "anchor_mass", "capt")
    assert len(fig.axes) == 2  # grid + colour bar
    ax = fig.axes[0]
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert len(ax.texts) == 12  # annotated cells
    assert "capt" in fig.get_suptitle()
    with pytest.raises(ValueError, match="available"):
        head_grid(synth.tidy(), "anchor_mass", "nope")


def test_head_diff_grid_centered_and_marks_significant():
    cmp = synth.compare(layers=4, heads=3)
    with pytest.raises(ValueError, match="checkpoint"):
        head_diff_grid(cmp, "anchor_mass")  # two checkpoints vs the baseline: choose one
    fig = head_diff_grid(cmp, "anchor_mass", checkpoint="capt")
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    capt = cmp[cmp["checkpoint"] == "capt"]
    lo, hi = ax.collections[0].get_clim()
    assert lo == pytest.approx(-hi) and hi >= capt["diff"].abs().max() and hi == pytest.approx(0.3)  # nice bound
    n_sig = int((capt["q_value"] < 0.05).sum())
    assert n_sig > 0 and sum(t.get_text().endswith("*") for t in ax.texts) == n_sig
    assert "capt − prompt_tuning" in _flat(fig.get_suptitle())
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"


def test_head_diff_grid_plain_q_column_and_big_grid_marks_only():
    big = synth.compare(layers=30, heads=9)
    big = big[big["checkpoint"] == "capt"].drop(columns=["checkpoint", "baseline"]).rename(columns={"q_value": "q"})
    ax = head_diff_grid(big, "anchor_mass").axes[0]
    assert len(ax.texts) == int((big["q"] < 0.05).sum())
    assert all(t.get_text() == "*" for t in ax.texts)


def test_role_flow_heatmaps_shared_scale():
    fig = role_flow_heatmaps(synth.role_flow())
    panels = fig.axes[:-1]
    assert len(fig.axes) == 3 and [ax.get_title() for ax in panels] == ["prompt_tuning", "capt"]  # frame order
    assert panels[0].collections[0].get_clim() == panels[1].collections[0].get_clim()
    assert fig.axes[-1].get_ylim() == pytest.approx(panels[0].collections[0].get_clim())
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["structural", "content"]
    assert "capsule" in [t.get_text() for t in panels[0].get_xticklabels()]
    shown = [t.get_text() for t in panels[1].texts]
    assert len(shown) == 2 * 4 + 2 and shown.count("n/a") == 2  # values, and n/a for capt's absent soft_prompt
    assert panels[0].get_xlabel().startswith("key role") and panels[0].get_ylabel().startswith("query role")


def test_position_sweep_orders_positions_and_twin_accuracy():
    df, acc = synth.sweep()
    fig = position_sweep(df, "anchor_mass", acc)
    assert len(fig.axes) == 2
    ax, ax2 = fig.axes
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["first", "after structural", "middle", "last", "2", "7"]
    assert ax.get_ylabel() == "content → anchor (attention mass)" and ax2.get_ylabel() == "accuracy"
    assert len(position_sweep(df, "anchor_mass").axes) == 1
