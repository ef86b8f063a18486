"""The attention function anchorlens registers: the model's own attention math, exact probabilities on demand.

Outside an observer (a capture session: :class:`~anchorlens.engine.observer.Observer`), at sites it does not
observe and where no edit (a knockout: :class:`~anchorlens.engine.edit.AttentionEditor`) acts, the output is PyTorch's
scaled-dot-product attention, exactly as with ``attn_implementation="sdpa"``. Both come from the one engine context
(:mod:`~anchorlens.engine.context`). The recompute mirrors
everything transformers passes to an attention function, as its ``eager_attention_forward`` does:
``scaling`` (e.g. Gemma's ``query_pre_attn_scalar``), ``softcap`` (scores = tanh(scores / softcap) *
softcap before the mask), sliding windows (in the boolean mask, or from ``sliding_window`` when the mask
was skipped), ``s_aux`` learned sinks (one extra logit per head in the softmax: the real keys' probabilities sum to less than 1,
and the sink's own mass travels with the event as ``learned_sink``, so real keys + learned sink = 1),
T5's ``position_bias`` and grouped-query heads.

Where sdpa cannot compute a module's output (``softcap``, ``s_aux``, or a sliding window with no mask),
the output is computed from the probabilities with eager math at *every* call of that module, so logits
equal HF eager. At observed sites two modes exist (the observer's ``options.mode``, a capture's
:class:`~anchorlens.capture.options.CaptureOptions`):

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

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from anchorlens.engine.call import (
    DEFAULT_MEMORY_BUDGET,
    AttentionCall,
    KeySpan,
    Visibility,
    chunk_rows,
    trim_unseen_keys,
    visible_keys,
)
from anchorlens.engine.context import current
from anchorlens.engine.edit import KnockoutEdit
from anchorlens.engine.kernel import KernelCall, KernelPlan, additive_mask, kernel_refusal
from anchorlens.engine.observer import Observer
from anchorlens.engine.output import (
    FusedColumns,
    fused_width,
    mean_ablated_output,
    output_from_probs,
    value_with_columns,
)
from anchorlens.engine.plan import KERNEL, choose_plan
from anchorlens.engine.probs import chunk_probs, edited_visibility, learned_sink_mass
from anchorlens.engine.quantities import KEY_SUMS, RECEIVED, SCORE_SUMS, VALUE_SUMS
from anchorlens.engine.value_norms import value_norms
from anchorlens.models.adapters.site import Site

ATTN_IMPLEMENTATION = "anchorlens"


def _shared_visibility(active: Observer, call: AttentionCall, start: int, stop: int) -> Visibility:
    """The chunk's visibility, computed once per mask and chunk for all layers of one forward."""
    return active.shared.get(
        ("visibility", call.mask, start, stop, call.query.shape[2], call.key.shape[2], call.causal, call.window),
        lambda: Visibility.of(call, start, stop),
    )


def _shared_kernel_visible(active: Observer, call: AttentionCall, start: int, stop: int) -> torch.Tensor | KeySpan:
    """The keys queries ``start:stop`` see, once per mask and chunk for the layers of a forward: [B|1, 1, q, K'] bool,
    trimmed as :class:`Visibility` trims (the kernel plan needs no logit bias: an eighth of the memory), or for a call
    without a mask their :class:`KeySpan` (O(q): a forward's chunks together would otherwise hold Q·K bytes)."""

    def compute() -> torch.Tensor | KeySpan:
        span = KeySpan.of(call, start, stop)
        return span if span is not None else trim_unseen_keys(visible_keys(call, start, stop))

    return active.shared.get(
        ("kernel_visible", call.mask, start, stop, call.query.shape[2], call.key.shape[2], call.causal, call.window),
        compute,
    )


