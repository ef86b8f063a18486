"""Notebook API review: inspect leaves the user's model as it found it, checks layers/heads, and plot/top_anchors
refuse what was not captured with one-line project errors."""

from __future__ import annotations

import pytest
import torch

import anchorlens as al
from anchorlens.errors import UnknownNameError, UsageError
from anchorlens.models.loading import load_base
from anchorlens.models.tiny import build_tiny

TEXT = "The cat sat on the mat. It was warm."


@pytest.fixture(scope="module")
def base():
    return load_base("tiny-llama")


@pytest.fixture(scope="module")
def view(base):
    return al.inspect(base, TEXT, layers=(1, 3), heads=(0, 2))


def test_maps_equal_hf_eager_output_attentions():
    model, tok = build_tiny("tiny-llama")
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = torch.stack([a[0] for a in model(**tok(TEXT, return_tensors="pt"), output_attentions=True).attentions])
    view = al.inspect(model, TEXT, tokenizer=tok, layers=(1, -1), heads=(-1, 0))
    sm = view.maps["decoder"]
    assert sm.layers == [1, 3] and sm.heads == [3, 0]
    torch.testing.assert_close(sm.probs.float(), ref[[1, 3]][:, [3, 0]], atol=1e-6, rtol=0)


def test_inspect_gives_the_model_back_in_its_attention_implementation():
    model, tok = build_tiny("tiny-llama")
    model.set_attn_implementation("eager")
    with torch.no_grad():  # transformers installs its own hooks for output_attentions
        model(**tok(TEXT, return_tensors="pt"), output_attentions=True)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    view = al.inspect(model, TEXT, tokenizer=tok)
    assert model.config._attn_implementation == "eager"
    view.metrics()
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():  # output_attentions works again (anchorlens' attention function returns no weights)
        out = model(**tok(TEXT, return_tensors="pt"), output_attentions=True)
    assert len(out.attentions) == 4 and out.attentions[0] is not None
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == hooks


def test_inspect_that_raises_also_restores_attention(monkeypatch):
    import anchorlens.notebook.inspect as nb

    model, tok = build_tiny("tiny-llama")
    model.set_attn_implementation("eager")

    def boom(*args, **kwargs):
        from anchorlens.engine.attention import install

        install(model)
        raise UsageError("capture failed")

    monkeypatch.setattr(nb, "collect_maps", boom)
    with pytest.raises(UsageError, match="capture failed"):
        al.inspect(model, TEXT, tokenizer=tok)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("kw", [{"layers": ()}, {"heads": ()}])
def test_empty_layers_or_heads_are_refused(base, kw):
    with pytest.raises(UsageError, match=r"inspect\(\): (layers|heads)=\(\) selects nothing"):
        al.inspect(base, TEXT, **kw)


def test_out_of_range_names_the_python_argument(base):
    with pytest.raises(UsageError, match=r"^inspect\(\): heads=9 is out of range"):
        al.inspect(base, TEXT, heads=(9,))
    with pytest.raises(UsageError, match=r"^inspect\(\): layers=99 is out of range"):
        al.inspect(base, TEXT, layers=(99,))


def test_a_head_named_twice_is_captured_once(base):
    sm = al.inspect(base, TEXT, heads=(1, -3)).maps["decoder"]  # 4 heads: -3 is head 1
    assert sm.heads == [1] and sm.probs.shape[1] == 1


def test_plot_takes_negative_indices_and_refuses_uncaptured_ones(view):
    fig = view.plot(layer=-1, head=2)  # the model's last layer (3), captured
    assert "layer 3" in fig.texts[0].get_text() or any("layer 3" in t.get_text() for t in fig.texts)
    for kw in ({"layer": 0}, {"head": 1}, {"head": -1}):
        with pytest.raises(UsageError, match="was not captured; choose 'mean' or one of"):
            view.plot(**kw)
    with pytest.raises(TypeError, match="must be an int or 'mean'"):
        view.plot(head=True)
    with pytest.raises(UsageError, match="scale must be"):
        view.plot(scale="bogus")
    with pytest.raises(UnknownNameError, match="stack 'encoder' was not captured"):
        view.plot(stack="encoder")


def test_top_anchors_refuses_bad_k_and_unknown_stack(view):
    with pytest.raises(UsageError, match="k must be"):
        view.top_anchors(-1)
    with pytest.raises(UnknownNameError, match="stack 'encoder' was not captured"):
        view.top_anchors(stack="encoder")
    assert len(view.top_anchors(2)) == 2


def test_maps_of_a_stack_not_captured_name_the_captured_ones():
    from anchorlens.capture.maps import AttentionMaps
    from anchorlens.errors import UnknownNameError

    maps = AttentionMaps(example_id=0, stacks={})
    with pytest.raises(UnknownNameError, match=r"stack 'encoder' was not captured; captured: "):
        maps["encoder"]
