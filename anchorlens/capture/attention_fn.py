"""The attention function anchorlens registers: the model's own attention math, exact probabilities on demand.

Outside a capture session (and at sites that are not selected) the output is PyTorch's
scaled-dot-product attention, exactly as with ``attn_implementation="sdpa"``. The recompute mirrors
everything transformers passes to an attention function, as its ``eager_attention_forward`` does:
``scaling`` (e.g. Gemma's ``query_pre_attn_scalar``), ``softcap`` (scores = tanh(scores / softcap) *
softcap before the mask), sliding windows (in the boolean mask, or from ``sliding_window`` when the mask
was skipped), ``s_aux`` learned sinks (one extra logit per head in the softmax: the real keys' probabilities sum to less than 1,
and the sink's own mass travels with the event as ``learned_sink``, so real keys + learned sink = 1),
T5's ``position_bias`` and grouped-query heads.

Where sdpa cannot compute a module's output (``softcap``, ``s_aux``, or a sliding window with no mask),
the output is computed from the probabilities with eager math at *every* call of that module, so logits
equal HF eager. At captured sites two modes exist (:class:`~anchorlens.capture.options.CaptureOptions`):

- ``fast`` (default): probabilities of all heads are computed once and the output is ``probs @ V``.
  Probabilities are exact; the output agrees with sdpa to float rounding (~1e-6), not bitwise. When the
  sink asks for sums of the probabilities over key columns (the built-in reducers do: mass per key role,
  on the first key, ...), the columns sit beside V in the same product, ``probs @ [V | columns]``: on a
  CPU that costs a fraction of a separate pass over the probabilities.
- ``strict``: the output is sdpa's, bit for bit, and probabilities are recomputed separately for the
  selected heads only.

Queries are processed in chunks so the float32 score buffers never exceed the memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from anchorlens.capture import session as _session
from anchorlens.capture.options import DEFAULT_MEMORY_BUDGET
from anchorlens.capture.selection import Site
from anchorlens.capture.value_norms import value_norms
from anchorlens.methods.knockout import KnockoutEdit, current_edit, recording, register_attention_installer

ATTN_IMPLEMENTATION = "anchorlens"
_NEG = torch.finfo(torch.float32).min
# float32 buffers of size [B, H, q, K] alive at once per chunk: logits, probs, a reducer temporary
# (p·logits for entropy), and one spare for a custom reducer's or the sinks' softmax temporaries
_BUFFERS_PER_CHUNK = 4
# causal calls are split into query chunks of at least this many probabilities, at most this many chunks
_MIN_CHUNK_ELEMENTS = 1 << 20
_MAX_CAUSAL_CHUNKS = 16


@dataclass(frozen=True)
class AttentionCall:
    """One call of an attention module, normalized.

    query: [B, H, Q, D]; key/value: [B, H_kv, K, D]; mask: None, bool [B|1, 1, Q, K'] (True = visible) or
    additive float, K' >= K; position_bias: [B|1, H|1, Q, K'] or None; sinks: [H] or None.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    causal: bool
    position_bias: torch.Tensor | None
    softcap: float | None
    window: int | None
    sinks: torch.Tensor | None

    @property
    def groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.query.shape[1] // self.key.shape[1]

    @property
    def needs_eager_output(self) -> bool:
        """Whether sdpa cannot produce this call's output (soft-capping, sinks, an unmasked window)."""
        window_skipped = (
            self.mask is None and self.window is not None and self.causal and self.window < self.key.shape[2]
        )
        return self.softcap is not None or self.sinks is not None or window_skipped


def visible_keys(call: AttentionCall, start: int, stop: int) -> torch.Tensor:
    """[B|1, 1, q, K] bool: which keys queries ``start:stop`` may see (mask, causality, sliding window)."""
    q_len, k_len = call.query.shape[2], call.key.shape[2]
    dev = call.query.device
    if call.mask is not None:
        mask = call.mask[..., start:stop, :k_len]
        if mask.dtype != torch.bool:
            mask = mask > torch.finfo(mask.dtype).min / 2
        return mask
    if not call.causal:
        return torch.ones(1, 1, stop - start, k_len, dtype=torch.bool, device=dev)
    rows = torch.arange(start, stop, device=dev)[:, None] + (k_len - q_len)  # absolute query positions
    cols = torch.arange(k_len, device=dev)[None, :]
    seen = rows >= cols
    if call.window is not None:
        seen &= cols > rows - call.window
    return seen.view(1, 1, stop - start, k_len)


