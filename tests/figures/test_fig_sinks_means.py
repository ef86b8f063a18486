"""The sinks figures drawn from compare's bounded means (each cell's mean over examples and its rows ``n``) equal
the figures drawn from the per-example rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses import FirstTokenReducer, RoleFlowReducer, ValueMassReducer, concat_frames
from anchorlens.analyses.massive import MassiveActivationsReducer
from anchorlens.analyses.sink_battery import SinkBatteryReducer
from anchorlens.analyses.spill import CellMeans
from anchorlens.capture.collect import stream_statistics
from anchorlens.figures import (
    massive_activations_figure,
    sink_alpha_grid,
    sink_rate_curves,
    sink_top_roles,
    value_mass_curves,
)
from anchorlens.tasks import bundled_examples, get_task
from anchorlens.workflows.compare_summaries import CELL


@pytest.fixture(scope="module")
def frames(tiny_base) -> tuple[pd.DataFrame, pd.DataFrame]:
    base = tiny_base("tiny-llama")
    task = get_task("rte")
    texts = [task.template.render(ex) for ex in bundled_examples("rte")[:6]]
    reducers = [
        SinkBatteryReducer(eps=(0.05, 0.3)),
        MassiveActivationsReducer(abs_threshold=1.0, ratio=5.0),
        FirstTokenReducer(),
        RoleFlowReducer(),
        ValueMassReducer(),
    ]
    stream_statistics(base, [base.encode(texts)], reducers)
    rows = concat_frames(r.frame() for r in reducers).assign(checkpoint="m")
    means = CellMeans(CELL)
    for _, chunk in rows.groupby(rows["example"] % 2):  # two chunks, as compare folds them
        means.add(chunk)
    return rows, means.frame().assign(checkpoint="m")


def _lines(fig) -> list[np.ndarray]:
    return [np.asarray(line.get_ydata(), float) for ax in fig.axes for line in ax.get_lines()]


@pytest.mark.parametrize(
    "draw",
    [
        sink_rate_curves,
        lambda f, checkpoint: massive_activations_figure(f, abs_threshold=1.0, ratio=5.0, checkpoint=checkpoint),
        lambda f, checkpoint: value_mass_curves(f, key_role="first_token", checkpoint=checkpoint),
        lambda f, checkpoint: value_mass_curves(f, key_role="structural", checkpoint=checkpoint),
    ],
)
def test_curves_from_means_equal_curves_from_rows(frames, draw):
    rows, means = frames
    a, b = _lines(draw(rows, checkpoint="m")), _lines(draw(means, checkpoint="m"))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)


def test_alpha_grid_and_top_roles_from_means_equal_those_from_rows(frames):
    rows, means = frames
    grid_a = sink_alpha_grid(rows, checkpoint="m").axes[0].collections[0].get_array()
    grid_b = sink_alpha_grid(means, checkpoint="m").axes[0].collections[0].get_array()
    np.testing.assert_allclose(np.asarray(grid_a, float), np.asarray(grid_b, float), rtol=1e-9)
    bars = lambda fig: sorted((p.get_x(), p.get_y(), p.get_height()) for p in fig.axes[0].patches)  # noqa: E731
    np.testing.assert_allclose(bars(sink_top_roles(rows, checkpoint="m")), bars(sink_top_roles(means, checkpoint="m")))
