"""Figures for a paper, as a reader of the printed page sees them: built at ``figure_size("column")`` / ``"page"``,
saved, and read back: width of the saved file, the smallest text, the PDF's font types, the texts against the
frame they draw (hatched n/a cells, the sink named, n/a series left out), checkpoint colours."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image

from anchorlens.errors import UsageError
from anchorlens.figures import (
    FIGURE_SIZES,
    attention_budget,
    attention_map_figure,
    current_figure_size,
    evidence_curves,
    figure_size,
    head_diff_grid,
    head_grid,
    head_grids,
    layer_curves,
    position_sweep,
    role_flow_heatmaps,
    save_figure,
    sweep_curve,
)
from anchorlens.figures._roles import BUILTIN_COLORS, FALLBACK_COLORS, POOLED_COLORS
from anchorlens.figures._style import CHECKPOINT_COLORS, series_colors
from anchorlens.figures.roleflow import NA_TEXT

from . import synth
from .runs import panels, run_frame, saved_texts

FLOOR = 6.0  # pt: the smallest text a printed figure may have


def _visible_texts(fig: Figure) -> list[Text]:
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def check_print(fig: Figure, tmp_path, name: str, width: float = 5.5) -> list[str]:
    """Save ``fig`` as PNG, PDF and SVG; assert the saved width, the smallest text and TrueType fonts; the SVG texts."""
    paths = save_figure(fig, tmp_path / name)
    assert [p.suffix for p in paths] == [".png", ".pdf", ".svg"]
    image = Image.open(paths[0])
    dpi = image.info["dpi"][0]
    assert round(dpi) == 300  # print presets save at 300 dpi
    assert image.size[0] <= round(width * dpi) + 1, (name, image.size[0] / dpi)
    assert fig.get_figwidth() <= width + 1e-6
    small = min(float(t.get_fontsize()) for t in _visible_texts(fig))
    assert small >= FLOOR - 1e-9, (name, small)
    if shutil.which("pdffonts"):
        listing = subprocess.run(["pdffonts", str(paths[1])], capture_output=True, text=True, check=True).stdout
        assert "Type 3" not in listing and ("TrueType" in listing or "CID" in listing), listing
    return saved_texts(fig, tmp_path / f"{name}_read.svg")


def test_figure_size_api():
    assert set(FIGURE_SIZES) == {"screen", "column", "page"} and current_figure_size() == "screen"
    assert FIGURE_SIZES["column"].max_width == 5.5 and FIGURE_SIZES["page"].max_width == 7.0
    with figure_size("column") as preset:
        assert preset.name == current_figure_size() == "column"
        with figure_size("page"):
            assert current_figure_size() == "page"
        assert current_figure_size() == "column"
    with pytest.raises(UsageError, match="screen, column, page"):
        with figure_size("poster"):
            pass
    with pytest.raises(RuntimeError):
        with figure_size("page"):
            raise RuntimeError
    assert current_figure_size() == "screen"


def test_checkpoint_colours_are_not_role_colours_and_follow_the_order():
    roles = {c.lower() for c in [*BUILTIN_COLORS.values(), *FALLBACK_COLORS, *POOLED_COLORS.values()]}
    assert not roles & {c.lower() for c in CHECKPOINT_COLORS}
    a = series_colors(["base", "instance", "knockout"])
    assert a["instance"] == series_colors(["base", "instance"])["instance"] == CHECKPOINT_COLORS[1]


def _curves_frame() -> pd.DataFrame:
    df = run_frame(("base", "instance"))
    part = df[(df.metric == "decomposition") & df.key_role.isin(["sink", "guidance", "structural"])]
    return part.assign(metric=part["key_role"].map(lambda k: f"input → {k}"))


LONG = "instance+knockout:keys=instance,layers=0-4,mode=renorm"


@pytest.mark.parametrize("size,width", [("column", 5.5), ("page", 7.0)])
def test_layer_curves_print(tmp_path, size, width):
    df = _curves_frame()
    df = pd.concat([df, df[df.checkpoint == "instance"].assign(checkpoint=LONG)], ignore_index=True)
    present = {"base": {"content", "structural"}, "instance": {"instance", "content"}, LONG: {"instance", "content"}}
    metrics = ["input → sink", "input → guidance", "input → structural"]
    with figure_size(size):
        fig = layer_curves(
            df,
            metrics,
            order=["base", "instance", LONG],
            sinks={"base": "pre"},
            present=present,
            labels={m: f"{m} (attention mass)" for m in metrics},
        )
    shown = check_print(fig, tmp_path, f"curves_{size}", width)
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == metrics
    guidance = axes[1]
    # the base has no guidance: no line of it (never a 0 line), and the caption says so
    assert [ln.get_label() for ln in guidance.get_lines()] == ["instance", LONG]
    assert "n/a: no guidance (base, not drawn)" in fig.get_suptitle()
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["base (sink: pre)", "instance", LONG]
    assert "base (sink: pre)" in shown and not any("anchor: pre" in t for t in shown)
    # the panels keep their height, the legend is below them, never over a title
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    for ax in axes:
        assert ax.get_window_extent(renderer).height / fig.dpi >= 0.9
        assert not box.overlaps(ax.title.get_window_extent(renderer)) and not box.overlaps(ax.get_window_extent())
    ylabels = [ax.yaxis.label.get_window_extent(renderer) for ax in axes]
    assert not any(a.overlaps(b) for i, a in enumerate(ylabels) for b in ylabels[i + 1 :])
    # every drawn point is the frame's mean over examples
    line = axes[0].get_lines()[0]
    expect = df[(df.metric == "input → sink") & (df.checkpoint == "base") & df["head"].isna()]
    np.testing.assert_allclose(line.get_ydata(), expect.groupby("layer")["value"].mean().to_numpy())
    # checkpoint colours by order, the same in any figure
    assert to_hex(line.get_color()) == CHECKPOINT_COLORS[0]


def _flow_with_fixed() -> pd.DataFrame:
    """Role flow in which instance → instance is fixed by the mask (NaN, flagged) and one query row is empty."""
    df = run_frame(("base", "instance"))
    flow = df[(df.metric == "role_flow") & df["head"].isna()].copy()
    flow["fixed"] = ""
    cell = (flow.checkpoint == "instance") & (flow.query_role == "instance") & (flow.key_role == "instance")
    flow.loc[cell, "fixed"] = "fixed by the causal mask"
    flow.loc[cell, "value"] = np.nan
    return flow


def test_role_flow_print_hatches_fixed_cells(tmp_path):
    flow = _flow_with_fixed()
    with figure_size("column"):
        fig = role_flow_heatmaps(flow, checkpoints=["base", "instance"])
    shown = check_print(fig, tmp_path, "flow")
    base, inst = panels(fig)
    rows = [t.get_text() for t in base.get_yticklabels()]
    cols = [t.get_text() for t in inst.get_xticklabels()]
    r, c = rows.index("instance"), cols.index("instance")
    # the fixed cell: hatched patch and "n/a", never a colour of the scale
    hatched = [p for p in inst.patches if p.get_gid() == "n/a" and p.get_hatch()]
    assert any(p.get_xy() == (c, r) for p in hatched)
    mesh = inst.collections[0].get_array()
    assert np.ma.is_masked(mesh.reshape(len(rows), len(cols))[r, c])
    na = [t for t in inst.texts if t.get_text() == NA_TEXT]
    assert any(t.get_position() == (c + 0.5, r + 0.5) for t in na)
    assert "instance → instance" in fig.get_suptitle() and "fixed by the causal mask" in fig.get_suptitle()
    # drawn numbers are the frame's means
    cells = {(t.get_position()[1] - 0.5, t.get_position()[0] - 0.5): t.get_text() for t in inst.texts}
    expect = flow[flow.checkpoint == "instance"].groupby(["query_role", "key_role"])["value"].mean()
    k = cols.index("content")
    assert cells[(rows.index("content"), k)] == f"{expect[('content', 'content')]:.2f}"
    assert NA_TEXT in shown


@pytest.mark.parametrize("n_content", [20, 200])
def test_attention_map_labels_legible_at_column(tmp_path, n_content):
    maps = {
        name: synth.attention_maps(3, guidance=g, premise=n_content // 2, hypothesis=n_content // 2)
        for name, g in (("base", ""), ("instance", "instance"), ("prompt", "soft_prompt"))
    }
    with figure_size("column"):
        fig = attention_map_figure(maps, layer="mean", head="mean")
    check_print(fig, tmp_path, f"maps_{n_content}")
    renderer = fig.canvas.get_renderer()
    for ax in panels(fig):
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
            assert boxes and all(t.get_fontsize() >= FLOOR for t in labels)
            assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), "token labels overlap"


def _evidence_table() -> pd.DataFrame:
    rng = np.random.default_rng(4)
    rows = []
    for ck in ("base", "instance"):
        for layer in [None, 0, 1, 2]:
            for measure, key in (("weight", "sink"), ("norm", "sink"), ("sink_rate@0.3", "")):
                mean = float(rng.uniform(0.2, 0.7))
                rows.append((ck, "decoder", layer, measure, key, mean, mean - 0.05, mean + 0.04, 8))
    table = pd.DataFrame(
        rows, columns=["checkpoint", "stack", "layer", "measure", "key", "mean", "ci_lo", "ci_hi", "n"]
    )
    return table.astype({"layer": "Int64"})


def test_evidence_curves_draw_the_table(tmp_path):
    table = _evidence_table()
    with figure_size("column"):
        fig = evidence_curves(table, ["weight", "norm"], key="sink", checkpoints=["base", "instance"])
    check_print(fig, tmp_path, "evidence")
    weight, norm = panels(fig)
    assert "weight" in weight.get_title() and "norm" in norm.get_title()
    for ax, measure in ((weight, "weight"), (norm, "norm")):
        for i, ck in enumerate(["base", "instance"]):
            (line,) = [ln for ln in ax.get_lines() if ln.get_label() == ck]
            rows = table[(table.checkpoint == ck) & (table.measure == measure) & table.layer.notna()]
            np.testing.assert_allclose(line.get_ydata(), rows.sort_values("layer")["mean"].to_numpy())
            assert to_hex(line.get_color()) == CHECKPOINT_COLORS[i]
        bands = ax.collections
        assert len(bands) == 2  # one 95% interval per checkpoint
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["base", "instance"]
    assert "95%" in fig.get_suptitle() and "n = 8" in fig.get_suptitle()


CASES: dict[str, Callable[[], Figure]] = {
    "head_grid": lambda: head_grid(synth.tidy(layers=30, heads=9), "anchor_mass", "capt"),
    "head_grids": lambda: head_grids(
        run_frame(("base", "instance", "prompt"), layers=30, heads=9),
        "decomposition",
        query_role="input",
        key_role="sink",
    ),
    "head_diff_grid": lambda: head_diff_grid(synth.compare(layers=30, heads=9), "anchor_mass", checkpoint="capt"),
    "budget": lambda: attention_budget(run_frame(("base", "instance", "prompt"))),
    "positions": lambda: position_sweep(synth.sweep()[0], "anchor_mass", synth.sweep()[1]),
    "sweep": lambda: sweep_curve(
        pd.DataFrame({"length": [1, 2, 4, 8], "accuracy": [0.5, 0.6, 0.7, 0.72], "ci_lo": 0.4, "ci_hi": 0.8}),
        "length",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_figure_fits_a_column(tmp_path, name):
    with figure_size("column"):
        fig = CASES[name]()
    shown = check_print(fig, tmp_path, name)
    assert shown


def test_screen_size_is_todays_look():
    fig = layer_curves(synth.summary(synth.tidy()), "anchor_mass")
    assert fig.get_figwidth() == pytest.approx(4.2 + 1.8)
