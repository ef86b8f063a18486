"""Site selection parsing, MapSink maps (padding removed, guidance labels) and their safetensors round trip."""

from __future__ import annotations

import pytest
import torch

from anchorlens.capture.collect import collect_maps, encode_batches
from anchorlens.capture.maps_io import load_maps, save_maps
from anchorlens.capture.selection import Selection, Site, parse_layers
from anchorlens.methods.spec import load_guided
from anchorlens.roles.kinds import Role
from anchorlens.tasks import bundled_examples, get_task

from .helpers import Collect


@pytest.mark.parametrize(
    "text, expected",
    [(None, None), ("all", None), ("3", (3,)), ("0,2,5-7", (0, 2, 5, 6, 7)), ("-1", (-1,)), ("0,-2", (0, -2))],
)
def test_parse_layers(text, expected):
    assert parse_layers(text) == expected


def test_selection_accepts_negative_layers_and_globs():
    sel = Selection(layers=(-1,), names=("decoder.*",))
    assert sel.accepts(Site("decoder", 29), 30) and not sel.accepts(Site("decoder", 28), 30)
    assert not Selection(stacks=("encoder",)).accepts(Site("decoder", 0), 4)


def test_maps_drop_padding_label_guidance_and_round_trip(tmp_path, tiny_base):
    model = load_guided("instance", tiny_base("tiny-llama"))
    examples = bundled_examples("rte")[:3]
    batches = encode_batches(model, examples, get_task("rte").template, batch_size=3)
    maps = collect_maps(model, batches, Selection(layers=(0, 2), heads=(1,)), max_examples=2)
    assert len(maps) == 2
    sm = maps[0]["decoder"]
    assert sm.layers == [0, 2] and sm.heads == [1] and sm.probs.shape[:2] == (2, 1)
    q = sm.probs.shape[-2]
    assert len(sm.q_tokens) == q and sm.q_tokens[0] == "<instance>"
    assert sm.positions_of(Role.INSTANCE) == [0]
    assert torch.allclose(sm.layer(2).sum(-1), torch.ones(1, q), atol=1e-5)  # no padding rows kept
    save_maps({"a": maps[0], "b": maps[1]}, tmp_path / "maps")
    back = load_maps(tmp_path / "maps")
    assert list(back) == ["a", "b"]
    torch.testing.assert_close(back["a"]["decoder"].probs, sm.probs, rtol=0, atol=0)
    assert back["a"]["decoder"].k_tokens == sm.k_tokens and back["a"].example_id == maps[0].example_id


def test_parse_rejects_reversed_ranges_and_garbage():
    from anchorlens.capture.selection import parse_heads
    from anchorlens.errors import UsageError

    with pytest.raises(UsageError, match=r"--layers 5-2 is a reversed range: write 2-5"):
        parse_layers("5-2")
    with pytest.raises(UsageError, match="--heads"):
        parse_heads("x")
    assert parse_layers("-3--1") == (-3, -2, -1)


@pytest.mark.parametrize(
    "selection, message",
    [
        (Selection(layers=(9,)), r"--layers 9 is out of range: this base has 4 layers \(0\.\.3, or -4\.\.-1\)"),
        (Selection(layers=(-5,)), r"--layers -5 is out of range"),
        (Selection(heads=(9,)), r"--heads 9 is out of range: this base has 4 heads \(0\.\.3, or -4\.\.-1\)"),
    ],
)
def test_selection_out_of_range_is_refused_before_any_forward(tiny_base, selection, message):
    """Bug (issue 10): --layers 9 on a 4-layer base captured layer 1; --heads 9 was an internal error."""
    from anchorlens.capture.run import capture_batch, check_selection
    from anchorlens.errors import UsageError

    base = tiny_base("tiny-llama")
    batch = base.encode([get_task("rte").template.render(bundled_examples("rte")[0])])
    with pytest.raises(UsageError, match=message):
        check_selection(base, selection)
    forwards = []
    handle = base.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(UsageError, match=message):
            capture_batch(base, batch, Collect(), selection)
    finally:
        handle.remove()
    assert forwards == []


def test_negative_layers_and_heads_select_from_the_end(tiny_base):
    from anchorlens.capture.run import capture_batch

    base = tiny_base("tiny-llama")
    batch = base.encode([get_task("rte").template.render(bundled_examples("rte")[0])])
    sink = Collect()
    capture_batch(base, batch, sink, Selection(layers=(-1,), heads=(-1, 0)))
    assert [(e.layer, e.heads.tolist()) for e in sink.events] == [(3, [3, 0])]
