"""Per-head norms of each key's contribution to the attention output: ||v_j W_O^h|| (Kobayashi et al. 2020).

An attention module whose output is ``o_proj(concat_h sum_j A_h(i, j) v_j^h)`` writes, for head h and key j,
the vector A_h(i, j) · f_j^h with f_j^h = v_j^h W_O^h (W_O^h: the head's D columns of the output projection), so
the norm of key j's contribution to query i is A_h(i, j) · ||f_j^h||: the probabilities times one norm per head
and key. ||f_j^h||² = v_j^h M_h v_j^hᵀ with M_h = W_O^hᵀ W_O^h ([D, D], computed once per weight), which costs
D² per key and head instead of D·d_model.

Modules whose output is not such a projection of the concatenated heads (BERT's self-attention, whose projection
lives in another module; Qwen3.5's output gated per query) cannot be decomposed per head: :func:`head_output_gram` refuses them
with one line.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, cast

import torch

from anchorlens.errors import UsageError

_PROJECTIONS = ("o_proj", "dense", "o", "c_proj")  # llama-likes, gpt-neox, t5, gpt2 (Conv1D)
_CACHE_ATTR = "_anchorlens_value_gram"


@functools.cache
def _gated(cls: Any) -> bool:
    """Whether a module class's forward scales the attention output by a gate before projecting it (Qwen3-Next and
    Qwen3.5 multiply it by sigmoid(gate), a query-dependent factor): read from its source, once per class."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return True  # unknown code: do not claim a decomposition
    return re.search(r"\bgate\b", source) is not None


def _projection_weight(module: torch.nn.Module, width: int) -> torch.Tensor | None:
    """[d_model, width] weight of the module's output projection over the concatenated heads, or None."""
    config = getattr(module, "config", None)
    if getattr(config, "attn_output_gate", False) or _gated(cast(Any, type(module))):
        return None  # a query-dependent gate scales each head's output before the projection
    for name in _PROJECTIONS:
        proj = getattr(module, name, None)
        if isinstance(proj, torch.nn.Linear) and proj.in_features == width:
            return proj.weight
        weight = getattr(proj, "weight", None)
        if type(proj).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.shape[0] == width:
            return weight.t()  # GPT-2's Conv1D keeps [in, out]
    return None


def head_output_gram(module: torch.nn.Module, heads: int, head_dim: int) -> torch.Tensor:
    """[H, D, D] float32 M_h = W_O^hᵀ W_O^h of the module's output projection (cached on the module, per weight
    and version).

    Raises UsageError when the module's output is not a projection of its concatenated heads."""
    weight = _projection_weight(module, heads * head_dim)
    if weight is None:
        raise UsageError(
            f"value-aware mass needs attention whose output is a projection of the concatenated heads; "
            f"{type(module).__name__} has none (its output cannot be decomposed per head): drop the value_mass reducer"
        )

    # kept on the module (it dies with the model; a global cache would keep old models' weights alive)
    key = (id(weight), weight.data_ptr(), weight._version, weight.device, heads, head_dim)
    cached = module.__dict__.get(_CACHE_ATTR)
    if cached is not None and cached[0] == key:
        return cached[1]
    w = weight.detach().float().reshape(weight.shape[0], heads, head_dim).permute(1, 0, 2)  # [H, d_model, D]
    gram = torch.matmul(w.transpose(1, 2), w)
    module.__dict__[_CACHE_ATTR] = (key, gram)
    return gram


def value_norms(module: torch.nn.Module, value: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, H, K] float32: ||v_j^{kv(h)} W_O^h|| for every query head h and key j; value: [B, H_kv, K, D]."""
    b, kv, k, d = value.shape
    gram = head_output_gram(module, heads, d)  # [H, D, D]
    v = value.detach().float().repeat_interleave(heads // kv, dim=1)  # [B, H, K, D]
    squared = (torch.matmul(v, gram) * v).sum(-1)  # v M vᵀ per key
    return squared.clamp_min_(0.0).sqrt_()