def _shared_edited_visibility(
    active: Observer,
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


def _fused_columns(
    active: Observer, site: Site, call: AttentionCall, dropout: float, training: bool
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


def _kernel_plan(active: Observer, site: Site, call: AttentionCall) -> KernelPlan:
    """The kernel plan of the sink's columns over this call's keys, once per forward (the layers share it)."""
    dev, k_len = call.query.device, call.key.shape[2]
    columns = active.key_columns(site, dev, torch.float32)
    scored = active.score_columns(site, dev, torch.float32)
    received, weighed = RECEIVED in active.reads, VALUE_SUMS in active.reads
    return active.shared.get(
        ("kernel_plan", columns, scored, k_len, call.query.shape[-1], received, weighed),
        lambda: KernelPlan.of(columns, scored, k_len, call.query.shape[-1], received=received, value_sums=weighed),
    )


def _kernel_refusal(
    active: Observer, site: Site, call: AttentionCall, edited: bool, dropout: float, training: bool
) -> str | None:
    """:func:`kernel_refusal`, and whether the sink's columns cover the call's keys."""
    why = kernel_refusal(call, edited, dropout, training)
    if why is not None:
        return why
    dev, k_len = call.query.device, call.key.shape[2]
    keyed = active.key_columns(site, dev, torch.float32)
    for quantity, columns in (
        (KEY_SUMS, keyed),
        (VALUE_SUMS, keyed),
        (SCORE_SUMS, active.score_columns(site, dev, torch.float32)),
    ):
        if columns is None and quantity in active.reads:  # the readers ask for different columns
            return f"the reducers that read {quantity} sum over different key columns"
        if columns is not None and (columns.shape[0] != call.query.shape[0] or columns.shape[1] < k_len):
            return "the sink's key columns do not cover the call's keys"
    return None


def _kernel_forward(
    module: torch.nn.Module,
    active: Observer,
    site: Site,
    call: AttentionCall,
    heads: torch.Tensor | None,
    dropout: float,
    is_causal: bool | None,
    kwargs: dict,
) -> torch.Tensor:
    """[B, Q, H, D]: the output, with the statistics the sink reads from the kernel's log-sum-exp handed over in
    events of query chunks (no probabilities, :mod:`~anchorlens.engine.kernel`): the kernel passes run over all
    queries, the chunks bound what grows with Q·K (visibility, small-set sums) as the materialised plan's do."""
    dev = call.query.device
    columns = active.key_columns(site, dev, torch.float32)
    scored = active.score_columns(site, dev, torch.float32)
    additive = active.shared.get(  # once per mask for the layers of a forward, as sdpa would build it per layer
        ("kernel_additive", call.mask, call.query.shape[2], call.key.shape[2], call.query.dtype),
        lambda: additive_mask(call),
    )
    whole = KernelCall(call, columns, scored, _kernel_plan(active, site, call), additive)
    strict = active.options.mode != "fast"  # strict: sdpa's own output, bit for bit
    output = _sdpa_output(module, call, dropout, is_causal, kwargs) if strict else whole.output
    norms = value_norms(module, call.value, call.query.shape[1]) if active.wants_value_norms else None
    if norms is not None and VALUE_SUMS in active.reads:
        whole.weigh_values(norms)
    norms = norms if norms is None or heads is None else norms.index_select(1, heads)
    q_len = call.query.shape[2]
    valid = active.valid_queries(site, dev).float() if RECEIVED in active.reads else None
    rows = chunk_rows(call, call.query.shape[1], active.options.memory_budget, causal=call.causal)
    for start in range(0, q_len, rows):
        stop = min(start + rows, q_len)
        visible = _shared_kernel_visible(active, call, start, stop)
        got = whole.chunk(start, stop, visible)
        lse, key_sums, score_sums = got.lse, got.key_sums, got.score_sums
        received = None if valid is None else whole.received(start, stop, visible, valid[:, start:stop])
        value_sums = got.value_sums
        if heads is not None:
            value_sums = None if value_sums is None else value_sums.index_select(1, heads)
            lse = lse.index_select(1, heads)
            key_sums = None if key_sums is None else key_sums.index_select(1, heads)
            score_sums = None if score_sums is None else score_sums.index_select(1, heads)
            received = None if received is None else received.index_select(1, heads)
        active.emit(
            site,
            None,
            visible,
            start,
            None,
            lse,
            key_sums=key_sums,
            key_columns=columns,
            value_norms=norms,
            score_sums=score_sums,
            score_columns=scored,
            plan=KERNEL,
            received=received,
            value_sums=value_sums,
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
    """Attention with the model's eager semantics that applies the active edit and reports probabilities to the
    active observer (:func:`~anchorlens.engine.context.current`)."""
    kwargs.pop("output_attentions", None)
    context = current()
    editor = context.edit
    if editor is not None and editor.record(module, key, value):  # a mean knockout's key/value from the mean state
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
    active = context.observer
    site = None if active is None else active.site_of(module)
    heads = None if active is None or site is None else active.heads_tensor(query.device)
    edit = None if editor is None else editor.call_edit(module, query, key)  # a knockout here: eager, all heads
    edit = None if edit is None else edit.aligned(key, value)
    if site is not None and active is not None:
        observer, observed = active, site
        plan = choose_plan(
            active.options.plan,
            active.reads,
            active.readers,
            site.name,
            lambda: _kernel_refusal(observer, observed, call, edit is not None, dropout, module.training),
            lambda: _kernel_plan(observer, observed, call).passes,
            query.device.type,
            key.shape[2],
        )
        active.note_plan(site, plan)
        if plan == KERNEL:
            return _kernel_forward(module, active, site, call, heads, dropout, is_causal, kwargs), None
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
    like sdpa whenever no observer or edit is active (and like eager where sdpa cannot, see above).
    """
    register()
    if getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)  # type: ignore[operator]
