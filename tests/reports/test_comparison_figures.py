"""Every figure of a real comparison (tiny base, captured, not synthetic) passes the reviewer's read-back."""

from __future__ import annotations

import pytest

from anchorlens.reports.comparison import comparison_figures
from anchorlens.workflows.compare import compare
from tests.figures.runs import (
    assert_integer_ticks,
    assert_nice_ticks,
    colorbar_label,
    colorbar_ticks,
    colorbars,
    panels,
    texts,
)

UNITS = ("(attention mass)", "(probability)", "(normalized entropy, 0–1)")


@pytest.fixture(scope="module")
def figures():
    result = compare(["base", "instance"], base="tiny-llama", n=3, n_boot=200)
    return result, {stem: fig for stem, _, fig in comparison_figures(result)}


def test_every_colour_bar_names_a_measure_and_unit_with_nice_ticks(figures):
    _, figs = figures
    assert set(figs) == {
        "attention_maps",
        "streaming_maps",
        "layer_curves",
        "heads_sink",
        "heads_diff_instance",
        "role_flow",
    }
    for stem, fig in figs.items():
        fig.canvas.draw()
        for cbar in colorbars(fig):
            label = colorbar_label(cbar)
            assert any(u in label for u in UNITS) and "decomposition" not in label, (stem, label)
            assert_nice_ticks(colorbar_ticks(cbar))


def test_layer_and_head_ticks_are_integers(figures):
    _, figs = figures
    for stem in ("heads_sink", "heads_diff_instance"):
        for ax in panels(figs[stem]):
            assert_integer_ticks(texts(ax.get_xticklabels()))
            assert_integer_ticks(texts(ax.get_yticklabels()))
    curves = figs["layer_curves"]
    curves.canvas.draw()
    assert_integer_ticks(texts(panels(curves)[-1].get_xticklabels()))
    assert [ax.get_ylabel().split("\n")[0] for ax in panels(curves)] == [
        "input → sink (attention mass)",
        "input → guidance (attention mass)",
        "input → structural (sink excluded) (attention mass)",
        "entropy of input queries (normalized entropy, 0–1)",
    ]


def test_role_flow_draws_only_the_roles_the_run_has(figures):
    result, figs = figures
    flow = result.metrics[(result.metrics.metric == "role_flow") & (result.metrics.query_role != "all")]
    queries = set(flow.query_role)  # every position is a query: these are the roles the inputs have
    ax = panels(figs["role_flow"])[-1]
    drawn = texts(ax.get_xticklabels())
    assert set(drawn) == queries and "capsule" not in drawn and "soft_prompt" not in drawn
    base = panels(figs["role_flow"])[0]
    assert sum(t.get_text() == "n/a" for t in base.texts) > 0  # the base has no instance token: n/a, not 0.00
