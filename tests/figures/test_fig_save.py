"""Saving figures and PNG bytes."""

from __future__ import annotations

import pytest

from anchorlens.figures import figure_to_png_bytes, layer_curves, save_figure

from . import synth


def test_save_png_pdf_svg_and_refuse_overwrite(tmp_path):
    fig = layer_curves(synth.tidy(), "anchor_mass")
    paths = save_figure(fig, tmp_path / "sub" / "curves", dpi=60)
    assert [p.name for p in paths] == ["curves.png", "curves.pdf", "curves.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[1].read_bytes()[:4] == b"%PDF"
    svg = paths[2].read_text()
    assert "<svg" in svg and "<text" in svg and "layer" in svg  # text kept as text (svg.fonttype none)
    with pytest.raises(FileExistsError):
        save_figure(fig, tmp_path / "sub" / "curves", dpi=60)
    assert save_figure(fig, tmp_path / "sub" / "curves.png", formats=("png",), dpi=60, overwrite=True) == [paths[0]]


def test_png_bytes():
    data = figure_to_png_bytes(layer_curves(synth.tidy(), "anchor_mass"), dpi=50)
    assert data.startswith(b"\x89PNG")


def test_no_pyplot_figures_left_open():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    layer_curves(synth.tidy(), "anchor_mass")
    assert plt.get_fignums() == before
