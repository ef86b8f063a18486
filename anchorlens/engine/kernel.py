"""The kernel plan: attention statistics from a fused kernel's log-sum-exp, without materialising probabilities.

A fused (flash) attention kernel returns, beside the output, the log-sum-exp of each query row,
LSE_i = log sum_j exp(s_ij) over the keys query i sees, so P_ij = exp(s_ij - LSE_i) for any key j on demand.
What the built-in reducers read then costs (query i, key j, scores s_ij = scaling * q_i . k_j + mask):

- **probability sums over key columns** (``key_sums``, [B, H, Q, C] = P @ C): a column whose keys are few (the
  first key, the sink, structural roles, padding) is summed exactly over that *small set*,
  sum_{j in S} exp(s_ij - LSE_i) C_jc, at O(Q |S| D); a column whose complement is small (content in a long input)
  is 1 - the sum over its complement (every row sums to 1 over the keys it sees); any other column rides in
  one more kernel pass with the columns as values (``P @ [C | 0]``, up to D columns per pass);
- **score sums** (``score_sums``, [B, H, Q, S] = sum_j P_ij s_ij W_js, what an entropy needs:
  H_i = LSE_i - sum_j P_ij s_ij): sum_j P_ij s_ij = scaling * q_i . (P @ K)_i, one more kernel pass with the
  keys as values; a weighted column from it and small sets as above.

The kernel is PyTorch's CPU flash attention (``aten::_scaled_dot_product_flash_attention_for_cpu``, a private
op wrapped here alone, behind :func:`kernel_available`), the kernel ``scaled_dot_product_attention`` itself runs
for float32 inputs on a CPU, so the output equals plain sdpa's. The plan applies where that kernel computes the
model's own attention: no soft-capping, position bias, learned sinks or knockout edits, float32 inputs on a CPU
(:func:`kernel_refusal` names the reason otherwise); everything else takes the materialised plan
(:mod:`~anchorlens.engine.probs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anchorlens.engine.call import AttentionCall, visible_keys

# a key set this small (or at most this fraction of the keys) is summed exactly key by key; so is the union of them
SMALL_SET_KEYS = 256
SMALL_SET_FRACTION = 1 / 16


def kernel_available() -> bool:
    """Whether this PyTorch has the CPU flash kernel that returns the log-sum-exp."""
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def kernel_refusal(call: AttentionCall, edited: bool, dropout: float, training: bool) -> str | None:
    """Why the kernel plan cannot compute this call exactly (one phrase), or None when it can."""
    if not kernel_available():
        return "this PyTorch lacks the flash kernel with its log-sum-exp"
    if call.query.device.type != "cpu":
        return f"the kernel plan runs on CPUs only so far (inputs on {call.query.device.type})"
    if call.query.dtype != torch.float32:
        return f"the inputs are {str(call.query.dtype).removeprefix('torch.')}, the kernel plan needs float32"
    if call.softcap is not None:
        return "the module soft-caps its scores"
    if call.position_bias is not None:
        return "the module adds a position bias"
    if call.sinks is not None:
        return "the module has learned sinks"
    if call.needs_eager_output:
        return "the module's window is not in its mask"
    if edited:
        return "a knockout edits this call"
    if dropout > 0 and training:
        return "attention dropout is active"
    if torch.is_grad_enabled():
        return "autograd records this call"
    if call.mask is None and call.causal and call.query.shape[2] != call.key.shape[2]:
        return "causal attention over a longer key cache without a mask"
    return None


@dataclass(frozen=True)
class KernelResult:
    """What one kernel-plan call computed.

    output: [B, Q, H, D] in the value dtype (as transformers' sdpa path returns it); lse: [B, H, Q, 1] float32, the
    log normaliser of each query row (very negative for a query that sees no key); visible: [B|1, 1, Q, K] bool;
    key_sums: [B, H, Q, C] float32 or None; score_sums: [B, H, Q, S] float32 or None; passes: kernel passes run
    (1 for the output, more for columns that are neither small nor of small complement, and for score sums).
    """

    output: torch.Tensor
    lse: torch.Tensor
    visible: torch.Tensor
    key_sums: torch.Tensor | None
    score_sums: torch.Tensor | None
    passes: int


class _Kernel:
    """One call's inputs laid out for the kernel: heads expanded to the query heads, the mask made additive."""

    def __init__(self, call: AttentionCall) -> None:
        b, h, q, d = call.query.shape
        k_len = call.key.shape[2]
        self.call = call
        self.query = call.query
        self.key = _expand_heads(call.key, h)
        self.mask = None if call.mask is None else _additive(call.mask[..., :q, :k_len], call.query.dtype)
        self.causal = call.mask is None and call.causal
        self.width = d

    def attend(self, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(P @ value [B, H, Q, D], LSE [B, H, Q]) for ``value`` [B, H|1, K, D]."""
        value = value.expand(self.query.shape[0], self.query.shape[1], -1, -1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            self.query, self.key, value, 0.0, self.causal, attn_mask=self.mask, scale=self.call.scaling
        )
        return out, lse

    def columns_pass(self, columns: torch.Tensor) -> torch.Tensor:
        """P @ columns: [B, K, C] float32 -> [B, H, Q, C], in passes of up to D columns."""
        parts = []
        for start in range(0, columns.shape[-1], self.width):
            part = columns[..., start : start + self.width]
            padded = torch.nn.functional.pad(part, (0, self.width - part.shape[-1]))
            parts.append(self.attend(padded[:, None])[0][..., : part.shape[-1]])
        return torch.cat(parts, -1)


def _expand_heads(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, H_kv, K, D] -> [B, H, K, D]: each key/value head repeated for the query heads of its group."""
    b, kv, k, d = tensor.shape
    if kv == heads:
        return tensor
    return tensor[:, :, None].expand(b, kv, heads // kv, k, d).reshape(b, heads, k, d)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = visible) as the additive one sdpa builds from it (0 visible, -inf hidden)."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


@dataclass(frozen=True)
class _Split:
    """How each of C weight columns [B, K, C] is summed: over its own keys, as the rest of a total, or in a pass.

    small: [N] long, the keys of the small set (the union over the batch); direct: [B, N, C] the columns on the
    small set (for columns summed key by key); complement: [B, N, C] the weights *missing* from columns taken
    as a total less the rest (their complement on the small set), with ``is_complement`` [C] bool; passes: [C]
    bool, columns that need a kernel pass.
    """

    small: torch.Tensor
    direct: torch.Tensor
    complement: torch.Tensor
    is_complement: torch.Tensor
    passes: torch.Tensor

    @classmethod
    def of(cls, columns: torch.Tensor) -> _Split:
        """Split ``columns`` [B, K, C] (weights; 0/1 indicators for the complement rule to apply)."""
        k_len = columns.shape[1]
        limit = max(SMALL_SET_KEYS, int(k_len * SMALL_SET_FRACTION))
        on = columns.ne(0).any(0)  # [K, C] keys any example weighs
        binary = ((columns == 0) | (columns == 1)).all(1).all(0)  # [C]
        off = (columns != 1).any(0)  # [K, C] keys where some example's weight is not 1
        small_direct = on.sum(0) <= limit
        small_rest = binary & (off.sum(0) <= limit) & ~small_direct
        # the small sets' union stays within the limit too (memory [B, H, Q, N]): columns in order of their set's
        # size join it while it fits, the others take a kernel pass
        own = torch.where(small_direct[:, None], on.T, off.T)  # [C, K] each column's small set
        union = torch.zeros(k_len, dtype=torch.bool, device=columns.device)
        for col in own.sum(1).argsort().tolist():
            if bool(small_direct[col] | small_rest[col]):
                grown = union | own[col]
                if int(grown.sum()) <= limit:
                    union = grown
                else:
                    small_direct[col] = small_rest[col] = False
        passes = ~(small_direct | small_rest)
        small = union.nonzero().squeeze(1)
        at = columns[:, small]  # [B, N, C]
        direct = torch.where(small_direct, at, 0.0)
        complement = torch.where(small_rest, 1.0 - at, 0.0)
        return cls(small, direct, complement, small_rest, passes)


def _small_set_probs(kernel: _Kernel, lse: torch.Tensor, visible: torch.Tensor, small: torch.Tensor) -> tuple:
    """P and scores on the small set: ([B, H, Q, N] float32 probabilities, [B, H, Q, N] scores)."""
    keys = kernel.key.index_select(2, small).float()
    scores = torch.matmul(kernel.query.float(), keys.transpose(-1, -2)) * kernel.call.scaling
    if kernel.mask is not None:
        mask = kernel.mask.index_select(-1, small).float()
        scores = scores + mask.clamp_min(torch.finfo(torch.float32).min)
    seen = visible.index_select(-1, small)
    probs = torch.where(seen, (scores - lse).exp(), 0.0)
    return probs, torch.where(seen, scores, 0.0)


@dataclass(frozen=True)
class KernelPlan:
    """How one forward's calls compute the statistics asked for: the split of the wanted columns and the kernel
    passes it costs (1 for the output and log-sum-exp; more for columns that are neither small nor of small
    complement, and for score sums). Depends only on the columns and the key count: shared by a forward's layers."""

    split: _Split | None
    key_count: int
    passes: int

    @classmethod
    def of(
        cls, key_columns: torch.Tensor | None, score_columns: torch.Tensor | None, key_count: int, width: int
    ) -> KernelPlan:
        """The plan for ``key_columns`` [B, K, C] and ``score_columns`` [B, K, S] over ``key_count`` keys, head
        width ``width``."""
        wanted = [c[:, :key_count].float() for c in (key_columns, score_columns) if c is not None]
        split = _Split.of(torch.cat(wanted, -1)) if wanted else None
        passes = 1
        if split is not None:
            c = 0 if key_columns is None else key_columns.shape[-1]
            passes += -(-int(split.passes[:c].sum()) // width)  # up to D columns per pass
            if score_columns is not None:
                passes += 1 + int(split.passes[c:].sum())  # the total, then one pass per weighted column
        return cls(split, key_count, passes)


def kernel_attention(
    call: AttentionCall,
    key_columns: torch.Tensor | None = None,
    score_columns: torch.Tensor | None = None,
    plan: KernelPlan | None = None,
    visible: torch.Tensor | None = None,
) -> KernelResult:
    """The output of ``call`` and the statistics asked for, from the kernel and its log-sum-exp (module docstring).

    key_columns: [B, K, C] weights over the keys whose probability sums are wanted (``key_sums``); score_columns:
    [B, K, S] weights whose score sums sum_j p_ij s_ij W_js are wanted (``score_sums``); plan: their
    :class:`KernelPlan` when the caller has it already; visible: [B|1, 1, Q, K] bool, which keys each query sees, when
    the caller has it (the layers of a forward share one tensor, and consumers cache their work on it). The call
    must pass :func:`kernel_refusal`.
    """
    kernel = _Kernel(call)
    q_len, k_len = call.query.shape[2], call.key.shape[2]
    if plan is None:
        plan = KernelPlan.of(key_columns, score_columns, k_len, kernel.width)
    out, lse = kernel.attend(_expand_heads(call.value, call.query.shape[1]))
    visible = visible_keys(call, 0, q_len)[..., :k_len] if visible is None else visible
    sees = visible.any(-1, keepdim=True)  # [B|1, 1, Q, 1]
    # a query that sees no key: a very negative finite log normaliser, as the materialised plan gives
    lse = torch.where(sees, lse.float().unsqueeze(-1), torch.finfo(torch.float32).min)
    split = plan.split
    small_probs = small_scores = None
    if split is not None and split.small.numel():
        small_probs, small_scores = _small_set_probs(kernel, lse, visible, split.small)
    key_sums = score_sums = None
    c = 0 if key_columns is None else key_columns.shape[-1]
    if key_columns is not None:
        assert split is not None
        key_sums = _sums(kernel, key_columns[:, :k_len].float(), _take(split, 0, c), small_probs, sees.float())
    if score_columns is not None:
        assert split is not None
        part = _take(split, c, c + score_columns.shape[-1])
        # the score sum over every key a query sees: scaling * q_i . (P @ K)_i, one kernel pass
        total = (kernel.attend(kernel.key)[0].float() * call.query.float()).sum(-1, keepdim=True) * call.scaling
        total = torch.where(sees, total, 0.0)  # a query that sees no key: no scores to sum
        weighted = None if small_probs is None or small_scores is None else small_probs * small_scores
        score_sums = _sums(kernel, score_columns[:, :k_len].float(), part, weighted, total, scores=True)
    output = out.transpose(1, 2).contiguous()
    return KernelResult(output, lse, visible, key_sums, score_sums, plan.passes)


def _take(split: _Split, start: int, stop: int) -> _Split:
    """The part of ``split`` for columns ``start:stop``."""
    return _Split(
        split.small,
        split.direct[..., start:stop],
        split.complement[..., start:stop],
        split.is_complement[start:stop],
        split.passes[start:stop],
    )


def _sums(
    kernel: _Kernel,
    columns: torch.Tensor,
    split: _Split,
    small: torch.Tensor | None,
    total: torch.Tensor,
    scores: bool = False,
) -> torch.Tensor:
    """[B, H, Q, C] sums of P (or of P * s with ``scores``) over ``columns`` [B, K, C], by ``split``.

    small: [B, H, Q, N] the per-key terms on the small set (P, or P * s); total: [B|1, H|1, Q, 1] the sum over
    every key a query sees (1, or 0 for a query that sees none; the score total)."""
    b, h, q = kernel.query.shape[0], kernel.query.shape[1], kernel.query.shape[2]
    out = torch.zeros(b, h, q, columns.shape[-1], dtype=torch.float32, device=columns.device)
    if small is not None:
        direct = torch.matmul(small, split.direct[:, None])  # [B, H, Q, C]
        rest = torch.matmul(small, split.complement[:, None])
        out = out + direct + torch.where(split.is_complement, total - rest, 0.0)
    elif split.is_complement.any():
        out = out + torch.where(split.is_complement, total.expand(b, h, q, 1), 0.0)
    if split.passes.any():
        index = split.passes.nonzero().squeeze(1)
        picked = columns.index_select(-1, index)
        if scores:  # P @ (K * w) per weighted column, then scaling * q . it
            summed = []
            for col in range(picked.shape[-1]):
                weighted_keys = kernel.key * picked[:, None, :, col, None].to(kernel.key.dtype)
                along = kernel.attend(weighted_keys)[0].float()
                summed.append((along * kernel.query.float()).sum(-1) * kernel.call.scaling)
            passed = torch.stack(summed, -1)
        else:
            passed = kernel.columns_pass(picked)
        out = out.index_copy(-1, index, passed.float())
    return out
