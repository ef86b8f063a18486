"""The capsule forward equals a hand-written layer-by-layer loop of the two CaPT equations (n = 1 and n = 2)."""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

from anchorlens.methods.spec import load_guided
from anchorlens.models.verified import FULL, REFERENCE, verified_bases

from .helpers import after_last_valid, drop_rows, first_valid, insert_rows, masked_mean, rte_batch, run_block

TOL = 1e-5
DECODERS = verified_bases(kind="decoder", guidance=FULL)  # every variant below
DISCOVERED = verified_bases(kind="decoder", guidance=REFERENCE)  # left padding, each mechanism of the capsule once


def _random_capsule(base, position: str = "first", options: str = ""):
    """A capsule with nonzero p (N(0, 0.02)) so the learned part is exercised too."""
    return load_guided(f"capsule:init=random,pos={position}{options}", base=base, seed=3)


def _p(guided, stack: str) -> torch.Tensor:
    """The capsule's p for ``stack``: [layers, d] (n = 1) or [layers, n, d]."""
    return guided.guidance_state_dict()[f"0.p.{stack}"]


def _per_layer(p: torch.Tensor) -> torch.Tensor:
    """p as [layers, n, d] (n = 1 is stored [layers, d])."""
    return p.unsqueeze(1) if p.dim() == 2 else p


