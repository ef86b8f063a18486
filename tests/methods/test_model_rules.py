"""One anchor rule on GuidedModel, and the capsule's mean option against hand computation."""

from __future__ import annotations

import pytest
import torch

from anchorlens.methods import Capsule, CapsuleConfig, GuidedModel, InstanceToken, load_guided
from anchorlens.roles.kinds import Role

from .helpers import masked_mean, rte_batch


@pytest.mark.parametrize(
    "spec,anchors,entropy",
    [
        ("base", ("first_token",), None),
        ("instance:pos=last", ("first_token", "instance"), "instance"),  # capture's rule; inspect used to pick capsule
        ("prompt:n=2+capsule+prompt:n=1", ("first_token", "soft_prompt", "capsule"), "soft_prompt"),
        ("capsule:pos=last+instance", ("first_token", "capsule", "instance"), "capsule"),
        ("prefix:n=2", ("first_token", "soft_prompt"), "soft_prompt"),
    ],
)
def test_one_anchor_rule(tiny_base, spec, anchors, entropy):
    guided = load_guided(spec, base=tiny_base("tiny-llama"))
    assert guided.anchors() == anchors
    assert guided.entropy_anchor() == entropy
    assert guided.anchor_roles() == tuple(Role[a.upper()] for a in anchors[1:])


def _recorded_capsule_vectors(guided, batch, **kwargs):
    """Run ``guided`` recording the capsule's S_i per layer ([B, 1, d] each); returns (vectors, output)."""
    capsule = next(g for g in guided.guidances if isinstance(g, Capsule))
    seen: list[torch.Tensor] = []
    original = capsule.layer_vectors

    def record(*args):
        out = original(*args)
        seen.append(out.detach().clone())
        return out

    capsule.layer_vectors = record  # type: ignore[method-assign]
    with torch.no_grad():
        out = guided.forward(batch, output_hidden_states=True, **kwargs)
    return seen, out


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_capsule_mean_over_input_tokens_only(tiny_base, padding_side):
    """mean=input: S_1 = p_1 + Mean(input embeddings); S_i = p_i + Mean(H_{i-1} over input tokens), instance excluded."""
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, padding_side)
    guided = GuidedModel(base, [InstanceToken(), Capsule(init="random", mean="input")], seed=1)
    seen, out = _recorded_capsule_vectors(guided, batch)
    p = guided.guidances[1].p["decoder"]
    embeds = base.adapter.token_embeddings(base.model, batch.input_ids)
    valid = batch.attention_mask.bool()
    torch.testing.assert_close(seen[0][:, 0], p[0] + masked_mean(embeds, valid), rtol=0, atol=1e-5)
    # hidden_states[i]: output of layer i-1 over the kept sequence (instance + input), capsule removed
    plan = guided.plan(batch)
    kept = plan.sequences["input"]
    tokens = kept.valid.bool() & (kept.roles != int(Role.INSTANCE))
    for layer in range(1, base.num_layers):
        want = p[layer] + masked_mean(out.hidden_states[layer], tokens)
        torch.testing.assert_close(seen[layer][:, 0], want, rtol=0, atol=1e-5)


def test_capsule_mean_options_differ_where_they_should(tiny_base):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")

    def logits(spec: str) -> torch.Tensor:
        with torch.no_grad():
            return load_guided(spec, base=base, seed=3).forward(batch).logits

    default = logits("instance+deep-prompt:n=2+capsule:init=random")
    assert CapsuleConfig().mean == "capsule+input"
    assert torch.equal(default, logits("instance+deep-prompt:n=2+capsule:init=random,mean=capsule+input"))
    for other in ("input", "all"):  # all: the deep prompt's positions enter; input: neither they nor the instance
        assert (
            float((logits(f"instance+deep-prompt:n=2+capsule:init=random,mean={other}") - default).abs().max()) > 1e-4
        )
    # without other guidance positions, "all" and the default pool the same positions
    torch.testing.assert_close(logits("capsule:mean=all"), logits("capsule"), rtol=0, atol=0)


def test_moving_a_guidance_keeps_its_config_and_name_true(tiny_base):
    guided = load_guided("instance+capsule", base=tiny_base("tiny-llama"))
    for g in guided.guidance_list():
        g.position = "last"  # what position sweeps do
    assert guided.guidance_list()[1].config == CapsuleConfig(position="last")
    assert guided.name == "tiny-llama+instance:pos=last+capsule:pos=last"
    assert guided.config()["methods"][0]["options"]["position"] == "last"
