"""Knockouts: every mode against a hand-written eager forward that masks, zeroes or drops values itself."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface

from anchorlens.engine.attention import ATTN_IMPLEMENTATION
from anchorlens.errors import UsageError
from anchorlens.methods import GuidedModel, load_guided, parse_spec
from anchorlens.methods.knockout import KnockoutConfig
from anchorlens.roles.kinds import Role
from tests.methods.helpers import Collect, logits_with_attention, rte_batch

REFERENCE = "knockout_reference"
# layer -> (mode, mask [B, H|1, Q, K] True = knocked out); set by each test before its reference forward
_PLAN: dict[int, tuple[str, torch.Tensor]] = {}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention written out: repeated kv heads, additive mask, float32 softmax, then the knockout."""
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1).float()
    v = value.repeat_interleave(groups, dim=1).float()
    scores = query.float() @ k.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    visible = attention_mask[..., : k.shape[2]] > torch.finfo(attention_mask.dtype).min / 2
    mode, mask = _PLAN.get(module.layer_idx, ("", None))
    if mode == "renorm":
        visible = visible & ~mask
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query that may see no key: zero output
    if mode == "zero":
        probs = probs.masked_fill(mask, 0.0)
    if mode == "value":  # zero the keys' values (per example and head), keep the weights
        keys = mask[:, :, 0, :]  # [B, H|1, K]: the test knocks keys out for all queries
        v = v * (~keys).unsqueeze(-1).float()
    out = (probs @ v).to(value.dtype)
    return out.transpose(1, 2).contiguous(), probs


AttentionInterface.register(REFERENCE, _reference_attention)
AttentionMaskInterface.register(REFERENCE, eager_mask)


def _reference_logits(model: GuidedModel, batch, plan: dict[int, tuple[str, torch.Tensor]]) -> torch.Tensor:
    """Logits of ``model`` (no knockout in it) with the reference attention applying ``plan``."""
    _PLAN.clear()
    _PLAN.update(plan)
    try:
        return logits_with_attention(model, batch, REFERENCE)
    finally:
        _PLAN.clear()