def _index(mask, position):
    if position == "middle":  # before valid token n_valid // 2
        return [int(row.nonzero()[int(row.sum()) // 2]) for row in mask]
    return first_valid(mask) if position == "first" else after_last_valid(mask)


def capsule_vectors(p_i: torch.Tensor, mean: torch.Tensor, fusion: str) -> torch.Tensor:
    """[B, k, d] inserted at layer i: add S_i^j = p_i^j + Mean (k = n); prepend [p_i^1..p_i^n, Mean] (k = n + 1)."""
    if fusion == "add":
        return torch.stack([p_i[j] + mean for j in range(p_i.shape[0])], dim=1)
    return torch.stack([p_i[j].expand_as(mean) for j in range(p_i.shape[0])] + [mean], dim=1)


def capsule_mean(out: torch.Tensor, valid_with_capsule: torch.Tensor) -> torch.Tensor:
    """Mean(S_{i-1} ⊕ H_{i-1}): layer i-1's output [B, T+1, d] averaged over the capsule and the valid inputs."""
    return masked_mean(out, valid_with_capsule)


def reference_decoder_only(base, batch, p: torch.Tensor, position: str, fusion: str = "add") -> torch.Tensor:
    """Logits [B, T, V] with S_i spliced before every layer by hand, each layer run by the HF model itself.

    p: [layers, d] or [layers, n, d]. S_1 = p_1 + Mean(E) (E: the hidden states entering layer 1),
    S_i = p_i + Mean(S_{i-1} ⊕ H_{i-1}) with all k inserted positions of layer i-1 in S_{i-1}.
    ``run_block`` evaluates one layer inside a full HF forward over the concatenated T+1 positions, so
    masks (sliding windows included), position ids and rotary (per layer type) are the model's own.
    """
    blocks = base.adapter.blocks(base.model, "decoder")
    valid = batch.attention_mask.bool()
    index = _index(batch.attention_mask, position)
    x = run_block(base.model, blocks[0], batch.input_ids, batch.attention_mask, read="input")
    p = _per_layer(p)
    k = p.shape[1] + (fusion == "prepend")  # positions inserted per layer
    vn = insert_rows(valid, index, torch.ones_like(valid[:, :1]).expand(-1, k))
    mean = masked_mean(x, valid)  # Mean(E)
    for i, block in enumerate(blocks):
        s = capsule_vectors(p[i], mean, fusion)  # S_i = p_i + Mean(...)
        out = run_block(base.model, block, inputs=insert_rows(x, index, s), mask=vn.long())
        mean = capsule_mean(out, vn)
        x = drop_rows(out, index, k)
    return run_block(base.model, blocks[-1], batch.input_ids, batch.attention_mask, read="logits", output=x)


FULL_GRID = [(n, side, pos) for n in DECODERS for side in ("right", "left") for pos in ("first", "last")]
LEFT_ONLY = [(n, "left", pos) for n in DISCOVERED for pos in ("first", "last")]


@pytest.mark.parametrize("name,padding_side,position", FULL_GRID + LEFT_ONLY)
def test_capsule_equals_hand_loop_decoder_only(tiny_base, name, padding_side, position):
    base = tiny_base(name)
    batch = rte_batch(base, padding_side)
    guided = _random_capsule(base, position)
    with torch.no_grad():
        got = guided.forward(batch).logits
        want = reference_decoder_only(base, batch, _p(guided, "decoder"), position)
    valid = batch.attention_mask.bool()
    diff = float((got - want).abs()[valid].max())
    print(f"capsule {name} {padding_side} {position}: max abs diff {diff:.2e}")
    assert diff <= TOL


def reference_t5(base, batch, p_enc: torch.Tensor, p_dec: torch.Tensor, position: str, fusion: str = "add"):
    """(encoder output [B, T, d], decoder logits [B, S, V]) of T5 with capsules spliced by hand (p: see ``_per_layer``)."""
    m = base.model
    enc, dec = m.encoder, m.decoder
    x = enc.embed_tokens(batch.input_ids)
    valid = batch.attention_mask.bool()
    index = _index(batch.attention_mask, position)
    p_enc, p_dec = _per_layer(p_enc), _per_layer(p_dec)
    k = p_enc.shape[1] + (fusion == "prepend")  # positions inserted per layer
    pooled = None
    for i, block in enumerate(enc.block):
        mean = masked_mean(x, valid) if pooled is None else pooled  # Mean(E) or Mean(S_{i-1} ⊕ H_{i-1})
        xn = insert_rows(x, index, capsule_vectors(p_enc[i], mean, fusion))
        vn = insert_rows(valid, index, torch.ones_like(valid[:, :1]).expand(-1, k))
        mask = create_bidirectional_mask(config=enc.config, inputs_embeds=xn, attention_mask=vn.long())
        bias = enc.block[0].layer[0].SelfAttention.compute_bias(xn.shape[1], xn.shape[1])
        out = block(xn, mask, bias)[0]
        pooled = capsule_mean(out, vn)
        x = drop_rows(out, index, k)
    enc_out = enc.final_layer_norm(x)
    # decoder side: capsule first (target has no padding here)
    y = dec.embed_tokens(batch.target_ids)
    tvalid = batch.target_mask.bool()
    tindex = [0] * y.shape[0]
    pooled = None
    for i, block in enumerate(dec.block):
        mean = masked_mean(y, tvalid) if pooled is None else pooled
        yn = insert_rows(y, tindex, capsule_vectors(p_dec[i], mean, fusion))
        vn = insert_rows(tvalid, tindex, torch.ones_like(tvalid[:, :1]).expand(-1, k))
        self_mask = create_causal_mask(config=dec.config, inputs_embeds=yn, attention_mask=vn.long(), cache=None)
        cross_mask = create_bidirectional_mask(
            config=dec.config, inputs_embeds=yn, attention_mask=batch.attention_mask, encoder_hidden_states=enc_out
        )
        bias = dec.block[0].layer[0].SelfAttention.compute_bias(yn.shape[1], yn.shape[1])
        out = block(yn, self_mask, bias, enc_out, cross_mask, None)[0]
        pooled = capsule_mean(out, vn)
        y = drop_rows(out, tindex, k)
    h = dec.final_layer_norm(y)
    if m.config.scale_decoder_outputs:
        h = h * (m.model_dim**-0.5)
    return enc_out, m.lm_head(h)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("position", ["first", "last"])
def test_capsule_equals_hand_loop_t5(tiny_base, padding_side, position):
    base = tiny_base("tiny-t5")
    batch = rte_batch(base, padding_side)
    guided = _random_capsule(base, position)
    with torch.no_grad():
        out = guided.forward(batch)
        enc_want, logits_want = reference_t5(base, batch, _p(guided, "encoder"), _p(guided, "decoder"), position)
    valid = batch.attention_mask.bool()
    enc_diff = float((out.encoder_last_hidden_state - enc_want).abs()[valid].max())
    dec_diff = float((out.logits - logits_want).abs().max())
    print(f"capsule t5 {padding_side} {position}: encoder {enc_diff:.2e}, decoder logits {dec_diff:.2e}")
    assert enc_diff <= TOL and dec_diff <= TOL


TWO_GRID = [
    (n, fusion, side, pos)
    for n in DECODERS
    for fusion in ("add", "prepend")
    for side, pos in (("right", "first"), ("left", "middle"), ("left", "last"))
] + [(n, "prepend", "left", "middle") for n in DISCOVERED]


@pytest.mark.parametrize("name,fusion,padding_side,position", TWO_GRID)
def test_two_capsules_equal_hand_loop_decoder_only(tiny_base, name, fusion, padding_side, position):
    """n = 2: the n (add) or n + 1 (prepend) positions of the count ablation, computed by hand."""
    base = tiny_base(name)
    batch = rte_batch(base, padding_side)
    guided = _random_capsule(base, position, f",n=2,fusion={fusion}")
    p = _p(guided, "decoder")
    assert p.shape == (base.num_layers, 2, base.hidden_size) and not torch.equal(p[:, 0], p[:, 1])
    with torch.no_grad():
        got = guided.forward(batch).logits
        want = reference_decoder_only(base, batch, p, position, fusion)
    valid = batch.attention_mask.bool()
    diff = float((got - want).abs()[valid].max())
    print(f"capsule n=2 {fusion} {name} {padding_side} {position}: max abs diff {diff:.2e}")
    assert diff <= TOL


@pytest.mark.parametrize("fusion", ["add", "prepend"])
@pytest.mark.parametrize("position", ["first", "last"])
def test_two_capsules_equal_hand_loop_t5(tiny_base, fusion, position):
    base = tiny_base("tiny-t5")
    batch = rte_batch(base, "right")
    guided = _random_capsule(base, position, f",n=2,fusion={fusion}")
    with torch.no_grad():
        out = guided.forward(batch)
        enc_want, logits_want = reference_t5(
            base, batch, _p(guided, "encoder"), _p(guided, "decoder"), position, fusion
        )
    valid = batch.attention_mask.bool()
    enc_diff = float((out.encoder_last_hidden_state - enc_want).abs()[valid].max())
    dec_diff = float((out.logits - logits_want).abs().max())
    print(f"capsule n=2 {fusion} t5 {position}: encoder {enc_diff:.2e}, decoder logits {dec_diff:.2e}")
    assert enc_diff <= TOL and dec_diff <= TOL


def test_untrained_capsule_is_the_mean_token(tiny_base):
    """p = 0: the first layer's capsule is exactly Mean(E)."""
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "left")
    guided = load_guided("capsule", base=base)
    assert float(_p(guided, "decoder").abs().max()) == 0.0
    seen = {}
    norm = base.model.model.layers[0].input_layernorm  # sees the spliced sequence entering layer 0
    handle = norm.register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0]))
    try:
        with torch.no_grad():
            guided.forward(batch)
    finally:
        handle.remove()
    x = seen["x"]  # spliced input of layer 0
    index = first_valid(batch.attention_mask)
    embeds = base.model.model.embed_tokens(batch.input_ids)
    want = masked_mean(embeds, batch.attention_mask.bool())
    got = torch.stack([x[b, i] for b, i in enumerate(index)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
