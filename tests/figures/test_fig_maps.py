"""Attention-map figures and aligned averaging."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from anchorlens.capture.maps import AttentionMaps
from anchorlens.figures import AveragedStackMaps, attention_map_figure, average_maps_aligned, clean_token
from anchorlens.figures._style import ROLE_COLORS, pick_ticks

from . import synth


def _flat(text: str) -> str:
    return " ".join(text.split())


def _panels(fig: Figure):
    return [ax for ax in fig.axes if ax.get_images()]


def _guidance(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle) and str(p.get_gid()).startswith("guidance:")]


def test_two_checkpoints_side_by_side_with_outlines_and_shared_scale():
    pt = synth.attention_maps(3, guidance="soft_prompt", n_guidance=4)
    cp = synth.attention_maps(3, guidance="capsule")
    fig = attention_map_figure({"prompt_tuning": pt, "capt": cp}, title="PT vs CaPT")
    assert isinstance(fig, Figure)
    panels = _panels(fig)
    assert len(panels) == 2 and len(fig.axes) == 3  # two maps + one shared colour bar
    assert [ax.get_title() for ax in panels] == ["prompt_tuning", "capt"]
    for ax in panels:
        assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel()
    assert panels[0].get_images()[0].get_clim() == panels[1].get_images()[0].get_clim()
    (pt_box,) = _guidance(panels[0])
    assert (pt_box.get_x(), pt_box.get_width()) == (0.5, 4)  # keys 1..4 after <s>
    assert pt_box.get_gid() == "guidance:soft_prompt"
    (cp_box,) = _guidance(panels[1])
    assert (cp_box.get_x(), cp_box.get_width()) == (-0.5, 1)
    assert any(p.get_gid() == "structural" for p in panels[0].patches)
    text = _flat(fig.get_suptitle())
    assert "PT vs CaPT" in text
    assert "layer mean over 3 layers" in text and "head mean over 2 heads" in text and "example 3" in text


def test_tick_labels_are_clean_thinned_and_role_coloured():
    long = synth.attention_maps(1, guidance="soft_prompt", n_guidance=20, premise=150, hypothesis=60)
    fig = attention_map_figure({"pt": long}, layer=1, head=0)
    ax = _panels(fig)[0]
    labels = ax.get_xticklabels()
    assert 0 < len(labels) <= 61
    texts = [t.get_text() for t in labels]
    assert not any("Ġ" in t or "\n" in t or "Ċ" in t for t in texts)
    assert all("$" not in t.replace(r"\$", "") for t in texts)
    colors = {t.get_color() for t in labels}
    assert ROLE_COLORS["soft_prompt"] in colors and ROLE_COLORS["content"] in colors
    assert "layer 1" in _flat(fig.get_suptitle()) and "head 0" in _flat(fig.get_suptitle())


def test_stackmaps_input_single_and_bad_selection():
    sm = synth.attention_maps(0)["decoder"]
    fig = attention_map_figure(sm, layer="mean", head="mean")
    assert len(_panels(fig)) == 1
    with pytest.raises(ValueError, match="layer 7"):
        attention_map_figure({"a": sm}, layer=7)


def test_causal_upper_triangle_is_masked():
    fig = attention_map_figure({"a": synth.attention_maps(0)})
    arr = _panels(fig)[0].get_images()[0].get_array()
    assert np.ma.is_masked(arr) and arr.mask[0, 1] and not arr.mask[1, 0]


def test_clean_token_and_pick_ticks():
    assert clean_token("Ġcat") == " cat"
    assert clean_token("▁rain") == " rain"
    assert clean_token("\n") == "⏎" and clean_token("Ċ") == "⏎"
    assert clean_token("$5") == r"\$5"
    assert clean_token("a\x00b") == "ab"
    assert clean_token("Ġ") == "␣"
    roles = [3] * 10 + [2] * 290
    ticks, step = pick_ticks(roles, 60)
    assert step == 5 and len(ticks) <= 60 and min(np.diff(ticks)) >= 5 and 0 in ticks


def _maps(example_id: int, seed_tokens: int, **kw) -> AttentionMaps:
    roles, toks = synth.sequence(seed=seed_tokens, **kw)
    return AttentionMaps(example_id, {"decoder": synth.stack_maps(roles, toks, seed=example_id)})


def test_average_aligned_numbers_and_tokens():
    a, b, c = _maps(0, 0), _maps(1, 1), _maps(2, 2)
    avg = average_maps_aligned([a, b, c])
    assert isinstance(avg, AveragedStackMaps)
    expected = (a["decoder"].probs + b["decoder"].probs + c["decoder"].probs) / 3
    assert torch.allclose(avg.probs, expected, atol=1e-6)
    assert avg.example_ids == [0, 1, 2] and avg.n_examples == 3
    assert avg.k_tokens[5] == "Premise"  # shared template token kept
    assert any(t == "<content>" for t in avg.k_tokens)  # differing content tokens hidden
    # averaged maps count with their weight when averaged again
    again = average_maps_aligned([average_maps_aligned([a, b]), c])
    assert torch.allclose(again.probs, expected, atol=1e-6) and again.n_examples == 3
    fig = attention_map_figure({"avg": avg})
    assert "mean of 3 aligned examples" in _flat(fig.get_suptitle())


def test_average_refuses_mismatched_roles():
    a = _maps(0, 0)
    longer = _maps(1, 0, premise=7)
    with pytest.raises(ValueError, match="pick one example"):
        average_maps_aligned([a, longer])
    roles, toks = synth.sequence()
    roles[8] = synth.S  # same length, a content position now structural
    other = AttentionMaps(2, {"decoder": synth.stack_maps(roles, toks, seed=2)})
    with pytest.raises(ValueError, match="position 8"):
        average_maps_aligned([a, other])
    with pytest.raises(ValueError):
        average_maps_aligned([])
