"""Knockout mode=mean against a hand-written reference: the dataset mean of the attention input at the keys, by
hand from ``output_hidden_states``, and an eager forward that scores and reads the keys' mean-state key and value."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from anchorlens.errors import UsageError
from anchorlens.methods import GuidedModel, load_guided
from anchorlens.roles.kinds import Role
from anchorlens.tasks import bundled_examples, get_task
from tests.methods.helpers import logits_with_attention, rte_batch

REFERENCE = "knockout_mean_reference"
# layer -> (pair mask [B, H|1, Q, K] True = reads the mean state's key/value, key' [B, H_kv, K, D], value')
_PLAN: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention written out; at planned layers the masked pairs use the mean state's key and value."""
    groups = query.shape[1] // key.shape[1]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    k = key.repeat_interleave(groups, dim=1).float()
    v = value.repeat_interleave(groups, dim=1).float()
    scores = query.float() @ k.transpose(-1, -2) * scale
    plan = _PLAN.get(module.layer_idx)
    if plan is not None:
        mask, mean_k, mean_v = plan
        mean_k = mean_k.repeat_interleave(groups, dim=1).float()
        scores = torch.where(mask, query.float() @ mean_k.transpose(-1, -2) * scale, scores)
    visible = attention_mask[..., : k.shape[2]] > torch.finfo(attention_mask.dtype).min / 2
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    if plan is None:
        out = probs @ v
    else:
        out = probs.masked_fill(mask, 0.0) @ v + probs.masked_fill(~mask, 0.0) @ mean_v.repeat_interleave(groups, 1)
    return out.to(value.dtype).transpose(1, 2).contiguous(), probs


AttentionInterface.register(REFERENCE, _reference_attention)
AttentionMaskInterface.register(REFERENCE, eager_mask)


def _attention_inputs(model: GuidedModel, batches) -> tuple[list[list[torch.Tensor]], list[dict[int, tuple]]]:
    """Per batch: each layer's attention input [B, T, d] (its input norm applied to ``output_hidden_states``) and the
    rotary (cos, sin) each layer received."""
    hf = model.base.model
    inputs, rotary = [], []
    for batch in batches:
        seen: dict[int, tuple] = {}

        def keep(module, args, kwargs, seen=seen):
            seen[module.layer_idx] = kwargs["position_embeddings"]

        hooks = [layer.self_attn.register_forward_pre_hook(keep, with_kwargs=True) for layer in hf.model.layers]
        try:
            with torch.no_grad():
                states = model.forward(batch, output_hidden_states=True).hidden_states
        finally:
            for h in hooks:
                h.remove()
        with torch.no_grad():
            inputs.append([layer.input_layernorm(states[i]) for i, layer in enumerate(hf.model.layers)])
        rotary.append(seen)
    return inputs, rotary


