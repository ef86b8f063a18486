"""Exact attention probabilities of one chunk of queries, as eager attention computes them, and what edits leave."""

from __future__ import annotations

import torch

from anchorlens.engine.call import _NEG, AttentionCall, Visibility
from anchorlens.engine.edit import KnockoutEdit


def chunk_probs(
    call: AttentionCall,
    start: int,
    stop: int,
    heads: torch.Tensor | None,
    vis: Visibility | None = None,
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None,
    edit: KnockoutEdit | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Visibility]:
    """Probabilities and logits [B, H_sel, q, K], log normaliser [B, H_sel, q, 1] (float32), visibility.

    Mirrors eager attention: softmax(softcap(q·kᵀ·scaling) + bias + mask [, sink]) in float32. Rows of
    queries that see no key are all zero. The logits are very negative (finite) where not visible, and
    log p = logits - log_norm wherever p > 0: no logarithm over [q, K].
    ``buffers``: optional (logits, probs) flat float32 tensors of at least B·H_sel·q·K elements each that
    receive the two [q, K] results (reusing them across layers saves two large allocations, and their
    page faults, per call; never with autograd). ``edit``: a knockout's weights to remove (all heads only):
    ``before`` is masked before the softmax (queries left with no key get zero rows), ``after`` zeroed after it
    (``log_norm`` stays the softmax's); the pairs of ``mean`` score against ``mean_key`` instead of the key.
    """
    vis = vis if vis is not None else Visibility.of(call, start, stop)
    query = call.query[:, :, start:stop]
    key = call.key[:, :, : vis.key_stop]
    bias = call.position_bias
    sinks = call.sinks
    if heads is not None:
        query = query.index_select(1, heads)
        key = key.index_select(1, torch.div(heads, call.groups, rounding_mode="floor"))
        if bias is not None and bias.shape[1] > 1:
            bias = bias.index_select(1, heads)
        if sinks is not None:
            sinks = sinks.index_select(0, heads)
        groups = 1
    else:
        groups = call.groups
    b, h, q, d = query.shape
    kv = key.shape[1]
    # scaling the keys (fewer than the queries with grouped heads) instead of the [q, K] scores; grouped
    # heads share their key: [B, H_kv, G*q, D] x [B, H_kv, D, K] needs no repeated keys
    rows = query.float().reshape(b, kv, groups * q, d)
    keys_t = (key.float() * call.scaling).transpose(-1, -2)
    k_len = keys_t.shape[-1]
    if buffers is not None:
        out = buffers[0][: b * h * q * k_len].view(b, kv, groups * q, k_len)
        scores = torch.matmul(rows, keys_t, out=out).view(b, h, q, k_len)
    else:
        scores = torch.matmul(rows, keys_t).view(b, h, q, k_len)
    mean = None if edit is None else KnockoutEdit.chunk(edit.mean, start, stop, k_len)
    if mean is not None and edit is not None and edit.mean_key is not None:  # mean ablation: the mean state's keys
        mean_t = (edit.mean_key[:, :, :k_len].float() * call.scaling).transpose(-1, -2)
        scores = torch.where(mean, torch.matmul(rows, mean_t).view(b, h, q, k_len), scores)
    if call.softcap is not None:
        scores.div_(call.softcap).tanh_().mul_(call.softcap)
    if bias is not None:
        scores.add_(bias[..., start:stop, :k_len].float())
    if call.mask is not None and call.mask.dtype != torch.bool:
        scores.add_(call.mask[..., start:stop, :k_len].float().clamp_min(_NEG))
        scores.masked_fill_(vis.hidden, _NEG)  # hidden logits exactly _NEG, never -inf
    else:
        scores.add_(vis.bias)  # finite logits + _NEG stay finite (no -inf, so p * logits is never NaN)
    before = None if edit is None else KnockoutEdit.chunk(edit.before, start, stop, k_len)
    if before is not None:
        scores.masked_fill_(before, _NEG)
    top = scores.amax(dim=-1, keepdim=True)  # values only: several times cheaper than max() with indices
    if sinks is not None:
        logits = torch.cat([scores, sinks.float().view(1, -1, 1, 1).expand(b, h, q, 1)], dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :k_len]
        del logits
    elif buffers is not None:
        probs = buffers[1][: b * h * q * k_len].view(b, h, q, k_len)
        torch.ops.aten._softmax.out(scores, -1, False, out=probs)
    else:
        probs = torch.softmax(scores, dim=-1)
    if vis.empty is not None:
        probs.masked_fill_(vis.empty, 0.0)  # queries that see no key: zero rows, not uniform
    if before is not None:  # every key a query saw is knocked out: a zero row (out of place: autograd needs probs)
        probs = probs.masked_fill(top <= _NEG, 0.0)
    # the top key has the largest logit and probability: p_top = exp(top - log Z), so log Z = top - log p_top
    log_norm = probs.amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny).log_().neg_().add_(top)
    after = None if edit is None else KnockoutEdit.chunk(edit.after, start, stop, k_len)
    if after is not None:
        probs = probs.masked_fill(after, 0.0)
    return probs, scores, log_norm, vis


def learned_sink_mass(
    call: AttentionCall, log_norm: torch.Tensor, heads: torch.Tensor | None, vis: Visibility
) -> torch.Tensor:
    """[B, H_sel, q] float32: the probability the learned sink logit (``s_aux``) takes in each query's softmax.

    exp(sink - log Z) with Z the normaliser over the real keys and the sink (``log_norm``), so the real keys'
    probabilities plus this mass sum to 1; 0 for queries that see no key (their rows are zero too).
    """
    assert call.sinks is not None
    sinks = call.sinks if heads is None else call.sinks.index_select(0, heads)
    mass = (sinks.float().view(1, -1, 1, 1) - log_norm).exp_()
    if vis.empty is not None:
        mass = mass.masked_fill(vis.empty, 0.0)
    return mass.squeeze(-1)


def edited_visibility(
    visible: torch.Tensor, edit: KnockoutEdit | None, start: int, stop: int, heads: torch.Tensor | None
) -> torch.Tensor:
    """[B|1, H|1, q, K'] bool: ``visible`` [B|1, 1, q, K'] less the keys a knockout takes out of the softmax for
    queries ``start:stop`` (``renorm``: masked before it; ``zero``: zeroed after it), the heads ``heads`` of the event
    (None: all) where the knockout picks heads. ``value`` and ``mean`` knockouts leave the weights, and visibility,
    as they are. The keys a query can actually attend to: what entropy normalises by and role means count."""
    if edit is None:
        return visible
    removed = None
    for mask in (edit.before, edit.after):
        part = KnockoutEdit.chunk(mask, start, stop, visible.shape[-1])
        if part is not None:
            removed = part if removed is None else removed | part
    if removed is None:
        return visible
    out = visible & ~removed
    if heads is not None and out.shape[1] > 1:
        out = out.index_select(1, heads)
    return out
