"""The attention function anchorlens registers: sdpa for the output, exact probabilities on demand.

The model keeps computing its output with PyTorch's scaled-dot-product attention. Only while a
capture session is active, and only at selected sites, the probabilities are recomputed as
softmax(q·kᵀ·scale + bias + mask) in float32 for the selected heads and handed to the session.
"""
from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from anchorlens.capture import session as _session

ATTN_IMPLEMENTATION = "anchorlens"


def visible_keys(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    is_causal: bool,
) -> torch.Tensor:
    """[B|1, 1, Q, K] bool: which keys each query may see, from the model's mask (bool or additive)."""
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        if is_causal:
            offset = k_len - q_len
            rows = torch.arange(q_len, device=query.device)[:, None] + offset
            return (rows >= torch.arange(k_len, device=query.device)[None, :]).view(1, 1, q_len, k_len)
        return torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=query.device)
    if attention_mask.dtype == torch.bool:
        mask = attention_mask
    else:
        mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return mask[..., :k_len].expand(mask.shape[0], 1, q_len, k_len)


def attention_probs(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    is_causal: bool,
    position_bias: torch.Tensor | None,
    heads: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute probabilities [B, H_sel, Q, K] (float32) and the visibility mask [B|1, 1, Q, K]."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = repeat_kv(key, groups)
    if heads is not None:
        query = query.index_select(1, heads)
        key = key.index_select(1, heads) if key.shape[1] > 1 else key
        if position_bias is not None and position_bias.shape[1] > 1:
            position_bias = position_bias.index_select(1, heads)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)).mul_(scale)  # in place: one [B,H,Q,K] buffer
    if position_bias is not None:
        scores.add_(position_bias[..., : key.shape[2]].float())
    visible = visible_keys(query, key, attention_mask, is_causal)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        scores.add_(attention_mask[..., : key.shape[2]].float().clamp_min(torch.finfo(torch.float32).min))
    scores.masked_fill_(~visible, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    # Queries that see no key at all (fully padded rows) get all-zero rows, not uniform ones.
    probs.mul_(visible.any(dim=-1, keepdim=True))
    return probs, visible


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
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Drop-in sdpa attention that also reports probabilities to the active capture session."""
    kwargs.pop("output_attentions", None)
    output, _ = sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        position_bias=position_bias,
        **kwargs,
    )
    active = _session.current()
    if active is None:
        return output, None
    site = active.site_of(module)
    if site is None:
        return output, None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    with torch.no_grad():
        probs, visible = attention_probs(
            module, query.detach(), key.detach(), attention_mask, scaling, causal,
            None if position_bias is None else position_bias.detach(), active.heads_tensor(query.device),
        )
    active.emit(site, probs, visible)
    return output, None


def register() -> str:
    """Register the attention function and its mask builder under ``"anchorlens"`` (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, anchorlens_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


def install(model: torch.nn.Module) -> None:
    """Switch ``model`` to the anchorlens attention function (sdpa underneath); idempotent, lazy.

    Models load with plain sdpa; the first capture installs this function, which behaves exactly
    like sdpa whenever no capture session is active.
    """
    register()
    if getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