@dataclass(frozen=True)
class Visibility:
    """Visibility of one query chunk, shared by every layer that gets the same mask.

    Covers the key prefix ``0:key_stop`` that holds every key some query of the chunk may see (a causal
    chunk sees no key after its last query, so the masked upper triangle is never computed).
    visible: [B|1, 1, q, key_stop] bool; hidden: its negation; bias: [B|1, 1, q, key_stop] float32, 0
    where visible and a very negative finite number elsewhere (adding it is several times cheaper than a
    boolean ``masked_fill`` broadcast over heads); empty: [B|1, 1, q, 1] bool, queries that see no key, or
    None when every query sees one.
    """

    visible: torch.Tensor
    hidden: torch.Tensor
    bias: torch.Tensor
    empty: torch.Tensor | None

    @property
    def key_stop(self) -> int:
        """Keys ``key_stop:`` are hidden from every query of the chunk."""
        return self.visible.shape[-1]

    @classmethod
    def of(cls, call: AttentionCall, start: int, stop: int) -> Visibility:
        """Compute the visibility of queries ``start:stop``."""
        visible = visible_keys(call, start, stop)
        seen = visible.flatten(0, -2).any(0).nonzero()  # keys any query of the chunk sees
        visible = visible[..., : max(1, int(seen[-1]) + 1 if seen.numel() else 1)]
        hidden = ~visible
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=visible.device).masked_fill_(hidden, _NEG)
        empty = ~visible.any(dim=-1, keepdim=True)
        return cls(visible, hidden, bias, empty if bool(empty.any()) else None)


