"""What a reviewer checks: shared labelled scales, wrapped grids, one bracket per soft prompt, blank
absent roles, checkpoint order, legends off the title, bootstrap CIs, sweep axes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses import stats
from anchorlens.figures import (
    anchor_tokens,
    attention_map_figure,
    head_grid,
    head_grids,
    head_range,
    layer_curves,
    role_flow_heatmaps,
    sweep_curve,
)
from anchorlens.figures._frames import summarize
from anchorlens.figures.maps import tick_plan

from . import synth


def _five_checkpoints() -> pd.DataFrame:
    """Per-head anchor_mass of five checkpoints on very different ranges (like base vs prompt)."""
    rows = []
    for ci, ck in enumerate(["base", "instance", "capsule", "prompt:n=10", "deep-prompt:n=2"]):
        for ex in range(3):
            for layer in range(3):
                for h in range(2):
                    rows.append(
                        (
                            ck,
                            ex,
                            "decoder",
                            layer,
                            h,
                            "anchor_mass",
                            "input",
                            "first_token",
                            0.05 + 0.2 * ci + 0.01 * layer + 0.001 * h + 0.0001 * ex,
                        )
                    )
    return pd.DataFrame(
        rows, columns=["checkpoint", "example", "stack", "layer", "head", "metric", "query_role", "key_role", "value"]
    )


def _panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_head_grids_share_one_labelled_scale_and_wrap():
    df = _five_checkpoints()
    fig = head_grids(df, "anchor_mass")
    panels = _panels(fig)
    assert [ax.get_title() for ax in panels] == ["base", "instance", "capsule", "prompt:n=10", "deep-prompt:n=2"]
    clims = {ax.collections[0].get_clim() for ax in panels}
    lo, hi = df.groupby(["checkpoint", "layer", "head"])["value"].mean().agg(["min", "max"])
    assert len(clims) == 1
    low, high = next(iter(clims))
    assert low <= lo and hi <= high and (low, high) == pytest.approx((0.0, 1.0))  # nice ends around the data
    cbar = next(ax for ax in fig.axes if ax.get_label() == "<colorbar>")
    labels = [t.get_text() for t in cbar.get_yticklabels()]
    assert labels == ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]  # every tick a round number, both ends labelled
    # 5 panels -> 2 rows of at most 3 (no 5-wide strip)
    xs = sorted({round(ax.get_position().x0, 3) for ax in panels})
    ys = sorted({round(ax.get_position().y0, 3) for ax in panels})
    assert len(xs) == 3 and len(ys) == 2
    assert fig.get_figwidth() < 14


def test_head_grid_separate_figures_share_a_given_scale():
    df = _five_checkpoints()
    lo, hi = head_range(df, "anchor_mass")
    a = head_grid(df, "anchor_mass", "base", vmin=lo, vmax=hi).axes[0].collections[0].get_clim()
    b = head_grid(df, "anchor_mass", "prompt:n=10", vmin=lo, vmax=hi).axes[0].collections[0].get_clim()
    assert a == b == pytest.approx((lo, hi))


def test_attention_maps_wrap_share_scale_and_bracket_soft_prompt():
    maps = {
        name: synth.attention_maps(i, guidance=g, n_guidance=n)
        for i, (name, g, n) in enumerate(
            [("base", "", 0), ("capsule", "capsule", 1), ("prompt", "soft_prompt", 100), ("instance", "instance", 1)]
        )
    }
    fig = attention_map_figure(maps, layer="mean", head="mean")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 4
    assert len({ax.images[0].norm.vmax for ax in panels}) == 1 and len({ax.images[0].norm.vmin for ax in panels}) == 1
    assert len({round(ax.get_position().y0, 3) for ax in panels}) == 2  # 3 + 1
    prompt = panels[2]
    xlabels = [t.get_text() for t in prompt.get_xticklabels()]
    assert sum("soft_prompt" in t for t in xlabels) == 1 and "<soft_prompt> ×100" in xlabels
    ylabels = [t.get_text() for t in prompt.get_yticklabels()]
    assert sum("soft_prompt" in t for t in ylabels) == 1
    assert len([ln for ln in prompt.lines if ln.get_gid() == "bracket:x"]) == 1
    # masked (causal) cells are drawn hatched, not as the scale's 0 colour
    assert any(p.get_gid() == "masked" and p.get_hatch() for p in prompt.patches)
    assert np.ma.is_masked(prompt.images[0].get_array())


def test_tick_plan_keeps_input_tokens_readable():
    roles, toks = synth.sequence("soft_prompt", n_guidance=33)
    ticks, labels, brackets, _ = tick_plan(toks, roles, max_labels=60)
    assert brackets == [(1, 33)] and labels.count("<soft_prompt> ×33") == 1
    assert sum("soft_prompt" in t for t in labels) == 1
    assert "Premise" in labels and "Answer" in labels


def test_anchor_tokens_name_position_zero():
    maps = {"base": synth.attention_maps(0, guidance=""), "capsule": synth.attention_maps(1, guidance="capsule")}
    assert anchor_tokens(maps) == {"base": "<s>", "capsule": "<capsule>"}


def test_role_flow_absent_roles_blank_and_wraps_in_given_order():
    flow = synth.role_flow()
    flow = pd.concat([flow.assign(checkpoint=flow["checkpoint"] + s) for s in ("", "-2")], ignore_index=True)
    order = ["capt-2", "prompt_tuning", "capt", "prompt_tuning-2"]
    fig = role_flow_heatmaps(flow, checkpoints=order)
    panels = _panels(fig)
    assert [ax.get_title() for ax in panels] == order
    assert len({round(ax.get_position().y0, 3) for ax in panels}) == 2
    for ax in panels:
        texts = [t.get_text() for t in ax.texts]
        assert "0.00" not in texts  # synthetic flows are never exactly 0: a 0.00 would be an absent role
        data = ax.collections[0].get_array()
        assert np.ma.count_masked(data) > 0  # the other guidance role's column is blank (NaN)
    table = pd.DataFrame(panels[1].collections[0].get_array().reshape(2, -1))
    assert table.notna().to_numpy().sum() == 2 * 4


def test_layer_curves_order_legend_and_anchor_label():
    df = synth.tidy()
    df = pd.concat([df[df.checkpoint == "prompt_tuning"], df[df.checkpoint == "capt"]])  # frame order
    fig = layer_curves(df, "anchor_mass", anchors={"prompt_tuning": "<soft_prompt>", "capt": "<capsule>"})
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["prompt_tuning (anchor: <soft_prompt>)", "capt (anchor: <capsule>)"]
    assert "position 0" in fig.axes[0].get_ylabel()
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legend_box, title_box = fig.legends[0].get_window_extent(r), fig._suptitle.get_window_extent(r)
    assert not legend_box.overlaps(title_box)
    assert not legend_box.overlaps(fig.axes[0].get_window_extent(r))
    lines = fig.axes[0].get_lines()
    assert lines[0].get_color() != lines[1].get_color() and lines[0].get_marker() != lines[1].get_marker()
    assert fig.legends[0].get_title().get_text() == "checkpoint"


def test_summarize_is_the_project_bootstrap_not_a_t_interval():
    df = synth.tidy()
    part = df[(df.metric == "entropy") & df["head"].isna() & (df.checkpoint == "capt") & (df.layer == 1)]
    s = summarize(part, ["checkpoint", "layer"])
    mean, lo, hi = stats.bootstrap_ci(part.sort_values("example")["value"].to_numpy())
    assert s[["mean", "ci_lo", "ci_hi"]].iloc[0].tolist() == pytest.approx([mean, lo, hi])


def test_sweep_curve_integer_ticks_markers_ci_and_log_lengths():
    k = pd.DataFrame(
        {
            "k": [0, 1, 2, 4] * 2,
            "position": ["first"] * 4 + ["last"] * 4,
            "accuracy": [0.5] * 8,
            "ci_lo": [0.4] * 8,
            "ci_hi": [0.6] * 8,
            "anchor_mass": [np.nan, 0.2, 0.3, 0.4] * 2,
        }
    )
    fig = sweep_curve(k, "k", by="position", title="instance sweep: accuracy (95% CI)")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [0, 1, 2, 4]
    assert ax.get_xlabel() == "instance tokens (k)" and "_" not in ax.get_xlabel()
    assert "95% CI" in fig.get_suptitle() and len(ax.containers) == 2  # error bars drawn for both lines
    data_lines = [c.lines[0] for c in ax.containers]
    assert not np.allclose(data_lines[0].get_xdata(), data_lines[1].get_xdata())  # identical lines both visible
    assert data_lines[0].get_marker() != data_lines[1].get_marker()
    mass = sweep_curve(k, "k", "anchor_mass", lo=None, hi=None, by="position", title="anchor mass (95% CI)")
    assert "95% CI" not in mass.get_suptitle()  # no intervals drawn -> no claim
    assert all(len(c.lines[0].get_xdata()) == 3 for c in mass.axes[0].containers)  # k = 0 (NaN) not drawn
    lengths = pd.DataFrame({"length": [1, 5, 20, 100], "accuracy": [0.5, 0.55, 0.6, 0.62]})
    ax = sweep_curve(lengths, "length").axes[0]
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [1, 5, 20, 100]
    assert ax.get_xlabel() == "soft-prompt length (tokens)"
