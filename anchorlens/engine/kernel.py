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
  keys as values; a weighted column from it and small sets as above;
- **received mass** (``received``, [B, H, K] = sum_i w_i P_ij over a chunk's weighted queries, what a sink battery
  ranks keys by): one more pass of the attention transposed, with each query's -LSE_i in an extra head dimension
  (:meth:`KernelCall.received`).

The kernel is PyTorch's CPU flash attention (``aten::_scaled_dot_product_flash_attention_for_cpu``, a private
op wrapped here alone, behind :func:`kernel_available`), the kernel ``scaled_dot_product_attention`` itself runs
for float32 inputs on a CPU, so the output equals plain sdpa's. The plan applies where that kernel computes the
model's own attention: no soft-capping, position bias, learned sinks or knockout edits, float32 inputs on a CPU
(:func:`kernel_refusal` names the reason otherwise); everything else takes the materialised plan
(:mod:`~anchorlens.engine.probs`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from anchorlens.engine.call import AttentionCall, KeySpan, visible_keys

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
    """One call's inputs laid out for the kernel: the mask made additive; the keys as the call gives them (grouped
    heads, where the kernel maps query heads to their group itself) and, built on first use, expanded to the query
    heads (the small-set sums, per-head values and the transposed pass need them)."""

    def __init__(self, call: AttentionCall, additive: torch.Tensor | None = None) -> None:
        self.call = call
        self.query = call.query
        self.heads, self.width = call.query.shape[1], call.query.shape[3]
        self.grouped = call.key  # [B, H_kv, K, D]
        self.native_groups = call.key.shape[1] == self.heads or _kernel_groups_heads()
        self.mask = additive if additive is not None else additive_mask(call)
        self.causal = call.mask is None and call.causal

    @functools.cached_property
    def key(self) -> torch.Tensor:
        """[B, H, K, D]: the keys of each query head (a copy where heads are grouped)."""
        return _expand_heads(self.call.key, self.heads)

    def attend(self, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(P @ value [B, H, Q, D], LSE [B, H, Q]) for ``value`` [B, H|H_kv|1, K, D]: values shared by a group's
        heads (or by all) go with the grouped keys, no copy of either."""
        b = self.query.shape[0]
        if self.native_groups and value.shape[1] != self.heads:
            key, value = self.grouped, value.expand(b, self.grouped.shape[1], -1, -1)
        else:
            key, value = self.key, value.expand(b, self.heads, -1, -1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            self.query, key, value, 0.0, self.causal, attn_mask=self.mask, scale=self.call.scaling
        )
        return out, lse

    def score_pass(self, keys: torch.Tensor) -> torch.Tensor:
        """[B, H, Q, 1]: scaling * q_i . (P @ keys)_i, the score sum sum_j p_ij s_ij when ``keys`` are the keys
        ([B, H|H_kv, K, D]; the keys times a weight per key give the weighted sum)."""
        summed = self.attend(keys)[0].float()
        return torch.einsum("bhqd,bhqd->bhq", summed, self.query.float()).unsqueeze(-1) * self.call.scaling

    def columns_pass(self, columns: torch.Tensor) -> torch.Tensor:
        """P @ columns: [B, K, C] or per head [B, H, K, C] float32 -> [B, H, Q, C], in passes of up to D columns."""
        per_head = columns if columns.dim() == 4 else columns[:, None]
        parts = []
        for start in range(0, columns.shape[-1], self.width):
            part = per_head[..., start : start + self.width]
            padded = torch.nn.functional.pad(part, (0, self.width - part.shape[-1]))
            parts.append(self.attend(padded)[0][..., : part.shape[-1]])
        return torch.cat(parts, -1)


@functools.cache
def _kernel_groups_heads() -> bool:
    """Whether the flash kernel takes fewer key/value heads than query heads and gives query head h the group h //
    (H / H_kv), as repeating each key/value head does (checked once on a tiny call)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 8, 4, generator=g) for n in (4, 2, 2))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    try:
        grouped = flash(q, k, v, 0.0, True, scale=0.5)[0]
    except RuntimeError:
        return False
    repeated = flash(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), 0.0, True, scale=0.5)[0]
    return bool(torch.equal(grouped, repeated))


