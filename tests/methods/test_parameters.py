"""Parameter counts, frozen base, gradients, architecture support."""

from __future__ import annotations

import pytest
import torch

from anchorlens.errors import UsageError
from anchorlens.methods import Capsule, DeepPrompt, GuidedModel, InstanceToken, SoftPrompt, load_guided

from .helpers import rte_batch


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_parameter_counts(tiny_base, name):
    base = tiny_base(name)
    L, d = base.num_layers, base.hidden_size
    assert GuidedModel(base, [Capsule()]).num_trainable() == L * d
    assert GuidedModel(base, [Capsule(fusion="prepend")]).num_trainable() == L * d
    assert GuidedModel(base, [Capsule(fusion="project", rank=4)]).num_trainable() == L * d + 2 * d * 4
    assert GuidedModel(base, [Capsule(n=2)]).num_trainable() == L * 2 * d
    assert GuidedModel(base, [Capsule(n=4, fusion="prepend")]).num_trainable() == L * 4 * d
    assert GuidedModel(base, [Capsule(n=4, fusion="project", rank=4)]).num_trainable() == L * 4 * d + 2 * d * 4
    for spec in ("capsule:n=2", "capsule:n=4,fusion=prepend", "capsule:n=3,fusion=project,rank=2"):
        guided = load_guided(spec, base=base)
        assert guided.num_trainable() == guided.guidances[0].config.parameter_count(base)
    assert GuidedModel(base, [SoftPrompt(7)]).num_trainable() == 7 * d
    assert GuidedModel(base, [DeepPrompt(3)]).num_trainable() == L * 3 * d
    assert GuidedModel(base, [InstanceToken(k=2)]).num_trainable() == 0
    both = GuidedModel(base, [SoftPrompt(2), Capsule()])
    assert both.num_trainable() == 2 * d + L * d
    assert both.share_of_base() == pytest.approx(both.num_trainable() / base.num_parameters())
    assert [r["trainable"] for r in both.parameter_report()] == [2 * d, L * d]


def test_capsule_init_covers_every_vector(tiny_base):
    base = tiny_base("tiny-llama")
    L, d = base.num_layers, base.hidden_size
    zeros = GuidedModel(base, [Capsule(n=4)]).guidances[0].p["decoder"].detach()
    assert zeros.shape == (L, 4, d) and float(zeros.abs().max()) == 0.0
    p = GuidedModel(base, [Capsule(n=4, init="random")], seed=2).guidances[0].p["decoder"].detach()
    assert bool((p.abs().sum(-1) > 0).all())  # every p_i^j drawn
    assert float(p.std()) == pytest.approx(0.02, rel=0.1) and float(p.mean().abs()) < 0.005
    assert all(not torch.equal(p[:, 0], p[:, j]) for j in range(1, 4))
    one = GuidedModel(base, [Capsule(init="random")], seed=2).guidances[0].p["decoder"]
    assert one.shape == (L, d)  # n = 1 keeps the layout of older checkpoints


def test_t5_counts_both_stacks_by_default(tiny_base):
    base = tiny_base("tiny-t5")
    d = base.hidden_size
    enc = base.adapter.num_layers(base.model, "encoder")
    dec = base.adapter.num_layers(base.model, "decoder")
    assert GuidedModel(base, [Capsule()]).num_trainable() == (enc + dec) * d
    assert GuidedModel(base, [Capsule(stacks="encoder")]).num_trainable() == enc * d
    assert GuidedModel(base, [Capsule(n=2)]).num_trainable() == (enc + dec) * 2 * d
    assert load_guided("deep-prompt:n=2,stacks=decoder", base=base).num_trainable() == dec * 2 * d


def test_gradients_reach_guidance_only(tiny_base):
    base = tiny_base("tiny-llama")
    guided = GuidedModel(base, [SoftPrompt(2), Capsule(), DeepPrompt(1)])
    batch = rte_batch(base, "left")
    out = guided.forward(batch)
    last = batch.attention_mask.shape[1] - 1  # left padding: last position is the last valid token
    out.logits[:, last].logsumexp(-1).sum().backward()
    for p in guided.trainable_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0
        p.grad = None
    assert all(p.grad is None for p in base.model.parameters())
    assert not any(p.requires_grad for p in base.model.parameters())


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5"])
@pytest.mark.parametrize("fusion", ["add", "prepend", "project"])
def test_gradients_reach_every_capsule_vector(tiny_base, name, fusion):
    """n = 2: one backward pass gives every p_i^j (every layer, both vectors) a nonzero gradient."""
    base = tiny_base(name)
    guided = GuidedModel(base, [Capsule(n=2, fusion=fusion, init="random")], seed=1)
    capsule = guided.guidances[0]
    if fusion == "project":
        with torch.no_grad():  # B starts at 0: move it so A gets a gradient too
            for up in capsule.up.values():
                up.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    batch = rte_batch(base, "left" if name != "tiny-t5" else "right")
    guided.forward(batch).logits.logsumexp(-1).sum().backward()
    for stack, p in capsule.p.items():
        assert p.shape == (capsule.layers[stack], 2, base.hidden_size)
        assert p.grad is not None
        norms = p.grad.abs().sum(-1)  # [layers, n]
        assert bool((norms > 0).all()), (stack, norms)
    for p in guided.trainable_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0


def test_bert_guidance_is_refused(tiny_base):
    base = tiny_base("tiny-bert")
    with pytest.raises(UsageError, match="bidirectional encoder: it supports capture only"):
        GuidedModel(base, [Capsule()])
    assert load_guided("base", base=base).num_trainable() == 0


def test_prefix_on_t5_is_refused(tiny_base):
    from anchorlens.methods import Prefix

    with pytest.raises(UsageError, match="decoder-only"):
        GuidedModel(tiny_base("tiny-t5"), [Prefix(3)])


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-t5"])
@pytest.mark.parametrize("spec", ["capsule", "deep-prompt:n=2", "capsule:n=2", "capsule:n=2,fusion=prepend,pos=last"])
def test_gpt2_and_t5_run_layer_methods(tiny_base, name, spec):
    base = tiny_base(name)
    batch = rte_batch(base, "right")
    guided = load_guided(spec, base=base)
    with torch.no_grad():
        got = guided.forward(batch).logits
        plain = base.forward(batch).logits
    assert got.shape == plain.shape
    assert float((got - plain).abs().max()) > 0  # the inserted positions change the output