def chunk_rows(call: AttentionCall, heads: int, budget_bytes: int, causal: bool = False) -> int:
    """Queries per chunk so that the float32 buffers [B, heads, rows, K] fit ``budget_bytes``.

    With ``causal`` attention, smaller chunks skip more of the hidden upper triangle (a chunk needs only
    the keys up to its last query: 2 chunks compute 3/4 of the square, 8 chunks 9/16), at a fixed cost per
    chunk; chunks stay at least ``_MIN_CHUNK_ELEMENTS`` probabilities and at most ``_MAX_CAUSAL_CHUNKS``.
    """
    b, q, k = call.query.shape[0], call.query.shape[2], call.key.shape[2]
    per_row = b * max(heads, 1) * (k + 1) * 4 * _BUFFERS_PER_CHUNK
    rows = max(1, min(q, budget_bytes // per_row))
    if causal:
        least = -(-_MIN_CHUNK_ELEMENTS // (b * max(heads, 1) * k))
        rows = min(rows, max(least, -(-q // _MAX_CAUSAL_CHUNKS)))
    return rows


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


def _shared_visibility(active: _session.CaptureSession, call: AttentionCall, start: int, stop: int) -> Visibility:
    """The chunk's visibility, computed once per mask and chunk for all layers of one forward."""
    return active.shared.get(
        ("visibility", call.mask, start, stop, call.query.shape[2], call.key.shape[2], call.causal, call.window),
        lambda: Visibility.of(call, start, stop),
    )


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


def _shared_edited_visibility(
    active: _session.CaptureSession,
    vis: Visibility,
    edit: KnockoutEdit | None,
    start: int,
    stop: int,
    heads: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`edited_visibility`, once per mask, edit and chunk for the layers of a forward (the knockout shares one
    edit between the layers it acts on, so their events share one tensor and reducers reduce them together)."""
    if edit is None or (edit.before is None and edit.after is None):
        return vis.visible
    return active.shared.get(
        ("edited_visibility", vis.visible, edit.before, edit.after, start, stop, heads),
        lambda: edited_visibility(vis.visible, edit, start, stop, heads),
    )


def _grouped_product(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[B, H, q, W]: probabilities [B, H, q, K'] of the first K' keys times ``values`` [B, H_kv, K, W] (the query
    heads of a group share their kv head's values: [B, H_kv, G*q, K'] x [B, H_kv, K', W], nothing repeated)."""
    b, h, q, k = probs.shape
    kv = values.shape[1]
    return torch.matmul(probs.reshape(b, kv, (h // kv) * q, k), values[:, :, :k]).view(b, h, q, -1)


def output_from_probs(call: AttentionCall, probs: torch.Tensor, dropout: float, training: bool) -> torch.Tensor:
    """Eager output [B, q, H, D] from all-head probabilities [B, H, q, K'] of the first K' keys (value dtype)."""
    weights = torch.nn.functional.dropout(probs, p=dropout, training=training).to(call.value.dtype)
    return _grouped_product(weights, call.value).transpose(1, 2)


def mean_ablated_output(
    call: AttentionCall,
    probs: torch.Tensor,
    mean: torch.Tensor,
    mean_value: torch.Tensor,
    dropout: float,
    training: bool,
) -> torch.Tensor:
    """Eager output [B, q, H, D] where the (query, key) pairs of ``mean`` [B, H|1, q, K'] read ``mean_value``
    [B, H_kv, K, D] (the values of the keys' mean state) instead of the call's values."""
    weights = torch.nn.functional.dropout(probs, p=dropout, training=training)
    own = output_from_probs(call, weights.masked_fill(mean, 0.0), 0.0, False)
    return own + output_from_probs(replace(call, value=mean_value), weights.masked_fill(~mean, 0.0), 0.0, False)


def fused_width(head_dim: int, num_columns: int) -> int:
    """W: the values' D plus C key columns, rounded up to a multiple of 16 (where a CPU matmul runs fastest)."""
    return -(-(head_dim + num_columns) // 16) * 16


def value_with_columns(value: torch.Tensor, columns: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Fill and return ``out`` [B, H_kv, K, W]: ``value`` [B, H_kv, K, D], then the key columns [B, K, C] in every
    head, then zeros up to W (:func:`fused_width`): one product with the probabilities gives the output and the
    column sums."""
    d, c = value.shape[-1], columns.shape[-1]
    out[..., :d] = value
    out[..., d : d + c] = columns[:, None, : value.shape[2]].to(value.dtype)
    out[..., d + c :] = 0.0
    return out


@dataclass(frozen=True)
class FusedColumns:
    """The sink's key columns [B, K, C] and the values with them beside V, [B, H_kv, K, W] (float32)."""

    columns: torch.Tensor
    values: torch.Tensor

    def output_and_sums(self, probs: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Output [B, q, H, D] and key-column sums [B, H, q, C] from probabilities [B, H, q, K'] of the first K' keys
        (no dropout: the sums are of the probabilities)."""
        both = _grouped_product(probs, self.values)
        return both[..., :head_dim].transpose(1, 2), both[
            ..., head_dim : head_dim + self.columns.shape[-1]
        ].contiguous()


def _fused_columns(
    active: _session.CaptureSession, site: Site, call: AttentionCall, dropout: float, training: bool
) -> FusedColumns | None:
    """The key columns to sum in the output's product at this call, with the values beside them (in a buffer the
    session reuses), or None: the sink asks for none, the values are not float32, dropout is active, autograd
    records, or the columns do not fit the keys."""
    value = call.value
    if value.dtype != torch.float32 or (dropout > 0 and training) or torch.is_grad_enabled():
        return None
    columns = active.key_columns(site, value.device, torch.float32)
    b, kv, k, d = value.shape
    if columns is None or columns.shape[0] != b or columns.shape[1] < k:
        return None
    width = fused_width(d, columns.shape[-1])
    size = b * kv * k * width
    out = active.scratch_buffer("value_columns", size, torch.float32, value.device)[:size].view(b, kv, k, width)
    return FusedColumns(columns, value_with_columns(value, columns, out))


def _sdpa_output(module, call: AttentionCall, dropout: float, is_causal: bool | None, kwargs: dict) -> torch.Tensor:
    """[B, Q, H, D] from transformers' own sdpa path (the plain ``sdpa`` output, bit for bit)."""
    output, _ = sdpa_attention_forward(
        module,
        call.query,
        call.key,
        call.value,
        call.mask,
        dropout=dropout,
        scaling=call.scaling,
        is_causal=is_causal,
        position_bias=call.position_bias,
        **kwargs,
    )
    return output


def anchorlens_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    softcap: float | None = None,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention with the model's eager semantics that also reports probabilities to the active session."""
    kwargs.pop("output_attentions", None)
    if recording(module, key, value):  # a mean knockout's key/value from the mean state, kept for the real call
        return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    call = AttentionCall(
        query,
        key,
        value,
        attention_mask,
        scaling=query.shape[-1] ** -0.5 if scaling is None else float(scaling),
        causal=bool(query.shape[2] > 1 and attention_mask is None and causal),
        position_bias=position_bias,
        softcap=softcap,
        window=sliding_window,
        sinks=s_aux,
    )
    active = _session.current()
    site = None if active is None else active.site_of(module)
    heads = None if active is None or site is None else active.heads_tensor(query.device)
    edit = current_edit(module, query, key)  # a knockout acting here: eager math over all heads
    edit = None if edit is None else edit.aligned(key, value)
    # fast mode computes the output from the probabilities when they cover all heads anyway
    fast = site is not None and active is not None and active.options.mode == "fast" and heads is None
    eager = call.needs_eager_output or fast or edit is not None
    if not eager:
        output = _sdpa_output(module, call, dropout, is_causal, kwargs)
        if site is None or active is None:
            return output, None
    width = query.shape[1] if eager or heads is None else heads.numel()
    budget = active.options.memory_budget if active is not None else DEFAULT_MEMORY_BUDGET
    rows = chunk_rows(call, width, budget, causal=bool(causal) and active is not None)
    parts = []
    with torch.set_grad_enabled(eager and torch.is_grad_enabled()):
        # logits and probabilities live only until the chunk's event is consumed: one pair of buffers
        # serves every layer (and every batch of a stream)
        buffers = None
        if active is not None and not torch.is_grad_enabled():
            size = call.query.shape[0] * width * rows * call.key.shape[2]  # [B, width, rows, K]
            dev = call.query.device
            buffers = (
                active.scratch_buffer("logits", size, torch.float32, dev),
                active.scratch_buffer("probs", size, torch.float32, dev),
            )
        # fast mode: the key columns the sink wants summed ride along in the output's product
        fused = None
        if fast and active is not None and site is not None and edit is None:
            fused = _fused_columns(active, site, call, dropout, module.training)
        norms = None  # ||v_j W_O^h|| per head and key, once per call, when the sink reads them
        if site is not None and active is not None and active.wants_value_norms:
            norms = value_norms(module, call.value, call.query.shape[1])
            norms = norms if heads is None else norms.index_select(1, heads)
        for start in range(0, call.query.shape[2], rows):
            stop = min(start + rows, call.query.shape[2])
            vis = None if active is None else _shared_visibility(active, call, start, stop)
            probs, scores, log_norm, vis = chunk_probs(call, start, stop, None if eager else heads, vis, buffers, edit)
            key_sums = None
            removed = None if edit is None else KnockoutEdit.chunk(edit.value, start, stop, probs.shape[-1])
            if fused is not None:
                output_part, key_sums = fused.output_and_sums(probs, call.value.shape[-1])
                parts.append(output_part)
            elif eager:
                weights = probs if removed is None else probs.masked_fill(removed, 0.0)  # the keys' values zeroed
                mean = None if edit is None else KnockoutEdit.chunk(edit.mean, start, stop, probs.shape[-1])
                if mean is not None and edit is not None and edit.mean_value is not None:
                    parts.append(mean_ablated_output(call, weights, mean, edit.mean_value, dropout, module.training))
                else:
                    parts.append(output_from_probs(call, weights, dropout, module.training))
            if site is not None and active is not None:
                if eager and heads is not None:
                    probs, scores = probs.index_select(1, heads), scores.index_select(1, heads)
                    log_norm = log_norm.index_select(1, heads)
                sink = None if call.sinks is None else learned_sink_mass(call, log_norm, heads, vis)
                visible = _shared_edited_visibility(active, vis, edit, start, stop, heads if eager else None)
                active.emit(
                    site,
                    probs.detach(),
                    visible,
                    start,
                    scores.detach(),
                    log_norm.detach(),
                    key_sums=key_sums,
                    key_columns=None if fused is None else fused.columns,
                    learned_sink=sink,
                    value_norms=norms,
                )
            del probs, scores, log_norm
    if eager:
        output = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return output.contiguous(), None


def register() -> str:
    """Register the attention function and its mask builder under ``"anchorlens"`` (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, anchorlens_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


def install(model: torch.nn.Module) -> None:
    """Switch ``model`` to the anchorlens attention function (sdpa underneath); idempotent, lazy.

    Models load with plain sdpa; the first capture installs this function, which behaves exactly
    like sdpa whenever no capture session is active (and like eager where sdpa cannot, see above).
    """
    register()
    if getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)  # type: ignore[operator]


register_attention_installer(install)  # knockouts (anchorlens.methods.knockout) act through this function