def _expand_heads(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, H_kv, K, D] -> [B, H, K, D]: each key/value head repeated for the query heads of its group."""
    b, kv, k, d = tensor.shape
    if kv == heads:
        return tensor
    return tensor[:, :, None].expand(b, kv, heads // kv, k, d).reshape(b, heads, k, d)


def additive_mask(call: AttentionCall) -> torch.Tensor | None:
    """[B|1, 1, Q, K] in the query dtype: the call's mask as the additive one sdpa builds from a boolean mask (0
    visible, -inf hidden), or None without a mask. The layers of a forward share their mask, so a caller that sees
    several of them may build this once and hand it to :class:`KernelCall`."""
    if call.mask is None:
        return None
    q, k_len = call.query.shape[2], call.key.shape[2]
    mask = call.mask[..., :q, :k_len]
    if mask.dtype != torch.bool:
        return mask.to(call.query.dtype)
    return torch.zeros(mask.shape, dtype=call.query.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


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

    @property
    def key_by_key(self) -> torch.Tensor:
        """[C] bool: the columns summed key by key on the small set (neither the rest of a total nor in a pass); the
        only ones whose sums stay exact on the small set when every key is weighted differently per head."""
        return ~(self.passes | self.is_complement)

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


def _small_set_probs(
    kernel: _Kernel, lse: torch.Tensor, visible: torch.Tensor | KeySpan, small: torch.Tensor, start: int, stop: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """P and scores of queries ``start:stop`` on the small set: ([B, H, q, N] float32 probabilities, [B, H, q, N]
    scores, 0 where hidden); lse [B, H, q, 1]; visible [B|1, 1, q, K'] (keys from K' on hidden) or the queries'
    :class:`KeySpan`."""
    keys = _expand_heads(kernel.grouped.index_select(2, small), kernel.heads).float()
    scores = torch.matmul(kernel.query[:, :, start:stop].float(), keys.transpose(-1, -2)) * kernel.call.scaling
    if kernel.mask is not None:
        mask = kernel.mask[..., start:stop, :].index_select(-1, small).float()
        scores = scores + mask.clamp_min(torch.finfo(torch.float32).min)
    if isinstance(visible, KeySpan):
        seen = visible.sees(small)
    else:
        covered = small < visible.shape[-1]
        seen = visible.index_select(-1, torch.where(covered, small, 0)) & covered
    probs = torch.where(seen, (scores - lse).exp(), 0.0)
    return probs, torch.where(seen, scores, 0.0)


@dataclass(frozen=True)
class KernelPlan:
    """How one forward's calls compute the statistics asked for: the split of the wanted columns and the kernel
    passes it costs (1 for the output and log-sum-exp; more for columns that are neither small nor of small
    complement, for score sums, for the received mass per key and for value-weighted columns). Depends only on the
    columns, the key count and what is read: shared by a forward's layers."""

    split: _Split | None
    key_count: int
    passes: int

    @classmethod
    def of(
        cls,
        key_columns: torch.Tensor | None,
        score_columns: torch.Tensor | None,
        key_count: int,
        width: int,
        *,
        received: bool = False,
        value_sums: bool = False,
    ) -> KernelPlan:
        """The plan for ``key_columns`` [B, K, C] and ``score_columns`` [B, K, S] over ``key_count`` keys, head
        width ``width``, the received mass per key when ``received`` (one more pass: :meth:`KernelCall.received`),
        and the key columns weighted by the value norms when ``value_sums`` (:meth:`KernelCall.weigh_values`)."""
        wanted = [c[:, :key_count].float() for c in (key_columns, score_columns) if c is not None]
        split = _Split.of(torch.cat(wanted, -1)) if wanted else None
        passes = 2 if received else 1
        if split is not None:
            c = 0 if key_columns is None else key_columns.shape[-1]
            passes += -(-int(split.passes[:c].sum()) // width)  # up to D columns per pass
            if value_sums and key_columns is not None:  # weighted per head: only columns summed key by key skip a pass
                passes += -(-int((~split.key_by_key[:c]).sum()) // width)
            if score_columns is not None:
                passes += 1 + int(split.passes[c:].sum())  # the total, then one pass per weighted column
        return cls(split, key_count, passes)


class KernelCall:
    """One call under the kernel plan: the kernel passes over all queries at once (each O(Q·D) memory), then the
    statistics of any query chunk (:meth:`chunk`: the small-set sums there, O(q·N)), so that no tensor grows with
    Q·K.

    output: [B, Q, H, D] in the value dtype (as transformers' sdpa path returns it); lse: [B, H, Q, 1] float32 (very
    negative for a query that sees no key, as the materialised plan's log normaliser); passes: the kernel passes run.
    ``additive``: the call's :func:`additive_mask` when the caller has it already (the layers of a forward share it).
    """

    def __init__(
        self,
        call: AttentionCall,
        key_columns: torch.Tensor | None = None,
        score_columns: torch.Tensor | None = None,
        plan: KernelPlan | None = None,
        additive: torch.Tensor | None = None,
    ) -> None:
        kernel = self._kernel = _Kernel(call, additive)
        k_len = call.key.shape[2]
        self.plan = plan if plan is not None else KernelPlan.of(key_columns, score_columns, k_len, kernel.width)
        self.passes = self.plan.passes
        out, lse = kernel.attend(call.value)
        self.output = out.transpose(1, 2).contiguous()
        self._lse = lse.float().unsqueeze(-1)  # [B, H, Q, 1]; queries that see no key are set per chunk
        self._columns = None if key_columns is None else key_columns[:, :k_len].float()
        self._scored = None if score_columns is None else score_columns[:, :k_len].float()
        split, c = self.plan.split, 0 if key_columns is None else key_columns.shape[-1]
        self._key_split = None if split is None or key_columns is None else _take(split, 0, c)
        self._score_split = None if split is None or score_columns is None else _take(split, c, None)
        self._norms: torch.Tensor | None = None  # [B, H, K] value norms, when :meth:`weigh_values` asked for them
        self._value_passed: torch.Tensor | None = None
        self._key_passed = None  # [B, H, Q, C_pass]: the columns that need a pass, for all queries
        if self._columns is not None and self._key_split is not None and self._key_split.passes.any():
            index = self._key_split.passes.nonzero().squeeze(1)
            self._key_passed = kernel.columns_pass(self._columns.index_select(-1, index))
        self._score_total = self._score_passed = None
        if self._scored is not None and self._score_split is not None:
            # the score sum over every key a query sees: scaling * q_i . (P @ K)_i, one kernel pass
            self._score_total = kernel.score_pass(kernel.grouped)
            if self._score_split.passes.any():
                index = self._score_split.passes.nonzero().squeeze(1)
                picked = self._scored.index_select(-1, index)  # [B, K, n]: P @ (K * w) per weighted column
                grouped = kernel.grouped
                weighted = [grouped * picked[:, None, :, i, None].to(grouped.dtype) for i in range(len(index))]
                self._score_passed = torch.stack([kernel.score_pass(keys)[..., 0] for keys in weighted], -1)

    def weigh_values(self, norms: torch.Tensor) -> None:
        """Make :meth:`chunk` give ``value_sums`` [B, H, q, C] = sum_j p_ij C_jc n_j^h, the key columns weighted by
        ``norms`` [B, H, K] (||v_j W_O^h||, one per head and key): exact key by key on the small set; every other
        column (a complement or a dense column: the weights are not 0/1 any more) in kernel passes of per-head
        columns, for all queries at once."""
        split = self._key_split
        if self._columns is None or split is None:
            raise ValueError("value sums weigh the key columns: give the call key columns")
        k_len = self._columns.shape[1]
        self._norms = norms[..., :k_len].float()
        direct = split.key_by_key
        self._value_passed = None  # [B, H, Q, C_pass]
        if (~direct).any():
            index = (~direct).nonzero().squeeze(1)
            weighted = self._columns.index_select(-1, index)[:, None] * self._norms[..., None]  # [B, H, K, n]
            self._value_passed = self._kernel.columns_pass(weighted)

    def _value_sums(self, small: torch.Tensor | None, start: int, stop: int, shape: torch.Size) -> torch.Tensor:
        """[B, H, q, C] the value-weighted key sums of queries ``start:stop`` (:meth:`weigh_values`); small: [B, H,
        q, N] the chunk's probabilities on the small set."""
        split = self._key_split
        assert split is not None and self._norms is not None
        b, h, q = shape[0], shape[1], shape[2]
        out = torch.zeros(b, h, q, split.passes.shape[0], dtype=torch.float32, device=self._norms.device)
        direct = split.key_by_key
        if small is not None and direct.any():
            at = self._norms.index_select(-1, split.small)[..., None] * split.direct[:, None]  # [B, H, N, C]
            out = out + torch.where(direct, torch.matmul(small, at), 0.0)
        if self._value_passed is not None:
            out = out.index_copy(-1, (~direct).nonzero().squeeze(1), self._value_passed[:, :, start:stop].float())
        return out

    def chunk(self, start: int, stop: int, visible: torch.Tensor | KeySpan) -> KernelChunk:
        """The statistics of queries ``start:stop``; visible: [B|1, 1, q, K'] bool, the keys each of them sees
        (K' <= K: the keys after K' are hidden from all of them), or their :class:`KeySpan` (a call without a mask)."""
        if isinstance(visible, KeySpan):
            sees = (visible.stop > visible.first).view(1, 1, -1, 1)
        else:
            sees = visible.any(-1, keepdim=True)  # [B|1, 1, q, 1]
        lse = torch.where(sees, self._lse[:, :, start:stop], torch.finfo(torch.float32).min)
        split = self.plan.split
        small = small_scores = None
        if split is not None and split.small.numel():
            small, small_scores = _small_set_probs(self._kernel, lse, visible, split.small, start, stop)
        key_sums = score_sums = None
        if self._columns is not None and self._key_split is not None:
            passed = None if self._key_passed is None else self._key_passed[:, :, start:stop]
            key_sums = _sums(self._key_split, small, sees.float(), passed, lse.shape)
        if self._scored is not None and self._score_split is not None and self._score_total is not None:
            total = torch.where(sees, self._score_total[:, :, start:stop], 0.0)  # no key: no scores to sum
            weighted = None if small is None or small_scores is None else small * small_scores
            passed = None if self._score_passed is None else self._score_passed[:, :, start:stop]
            score_sums = _sums(self._score_split, weighted, total, passed, lse.shape)
        value_sums = None
        if self._norms is not None:
            value_sums = self._value_sums(small, start, stop, lse.shape)
        return KernelChunk(lse, key_sums, score_sums, value_sums)

    def received(self, start: int, stop: int, visible: torch.Tensor | KeySpan, weights: torch.Tensor) -> torch.Tensor:
        """[B, H, K'] float32: sum_i w_i p_ij, the mass each of the K' keys the chunk covers receives from queries
        ``start:stop`` weighted by ``weights`` [B, q] (>= 0; the valid queries), in one more kernel pass.

        The pass is the call's attention transposed, as FlashAttention's backward recomputes P from the log-sum-exp:
        the keys ask, the queries answer, and each query's -LSE_i + log w_i rides in one extra head dimension
        (queries' = [scaling * k_j, 1], keys' = [q_i, -LSE_i + log w_i], scale 1), so that the kernel's log-sum-exp
        of row j is log sum_i w_i exp(s_ij - LSE_i). The call's mask, transposed, hides what it hides (a call without
        a mask: reversing both orders turns the transposed causal triangle into the kernel's own)."""
        kernel = self._kernel
        if isinstance(visible, KeySpan):
            k_len = visible.key_count
            sees = (visible.stop > visible.first).view(1, 1, -1)
            seen = visible.key_counts(weights * sees[0, 0].to(weights.dtype))  # [B, 1, K']
        else:
            k_len = visible.shape[-1]
            sees = visible.any(-1)  # [B|1, 1, q]
            seen = torch.matmul(weights[:, None, None, :].float(), visible.float())[:, :, 0]  # [B, 1, K']
        weighted = (weights[:, None, :] > 0) & sees  # [B, 1, q]
        bias = torch.where(weighted, weights[:, None, :].clamp_min(_TINY).log() - self._lse[:, :, start:stop, 0], _FAR)
        keys = _expand_heads(kernel.grouped[:, :, :k_len], kernel.heads)
        askers = torch.nn.functional.pad(keys.float() * kernel.call.scaling, (0, 1), value=1.0)
        answers = torch.cat([kernel.query[:, :, start:stop].float(), bias[..., None]], -1)  # [B, H, q, D + 1]
        if kernel.mask is not None:
            mask = kernel.mask[..., start:stop, :k_len].transpose(-1, -2).contiguous()  # [B|1, 1, K', q]
            lse = _flash_lse(askers, answers, mask, causal=False)
        elif kernel.causal:  # key j hears query i >= j: reversed, row j' hears the columns up to j'
            lse = _flash_lse(askers.flip(2), answers.flip(2), None, causal=True).flip(-1)
        else:
            lse = _flash_lse(askers, answers, None, causal=False)
        # a key no weighted query sees: the kernel's log-sum-exp of a hidden row is not -inf
        return torch.where(seen > 0, lse.exp(), 0.0)


_TINY = torch.finfo(torch.float32).tiny
_FAR = -1e30  # a log weight that no score lifts back: exp(s + _FAR - max) is 0


def _flash_lse(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """[B, H, L] the flash kernel's log-sum-exp of ``query`` [B, H, L, E] against ``key`` [B, H, S, E] at scale 1
    (the keys stand in for values: only the normaliser is wanted)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, key, 0.0, causal, attn_mask=mask, scale=1.0
    )[1]


@dataclass(frozen=True)
class KernelChunk:
    """The statistics of one chunk of q queries: lse [B, H, q, 1], key_sums [B, H, q, C] or None, score_sums
    [B, H, q, S] or None, value_sums [B, H, q, C] or None (float32)."""

    lse: torch.Tensor
    key_sums: torch.Tensor | None
    score_sums: torch.Tensor | None
    value_sums: torch.Tensor | None = None


def kernel_attention(
    call: AttentionCall,
    key_columns: torch.Tensor | None = None,
    score_columns: torch.Tensor | None = None,
    plan: KernelPlan | None = None,
) -> KernelResult:
    """The output of ``call`` and the statistics asked for, for all queries at once (:class:`KernelCall`, one chunk).

    key_columns: [B, K, C] weights over the keys whose probability sums are wanted (``key_sums``); score_columns:
    [B, K, S] weights whose score sums sum_j p_ij s_ij W_js are wanted (``score_sums``); plan: their
    :class:`KernelPlan` when the caller has it already. The call must pass :func:`kernel_refusal`.
    """
    whole = KernelCall(call, key_columns, score_columns, plan)
    q_len, k_len = call.query.shape[2], call.key.shape[2]
    visible = visible_keys(call, 0, q_len)[..., :k_len]
    got = whole.chunk(0, q_len, visible)
    return KernelResult(whole.output, got.lse, visible, got.key_sums, got.score_sums, whole.passes)


def _take(split: _Split, start: int, stop: int | None) -> _Split:
    """The part of ``split`` for columns ``start:stop``."""
    return _Split(
        split.small,
        split.direct[..., start:stop],
        split.complement[..., start:stop],
        split.is_complement[start:stop],
        split.passes[start:stop],
    )


def _sums(
    split: _Split,
    small: torch.Tensor | None,
    total: torch.Tensor,
    passed: torch.Tensor | None,
    shape: torch.Size,
) -> torch.Tensor:
    """[B, H, q, C] sums of P (or of P * s) over a split's columns, for one chunk of q queries.

    small: [B, H, q, N] the per-key terms on the small set (P, or P * s); total: [B|1, H|1, q, 1] the sum over every
    key a query sees (1, or 0 for a query that sees none; the score total); passed: [B, H, q, C_pass] the kernel
    passes' sums of the split's pass columns; shape: (B, H, q, 1)."""
    b, h, q = shape[0], shape[1], shape[2]
    out = torch.zeros(b, h, q, split.passes.shape[0], dtype=torch.float32, device=total.device)
    if small is not None:
        direct = torch.matmul(small, split.direct[:, None])  # [B, H, q, C]
        rest = torch.matmul(small, split.complement[:, None])
        out = out + direct + torch.where(split.is_complement, total - rest, 0.0)
    elif split.is_complement.any():
        out = out + torch.where(split.is_complement, total.expand(b, h, q, 1), 0.0)
    if passed is not None:
        out = out.index_copy(-1, split.passes.nonzero().squeeze(1), passed.float())
    return out