def _knocked(model: GuidedModel, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.forward(batch).logits


def _instance_keys(model: GuidedModel, batch) -> torch.Tensor:
    """[B, K] the instance token's key, found from the inserted input: the one position beyond the batch's own."""
    # instance:pos=first goes before each example's first valid token; right padding: index 0
    t = batch.input_ids.shape[1] + 1
    keys = torch.zeros(batch.batch_size, t, dtype=torch.bool)
    keys[:, 0] = True
    return keys


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("mode", ["renorm", "zero", "value"])
def test_instance_knockout_matches_reference(tiny_base, name, mode):
    base = tiny_base(name)
    batch = rte_batch(base, "right")
    heads = "all" if mode == "value" else "1/3"  # a head subset: renorm and zero act per head
    knocked = load_guided(f"instance+knockout:keys=instance,layers=1-2,heads={heads},mode={mode}", base)
    plain = load_guided("instance", base)
    keys = _instance_keys(plain, batch)
    b, t = keys.shape
    mask = keys[:, None, None, :].expand(b, 1, t, t)
    if heads != "all":
        head_mask = torch.zeros(base.num_heads, dtype=torch.bool)
        head_mask[[1, 3]] = True
        mask = mask & head_mask.view(1, -1, 1, 1)
    want = _reference_logits(plain, batch, {1: (mode, mask), 2: (mode, mask)})
    got = _knocked(knocked, batch)
    valid = batch.attention_mask.bool()
    assert torch.allclose(got[valid], want[valid], atol=2e-5), (got[valid] - want[valid]).abs().max()
    unchanged = _knocked(plain, batch)
    assert (got[valid] - unchanged[valid]).abs().max() > 1e-4  # the knockout changed something


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_first_key_knockout_for_content_queries_left_padded(tiny_base, name):
    """keys=pos=0 is each example's first valid key; queries=content only (left padding moves it)."""
    base = tiny_base(name)
    batch = rte_batch(base, "left")
    knocked = load_guided("knockout:keys=pos=0,queries=content,mode=renorm", base)
    b, t = batch.input_ids.shape
    first = batch.attention_mask.long().argmax(1)
    keys = torch.zeros(b, t, dtype=torch.bool)
    keys[torch.arange(b), first] = True
    queries = batch.roles == int(Role.CONTENT)
    mask = (queries[:, :, None] & keys[:, None, :]).unsqueeze(1)
    plan = {layer: ("renorm", mask) for layer in range(base.num_layers)}
    want = _reference_logits(load_guided("base", base), batch, plan)
    got = _knocked(knocked, batch)
    valid = batch.attention_mask.bool()
    assert torch.allclose(got[valid], want[valid], atol=2e-5)


def test_knockout_acts_in_captures_and_reports_its_weights(tiny_base):
    """In a capture the knocked-out weights are what the events report: zero (renorm, zero), unchanged (value)."""
    from anchorlens.capture.run import capture_batch

    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")
    for mode, expect_zero in (("renorm", True), ("zero", True), ("value", False)):
        model = load_guided(f"instance+knockout:keys=instance,layers=2,mode={mode}", base)
        sink = Collect()
        out = capture_batch(model, batch, sink)
        by_layer = {e.layer: e for e in sink.events}
        on_instance = by_layer[2].probs[..., 0]  # the instance key (index 0, right padding)
        assert bool((on_instance[..., 1:] == 0).all()) == expect_zero
        assert float(by_layer[1].probs[..., 1:, 0].max()) > 0  # other layers untouched
        valid = batch.attention_mask.bool()
        assert torch.allclose(out.logits[valid], _knocked(model, batch)[valid], atol=2e-5)
        if mode == "renorm":  # renormalised rows still sum to 1
            sums = by_layer[2].probs.sum(-1)[..., 1:]
            assert torch.allclose(sums[sums > 0], torch.ones_like(sums[sums > 0]), atol=1e-5)
    assert base.model.config._attn_implementation == ATTN_IMPLEMENTATION


def test_spec_prints_back_to_an_equal_config():
    for text in (
        "instance+knockout:keys=instance,layers=10-20,mode=renorm",
        "knockout:keys=pos=0,queries=content,heads=0/2/5-7,mode=zero",
        "capsule+knockout:keys=capsule,mode=value",
        "knockout:keys=first",
        "instance+knockout:keys=instance,layers=1/3,mode=mean",
    ):
        spec = parse_spec(text)
        assert parse_spec(str(spec)) == spec
    assert str(parse_spec("instance+knockout:keys=instance,mode=renorm")) == "instance+knockout:keys=instance"
    assert KnockoutConfig(keys="first").key_position() == 0
    assert KnockoutConfig(keys="pos=-1").key_position() == -1  # negative positions count from the end
    assert KnockoutConfig(keys="hypothesis-words").keys == "hypothesis_words"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("knockout:mode=shuffle", "unknown knockout mode"),
        ("knockout:layers=5-2", "reversed range"),
        ("knockout:layers=x", "not a list of indices"),
        ("knockout:keys=pos=x", "integer position"),
    ],
)
def test_bad_specs_are_one_line(spec, words):
    with pytest.raises(UsageError, match=words) as err:
        parse_spec(spec)
    assert "\n" not in str(err.value)


def test_bad_knockouts_on_a_model(tiny_base):
    base = tiny_base("tiny-llama")
    with pytest.raises(UsageError, match="outside the model.*4 layers"):
        load_guided("instance+knockout:keys=instance,layers=2-9", base)
    with pytest.raises(UsageError, match="outside the model.*4 heads"):
        load_guided("instance+knockout:keys=instance,heads=7", base)
    with pytest.raises(UsageError, match="inserts no instance positions"):
        load_guided("knockout:keys=instance", base)
    model = load_guided("knockout:keys=premise_words", base)
    with pytest.raises(UsageError, match="no role 'premise_words'"):
        model.forward(rte_batch(base, "right"))
    with pytest.raises(UsageError, match="no role 'premise_words'"):
        model.check_roles(rte_batch(base, "right").sequences()["input"].table)