def _mean_kv(model: GuidedModel, layer: int, mean: torch.Tensor, rotary: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The key (rotated at every position) and value [B, H_kv, T, D] the layer computes from ``mean`` [d]."""
    attn = model.base.model.model.layers[layer].self_attn
    cos, sin = rotary
    b, t = cos.shape[:2]
    with torch.no_grad():
        k = attn.k_proj(mean).view(1, -1, 1, attn.head_dim).expand(b, -1, t, -1)
        v = attn.v_proj(mean).view(1, -1, 1, attn.head_dim).expand(b, -1, t, -1)
        k = apply_rotary_pos_emb(k, k, cos, sin)[1]
    return k, v


def _reference_logits(model: GuidedModel, batch, plan) -> torch.Tensor:
    _PLAN.clear()
    _PLAN.update(plan)
    try:
        return logits_with_attention(model, batch, REFERENCE)
    finally:
        _PLAN.clear()


def _logits(model: GuidedModel, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.forward(batch).logits


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("heads", ["all", "1/3"])
def test_mean_knockout_matches_reference(tiny_base, name, heads):
    """instance+knockout:keys=instance,mode=mean at layers 1 and 3, over two batches (the mean spans both)."""
    base = tiny_base(name)
    batches = [rte_batch(base, "right", n=3), rte_batch(base, "right", n=5)]
    spec = f"instance+knockout:keys=instance,layers=1/3,heads={heads},mode=mean"
    knocked = load_guided(spec, base)
    report = knocked.prepare(batches)
    plain = load_guided("instance", base)
    inputs, rotary = _attention_inputs(plain, batches)
    # right padding: the instance token is every example's position 0 (at every layer)
    means = {layer: torch.cat([x[layer][:, 0] for x in inputs]).double().mean(0).float() for layer in (1, 3)}
    assert report[0]["examples"] == 8 and report[0]["keys"] == 8
    for layer, mean in means.items():
        assert torch.allclose(knocked.knockout_list()[0].means[("decoder", layer)], mean, atol=1e-5)
        assert report[0]["mean_norm"][str(layer)] == pytest.approx(float(mean.norm()), rel=1e-5)
    batch = batches[0]
    b, t = batch.batch_size, batch.input_ids.shape[1] + 1
    keys = torch.zeros(b, t, dtype=torch.bool)
    keys[:, 0] = True
    mask = keys[:, None, None, :].expand(b, 1, t, t)
    if heads != "all":
        chosen = torch.zeros(base.num_heads, dtype=torch.bool)
        chosen[[1, 3]] = True
        mask = mask & chosen.view(1, -1, 1, 1)
    plan = {layer: (mask, *_mean_kv(plain, layer, mean, rotary[0][layer])) for layer, mean in means.items()}
    want = _reference_logits(plain, batch, plan)
    got = _logits(knocked, batch)
    valid = batch.attention_mask.bool()
    assert torch.allclose(got[valid], want[valid], atol=2e-5), (got[valid] - want[valid]).abs().max()
    assert (got[valid] - _logits(plain, batch)[valid]).abs().max() > 1e-4  # the knockout changed something


@pytest.mark.parametrize(
    "name, method, keys",
    [
        ("tiny-llama", "instance", "instance"),
        ("tiny-qwen2", "instance", "instance"),
        ("tiny-llama", "capsule", "capsule"),  # a per-layer position: its mean is taken inside every block
        ("tiny-qwen2", "prompt:n=1", "soft_prompt"),
        ("tiny-llama", "base", "pos=-1"),
    ],
)
def test_mean_of_one_key_is_that_key_and_changes_nothing(tiny_base, name, method, keys):
    """One example, one key: the dataset mean is the key's own state, so the outputs are unchanged."""
    base = tiny_base(name)
    batch = base.encode([get_task("rte").template.render(bundled_examples("rte")[0])])
    prefix = "" if method == "base" else f"{method}+"
    knocked = load_guided(f"{prefix}knockout:keys={keys},mode=mean", base)
    knocked.prepare([batch])
    plain = _logits(load_guided(method, base), batch)
    assert torch.allclose(_logits(knocked, batch), plain, atol=1e-5)
    other = load_guided(f"{prefix}knockout:keys={keys},mode=renorm", base)
    assert (_logits(other, batch) - plain).abs().max() > 1e-4  # a knockout that does act, for contrast


def test_mean_knockout_for_content_queries_acts_on_them_only(tiny_base):
    """queries=content: the instance token's own row and the structural queries read its real key and value."""
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")
    knocked = load_guided("instance+knockout:keys=instance,queries=content,mode=mean", base)
    knocked.prepare([batch])
    everyone = load_guided("instance+knockout:keys=instance,mode=mean", base)
    everyone.prepare([batch])
    plain = _logits(load_guided("instance", base), batch)
    got = _logits(knocked, batch)
    roles = torch.cat([torch.full((batch.batch_size, 1), int(Role.INSTANCE)), batch.roles], dim=1)
    valid = torch.cat([torch.ones(batch.batch_size, 1, dtype=torch.bool), batch.attention_mask.bool()], dim=1)
    # a query's logits change only through the queries it attends to; the first content query is the first one
    # that reads the mean, so every position before it keeps the plain logits
    first_content = int((roles[0] == int(Role.CONTENT)).nonzero()[0]) - 1  # logits are per input token
    assert torch.allclose(got[0, :first_content], plain[0, :first_content], atol=1e-5)
    assert (got[valid[:, 1:]] - plain[valid[:, 1:]]).abs().max() > 1e-4
    assert (got - _logits(everyone, batch)).abs().max() > 1e-6  # not the same as every query reading the mean


def test_mean_without_a_first_pass_is_one_line(tiny_base):
    base = tiny_base("tiny-llama")
    model = load_guided("instance+knockout:keys=instance,mode=mean", base)
    assert model.needs_first_pass()
    with pytest.raises(UsageError, match=r"needs the dataset mean .* model\.prepare\(batches\)") as err:
        model.forward(rte_batch(base, "right"))
    assert "\n" not in str(err.value)


def test_mean_refuses_keys_the_inputs_lack_and_prefix_keys(tiny_base):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")
    with pytest.raises(UsageError, match="no role 'premise_words'"):
        load_guided("knockout:keys=premise_words,mode=mean", base).prepare([batch])
    with pytest.raises(UsageError, match="prefix keys have none"):
        load_guided("prefix+knockout:keys=pos=0,mode=mean", base).prepare([batch])
    with pytest.raises(UsageError, match="not available on encoder-decoder bases"):
        load_guided("knockout:keys=first,mode=mean", tiny_base("tiny-t5"))


def test_moving_the_anchor_asks_for_a_new_first_pass(tiny_base):
    """The means belong to the model they were computed on: a moved instance token needs its own."""
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")
    model = load_guided("instance+knockout:keys=instance,mode=mean", base)
    model.prepare([batch])
    assert not model.needs_first_pass()
    model.guidance_list()[0].position = "last"
    assert model.needs_first_pass()
    with pytest.raises(UsageError, match="needs the dataset mean"):
        model.forward(batch)
