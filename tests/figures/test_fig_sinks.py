"""The sink-battery and massive-activation figures, saved and read back against the rows they draw."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from anchorlens.analyses import FirstTokenReducer, RoleFlowReducer, ValueMassReducer, concat_frames
from anchorlens.analyses.massive import MassiveActivationsReducer
from anchorlens.analyses.sink_battery import SinkBatteryReducer
from anchorlens.capture.collect import stream_statistics
from anchorlens.figures import (
    massive_activations_figure,
    role_palette,
    sink_alpha_grid,
    sink_rate_curves,
    sink_top_roles,
    value_mass_curves,
)
from anchorlens.figures.sinks import ALPHA_LABEL, MASSIVE_LABEL, RATE_LABEL, TOP_ROLE_LABEL, VALUE_LABEL
from anchorlens.tasks import bundled_examples, get_task

from .runs import (
    assert_integer_ticks,
    assert_nice_ticks,
    colorbar_label,
    colorbar_ticks,
    colorbars,
    panels,
    saved_texts,
    texts,
)

EPS = (0.05, 0.3)


@pytest.fixture(scope="module")
def frame(tiny_base) -> pd.DataFrame:
    base = tiny_base("tiny-llama")
    task = get_task("rte")
    batch = base.encode([task.template.render(ex) for ex in bundled_examples("rte")[:4]])
    reducers = [
        SinkBatteryReducer(eps=EPS),
        MassiveActivationsReducer(abs_threshold=1.0, ratio=5.0),
        FirstTokenReducer(),
        RoleFlowReducer(),
        ValueMassReducer(),
    ]
    stream_statistics(base, [batch], reducers)
    return concat_frames(r.frame() for r in reducers)


def test_alpha_grid_reads_back_heads_layers_and_the_measure(frame, tmp_path):
    fig = sink_alpha_grid(frame)
    (ax,) = panels(fig)
    assert_integer_ticks(texts(ax.get_xticklabels()))
    assert_integer_ticks(texts(ax.get_yticklabels()))
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    (cbar,) = colorbars(fig)
    assert colorbar_label(cbar) == ALPHA_LABEL
    assert_nice_ticks(colorbar_ticks(cbar))
    rows = frame[frame["metric"] == "sink_alpha_first"]
    cell = rows[(rows["layer"] == 0) & (rows["head"] == 0)]["value"].mean()
    assert f"{cell:.2f}" in [t.get_text() for t in ax.texts]
    found = saved_texts(fig, tmp_path / "alpha.svg")
    assert any(ALPHA_LABEL in t for t in found)


def test_rate_curves_read_back_every_eps_and_the_overall_rate(frame, tmp_path):
    fig = sink_rate_curves(frame)
    (ax,) = panels(fig)
    assert_integer_ticks(texts(ax.get_xticklabels()))
    assert ax.get_ylabel() == RATE_LABEL
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    for eps in EPS:
        overall = frame[frame["metric"] == f"sink_head@{eps:g}"]["value"].mean()
        assert f"ε = {eps:g}, first key (overall {overall:.2f})" in legend
    line = next(li for li in ax.get_lines() if li.get_gid() and li.get_gid().startswith("ε = 0.05, first"))
    rows = frame[frame["metric"] == "sink_head@0.05"]
    assert np.allclose(line.get_ydata(), rows.groupby("layer")["value"].mean().to_numpy())
    found = saved_texts(fig, tmp_path / "rate.svg")
    assert any(RATE_LABEL in t for t in found)


def test_top_roles_use_the_role_colours_and_sum_to_one(frame):
    fig = sink_top_roles(frame)
    (ax,) = panels(fig)
    assert_integer_ticks(texts(ax.get_xticklabels()))
    assert ax.get_ylabel() == TOP_ROLE_LABEL
    roles = sorted({p.get_gid().removeprefix("role:") for p in ax.patches})
    palette = role_palette(roles)
    for p in ax.patches:
        assert p.get_facecolor() == to_rgba(palette[p.get_gid().removeprefix("role:")])
    tops: dict[float, float] = {}
    for p in ax.patches:
        tops[p.get_x()] = tops.get(p.get_x(), 0.0) + p.get_height()
    assert list(tops.values()) == pytest.approx([1.0] * len(tops))
    assert set(roles) == set(frame[frame["metric"] == "sink_alpha_top1"]["key_role"])


def test_massive_figure_reads_back_peaks_thresholds_and_roles(frame, tmp_path):
    fig = massive_activations_figure(frame, abs_threshold=1.0, ratio=5.0)
    (ax,) = panels(fig)
    assert_integer_ticks(texts(ax.get_xticklabels()))
    assert ax.get_ylabel() == MASSIVE_LABEL and ax.get_yscale() == "log"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "|h| = 1" in legend and "5 × median |h|" in legend
    peaks = frame[frame["metric"] == "massive_top1"].groupby("layer")["value"].mean()
    points = [c.get_offsets()[0][1] for c in ax.collections]
    assert np.allclose(points, peaks.to_numpy())
    found = saved_texts(fig, tmp_path / "massive.svg")
    assert any(MASSIVE_LABEL in t for t in found)


@pytest.mark.parametrize("key_role", ["first_token", "structural"])
def test_value_mass_curves_read_back_weight_and_norm(frame, tmp_path, key_role):
    fig = value_mass_curves(frame, key_role=key_role)
    (ax,) = panels(fig)
    assert_integer_ticks(texts(ax.get_xticklabels()))
    assert ax.get_ylabel() == f"all queries → {key_role}: {VALUE_LABEL}"
    lines = {li.get_gid(): li for li in ax.get_lines()}
    rows = frame[(frame["query_role"] == "all") & frame["head"].notna()]
    norm = rows[(rows["metric"] == "norm_share") & (rows["key_role"] == key_role)]
    assert np.allclose(lines["by norm ||A v W_O||"].get_ydata(), norm.groupby("layer")["value"].mean().to_numpy())
    weight = (
        rows[rows["metric"] == "first_token_mass"]
        if key_role == "first_token"
        else rows[(rows["metric"] == "role_flow") & (rows["key_role"] == key_role)]
    )
    assert np.allclose(lines["by weight"].get_ydata(), weight.groupby("layer")["value"].mean().to_numpy())
    if key_role != "first_token":
        assert to_rgba(lines["by weight"].get_color()) == to_rgba(role_palette([key_role])[key_role])
    found = saved_texts(fig, tmp_path / "value.svg")
    assert any(VALUE_LABEL in t for t in found)
