"""One attention call, normalised: its tensors and options, which keys each query sees, how many queries per chunk."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_MEMORY_BUDGET = 512 * 2**20  # bytes of float32 buffers one chunk of queries may use at once
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


def trim_unseen_keys(visible: torch.Tensor) -> torch.Tensor:
    """``visible`` [..., q, K] without the trailing keys no query of it sees (at least one key kept): a causal chunk
    of queries sees no key after its last query."""
    seen = visible.flatten(0, -2).any(0).nonzero()  # keys any query of the chunk sees
    return visible[..., : max(1, int(seen[-1]) + 1 if seen.numel() else 1)]


@dataclass(frozen=True, eq=False)
class KeySpan:
    """The keys each query of a chunk sees when a call has no mask: keys ``first[i] <= j < stop[i]`` for query i, the
    same for every example and head (causal attention, a sliding window, or every key).

    first, stop: [q] long; key_count: K' = the largest ``stop`` (at least 1), the keys the chunk covers. Holds O(q)
    where the boolean mask it stands for holds q·K' (an eighth of a GiB per 1,024 queries at 128k keys): the kernel
    plan hands spans to its observer so that nothing it keeps grows with Q·K. Compared by identity, as tensors are.
    """

    first: torch.Tensor
    stop: torch.Tensor
    key_count: int

    @classmethod
    def of(cls, call: AttentionCall, start: int, stop: int) -> KeySpan | None:
        """The span of queries ``start:stop`` of ``call``, or None when the call has a mask (then see
        :func:`visible_keys`). Equal to :func:`visible_keys` trimmed by :func:`trim_unseen_keys`."""
        if call.mask is not None:
            return None
        q_len, k_len = call.query.shape[2], call.key.shape[2]
        rows = torch.arange(start, stop, device=call.query.device)
        if not call.causal:
            return cls(torch.zeros_like(rows), torch.full_like(rows, k_len), k_len)
        ends = rows + (k_len - q_len) + 1  # a query sees the keys up to its own absolute position
        firsts = torch.zeros_like(rows) if call.window is None else (ends - call.window).clamp_min(0)
        ends = ends.clamp(0, k_len)
        return cls(firsts, ends, max(1, int(ends.max()) if ends.numel() else 1))

    def dense(self) -> torch.Tensor:
        """[1, 1, q, K'] bool: the span as a mask (built on each call: O(q·K'))."""
        cols = torch.arange(self.key_count, device=self.first.device)
        return ((cols >= self.first[:, None]) & (cols < self.stop[:, None])).view(1, 1, -1, self.key_count)

    def counts(self, columns: torch.Tensor) -> torch.Tensor:
        """[B, 1, q, C] float64: each query's sum of ``columns`` [B, K, C] over the keys it sees (prefix sums, O(K·C)
        rather than the O(q·K·C) of summing a mask)."""
        b, _, c = columns.shape
        prefix = torch.zeros(b, self.key_count + 1, c, dtype=torch.float64, device=columns.device)
        torch.cumsum(columns[:, : self.key_count].to(torch.float64), 1, out=prefix[:, 1:])
        return (prefix[:, self.stop.to(columns.device)] - prefix[:, self.first.to(columns.device)])[:, None]

    def key_counts(self, weights: torch.Tensor) -> torch.Tensor:
        """[B, 1, K'] float64: for each key, the sum of the query weights ``weights`` [B, q] over the queries that see
        it (a difference array over the spans, O(q + K') rather than the O(q·K') of summing a mask)."""
        b = weights.shape[0]
        edges = torch.zeros(b, self.key_count + 1, dtype=torch.float64, device=weights.device)
        w = weights.to(torch.float64)
        edges.index_add_(1, self.first.to(weights.device), w)
        edges.index_add_(1, self.stop.to(weights.device), -w)
        return edges[:, : self.key_count].cumsum(1)[:, None]

    def sees(self, keys: torch.Tensor) -> torch.Tensor:
        """[1, 1, q, N] bool: whether each query sees each of ``keys`` ([N] long key indices)."""
        keys = keys.to(self.first.device)[None, :]
        return ((keys >= self.first[:, None]) & (keys < self.stop[:, None]))[None, None]


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
        visible = trim_unseen_keys(visible_keys(call, start, stop))
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
