"""The recompute mirrors what HF passes to attention functions: soft-capping, sliding windows, sinks, scaling.

Tiny random models are built from transformers' own config classes (sliding window smaller than the
input) and compared against HF eager ``output_attentions`` and eager logits, with left and right padding.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.selection import Selection, Site
from anchorlens.capture.session import CaptureSession, activate
from anchorlens.engine.attention import install
from anchorlens.roles.layout import SequenceRoles, StaticLayout

from .helpers import Collect

SEQ = 12
WINDOW = 4
COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
)


def _config(family: str):
    if family == "gemma2":  # soft-capping, query_pre_attn_scalar, alternating sliding/global layers
        return transformers.Gemma2Config(
            **COMMON,
            sliding_window=WINDOW,
            attn_logit_softcapping=5.0,
            query_pre_attn_scalar=12,
            final_logit_softcapping=None,
            layer_types=["sliding_attention", "full_attention"],
        )
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **COMMON,
            sliding_window=WINDOW,
            query_pre_attn_scalar=12,
            layer_types=["sliding_attention", "full_attention"],
        )
    if family == "mistral":
        return transformers.MistralConfig(**COMMON, sliding_window=WINDOW)
    if family == "gpt_oss":  # attention sinks (s_aux)
        cfg = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
        return transformers.GptOssConfig(
            **cfg,
            intermediate_size=32,
            num_local_experts=2,
            num_experts_per_tok=1,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        )
    raise AssertionError(family)


def _model(family: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(20.0)  # peaked attention: large logits make soft-capping bite
            if family == "gpt_oss":
                layer.self_attn.sinks.normal_(0.0, 2.0)  # non-trivial sinks
    return model


def _inputs(padding_side: str):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (3, SEQ), generator=g)
    mask = torch.ones(3, SEQ, dtype=torch.long)
    for row, n in ((1, 3), (2, 5)):
        if padding_side == "right":
            mask[row, SEQ - n :] = 0
        else:
            mask[row, :n] = 0
    return ids, mask


def _capture(model, ids, mask, options: CaptureOptions, selection: Selection = Selection()):
    """Run ``model`` under the anchorlens function with every self-attention module as a site."""
    install(model)
    sites = [(Site("decoder", i), layer.self_attn) for i, layer in enumerate(model.model.layers)]
    roles = SequenceRoles(torch.zeros_like(ids), mask.bool())
    layout = StaticLayout({"input": roles}, {"decoder": ("input", "input")})
    sink = Collect()
    session = CaptureSession(sites, sink, layout, torch.arange(ids.shape[0]), selection, options)
    with activate(session), torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits, sink.events


def _eager(model, ids, mask):
    model.set_attn_implementation("eager")
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_attentions=True)


def _assemble(events, layer: int) -> torch.Tensor:
    """[B, H, Q, K] of one layer from its (possibly chunked) events."""
    parts = sorted((e for e in events if e.layer == layer), key=lambda e: e.query_start)
    return torch.cat([e.full_probs() for e in parts], dim=2)


FAMILIES = ["gemma2", "gemma3", "mistral", "gpt_oss"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_probabilities_and_logits_equal_eager(family, padding_side, mode):
    model = _model(family)
    ids, mask = _inputs(padding_side)
    reference = _eager(model, ids, mask)
    logits, events = _capture(model, ids, mask, CaptureOptions(mode=mode))
    rows = mask.bool()[:, None, :, None]
    for layer, ref in enumerate(reference.attentions):
        got = _assemble(events, layer)
        assert got.shape == ref.shape
        assert float(((got - ref).abs() * rows).max()) <= 1e-5, (family, layer)
    valid = mask.bool()[..., None]
    assert float(((logits - reference.logits).abs() * valid).max()) <= 1e-5


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_eager_only_features_are_exact_outside_a_session(family):
    """Soft-capping and sinks cannot go through sdpa: the output is eager math at every call."""
    model = _model(family)
    ids, mask = _inputs("right")
    reference = _eager(model, ids, mask).logits
    install(model)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()[..., None]
    assert float(((logits - reference).abs() * valid).max()) <= 1e-5


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_window_applies_when_the_mask_is_skipped(family):
    """No padding: HF may pass mask=None; the window must still cut the recompute (and the output)."""
    model = _model(family)
    ids = _inputs("right")[0]
    mask = torch.ones_like(ids)
    reference = _eager(model, ids, mask)
    logits, events = _capture(model, ids, mask, CaptureOptions(mode="strict"))
    first = _assemble(events, 0)
    assert float((first - reference.attentions[0]).abs().max()) <= 1e-5
    far = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool), -WINDOW)
    assert float(first[..., far].abs().max()) == 0.0  # keys beyond the window get nothing
    assert float((logits - reference.logits).abs().max()) <= 1e-5


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_selected_heads_match_all_heads(family):
    model = _model(family)
    ids, mask = _inputs("left")
    _, everything = _capture(model, ids, mask, CaptureOptions(mode="strict"))
    _, chosen = _capture(model, ids, mask, CaptureOptions(mode="strict"), Selection(heads=(1, 2)))
    for layer in (0, 1):
        torch.testing.assert_close(_assemble(chosen, layer), _assemble(everything, layer)[:, [1, 2]])


def test_unmasked_sliding_window_matches_eager_math():
    """mask=None with a window smaller than the input: the window is applied, output from eager math."""
    from transformers.models.mistral.modeling_mistral import eager_attention_forward

    from anchorlens.engine.attention import anchorlens_attention_forward

    module = _model("mistral").model.layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, n, SEQ, 8, generator=g) * 3 for n in (4, 2, 2))
    pos = torch.arange(SEQ)
    allowed = (pos[:, None] >= pos[None, :]) & (pos[None, :] > pos[:, None] - WINDOW)
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min).view(1, 1, SEQ, SEQ)
    ref_out, ref_probs = eager_attention_forward(module, q, k, v, additive, scaling=0.3)
    sites = [(Site("decoder", 0), module)]
    roles = SequenceRoles(torch.zeros(2, SEQ, dtype=torch.long), torch.ones(2, SEQ, dtype=torch.bool))
    sink = Collect()
    session = CaptureSession(
        sites,
        sink,
        StaticLayout({"input": roles}, {"decoder": ("input", "input")}),
        torch.arange(2),
        Selection(),
        CaptureOptions(mode="strict"),
    )
    with activate(session), torch.no_grad():
        out, _ = anchorlens_attention_forward(module, q, k, v, None, scaling=0.3, sliding_window=WINDOW)
    assert float((_assemble(sink.events, 0) - ref_probs).abs().max()) <= 1e-5
    assert float((out - ref_out).abs().max()) <= 1e-5
