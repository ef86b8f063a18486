"""The StreamingLLM-style figure read back: panels per checkpoint x layer, values, n/a cells, colour bar, sizes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from matplotlib.text import Text
from PIL import Image

from anchorlens.analyses.mean_maps import MeanMaps
from anchorlens.figures import figure_size, save_figure
from anchorlens.figures.streaming import streaming_maps_figure
from anchorlens.roles.kinds import ROLE_NAMES, Role

from .runs import colorbar_label, colorbars, panels, saved_texts

LAYERS = [0, 3, 7]


def _maps(guidance: int, n: int, seed: int) -> MeanMaps:
    """Mean maps of ``n`` examples of lengths 6..6+n-1 (+ ``guidance`` instance positions first): causal, random."""
    rng = np.random.default_rng(seed)
    longest = guidance + 6 + n - 1
    sums = torch.zeros(len(LAYERS), longest, longest, dtype=torch.float64)
    counts = torch.zeros_like(sums, dtype=torch.long)
    q_examples = torch.zeros(longest, dtype=torch.long)
    roles = torch.zeros(longest, len(ROLE_NAMES), dtype=torch.long)
    for e in range(n):
        t = guidance + 6 + e
        sees = torch.tril(torch.ones(t, t, dtype=torch.long))
        a = torch.from_numpy(rng.dirichlet(np.ones(t), size=(len(LAYERS), t))) * sees
        a = a / a.sum(-1, keepdim=True)
        sums[:, :t, :t] += a
        counts[:, :t, :t] += sees
        q_examples[:t] += 1
        roles[:guidance, int(Role.INSTANCE)] += 1
        roles[guidance:t, int(Role.CONTENT)] += 1
    return MeanMaps(
        "decoder", list(LAYERS), heads=3, sums=sums, counts=counts, q_examples=q_examples, k_examples=q_examples.clone(),
        q_roles=roles, k_roles=roles.clone(), example_ids=list(range(n)), sink_positions=Counter({guidance: n}),
        sink_tokens=Counter({"pre": n}),
    )  # fmt: skip


@pytest.fixture
def maps() -> dict[str, MeanMaps]:
    return {"base": _maps(0, 4, 0), "instance": _maps(1, 4, 1)}


def test_panels_show_each_checkpoints_mean_with_masked_cells_na(maps, tmp_path):
    fig = streaming_maps_figure(maps)
    axes = panels(fig)
    assert len(axes) == 6  # 2 checkpoints x 3 layers, row-major
    assert [ax.get_title() for ax in axes[:3]] == ["layer 0", "layer 3", "layer 7"]
    assert [ax.get_title() for ax in axes[3:]] == ["", "", ""]
    assert [ax.get_ylabel() for ax in axes[::3]] == ["base\nquery position", "instance\nquery position"]
    assert all(ax.get_xlabel() == "key position" for ax in axes[3:])
    for ax, (name, layer) in zip(axes, [(c, la) for c in maps for la in LAYERS]):
        shown = ax.images[0].get_array()
        m = maps[name]
        expected = m.mean()[m.layers.index(layer)]
        assert np.array_equal(np.ma.getmaskarray(shown), m.counts[m.layers.index(layer)].numpy() == 0)
        assert np.ma.getmaskarray(shown)[np.triu_indices(shown.shape[0], k=1)].all()  # the causal triangle: n/a
        np.testing.assert_allclose(shown.filled(np.nan), expected, rtol=0, atol=1e-12, equal_nan=True)
        assert [p.get_gid() for p in ax.patches] == ["n/a"] and ax.patches[0].get_hatch()  # hatched, not a colour
        sink = [line for line in ax.lines if line.get_gid() == "sink"]
        assert len(sink) == 1 and sink[0].get_xdata()[0] == m.sink_position
        fewer = [line for line in ax.lines if line.get_gid() == "fewer"]
        assert len(fewer) == 1 and fewer[0].get_ydata()[0] == m.complete_queries - 0.5
    assert [line.get_xdata()[0] for line in axes[3].lines if line.get_gid() == "guidance:instance"] == [0]
    assert not [line for line in axes[0].lines if str(line.get_gid()).startswith("guidance")]
    (cbar,) = colorbars(fig)
    label = colorbar_label(cbar)
    assert label == "query → key attention (probability), sqrt scale,\nmean over 3 heads and 4 examples"
    texts = saved_texts(fig, tmp_path / "streaming.svg")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "sink: first input token 'pre'",
        "instance (inserted guidance)",
        "n/a: masked",
        "below: fewer examples (shorter inputs)",
    ]
    for text in [*legend, "layer 7", "instance", "mean over 3 heads and 4 examples", "key position"]:
        assert any(text in t for t in texts), text


def test_colour_scale_is_shared_and_ends_on_a_nice_number(maps):
    fig = streaming_maps_figure(maps, scale="linear")
    norms = {(im.norm.vmin, im.norm.vmax) for ax in panels(fig) for im in ax.images}
    top = max(float(np.nanmax(m.mean())) for m in maps.values())
    assert len(norms) == 1
    ((lo, hi),) = norms
    assert lo == 0 and top <= hi <= 1.0 and round(hi * 10) == hi * 10
    assert colorbar_label(colorbars(fig)[0]).startswith("query → key attention (probability),\nmean over")


def test_column_preset_is_narrow_with_legible_text(maps, tmp_path):
    with figure_size("column"):
        fig = streaming_maps_figure(maps)
    assert fig.get_figwidth() <= 5.5
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert sizes and min(sizes) >= 6.0
    (png,) = save_figure(fig, tmp_path / "f", formats=("png",), dpi=100)
    with Image.open(png) as image:
        assert image.size[0] / 100 <= 5.5 + 0.01  # as saved (tight bounding box)


def test_layers_and_empty_inputs_are_checked(maps):
    with pytest.raises(ValueError, match="layer 5 was not averaged"):
        streaming_maps_figure(maps, layers=[5])
    assert [ax.get_title() for ax in panels(streaming_maps_figure(maps, layers=[7]))] == ["layer 7", ""]
    with pytest.raises(ValueError, match="no example"):
        streaming_maps_figure({"base": MeanMaps("decoder", [0])})
