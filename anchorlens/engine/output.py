"""The attention output from probabilities: eager, mean-ablated, and with key-column sums in the same product."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from anchorlens.engine.call import AttentionCall


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
