"""Per-event work the built-in reducers share, done once per attention call whatever reducers ask for it.

Every pass over the [B, H, q, K] probabilities is memory-bound and costs about as much as the next one,
so the reducers read the probabilities through a few shared reductions, each cached on the event:

- :func:`column_mass`: each query's attention on a small set of *key columns*: the example's first valid
  key, its sink (first valid input key, see :func:`sink_index`), every valid key, the content keys, then the
  key roles (R one-hot columns, R = the size of the run's role table, :data:`ROLE_START` onwards, see
  :func:`role_columns`), then the key field groups (F one-hot columns over the content keys of each template
  field the table names, :func:`group_columns`; none when it names none). First-token mass, role flow, the sink-aware decomposition and the entropies'
  normalisers are all read from it: no gather over the probabilities. The reducers ask the capture for
  these columns (``key_columns``, :func:`columns_of_layout`); in fast mode it sums them in the same product
  as the output (``probs @ [V | columns]``, :attr:`AttentionEvent.key_sums`), otherwise one batched matmul
  ([B, H·q, K] x [B, K, C]) here.
- :func:`column_plogp`: sum of p·log p over every valid key and over content keys, from the event's
  logits (one product and one matmul).

What the reducers do with these per-query tables (entropy terms, sums over query roles) runs on the tables
of several layers at once (:mod:`anchorlens.analyses.stage`), and everything that depends only on the
layout or the mask (key columns, query one-hots) is built once per forward and shared by its layers
(:class:`~anchorlens.capture.identity.IdentityCache`).
"""

from __future__ import annotations

import torch

from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.roles.kinds import GUIDANCE_ROLES, Role
from anchorlens.roles.layout import Layout

FIRST_KEY = 0  # column of the example's first valid key
SINK_KEY = 1  # column of the example's first valid input key
VALID_KEY = 2  # column of every valid key
CONTENT_KEY = 3  # the content role's column again, next to VALID_KEY (so both are one slice)
ROLE_START = 4  # the role one-hots: columns ROLE_START .. ROLE_START + R - 1, then the F field-group one-hots
PLOGP_COLUMNS = slice(VALID_KEY, CONTENT_KEY + 1)  # the key columns :func:`column_plogp` sums over
ROLE_COLUMNS = slice(ROLE_START, None)  # the role one-hots, then the field groups' (:func:`role_columns`: roles only)
_GUIDANCE_IDX = [int(r) for r in GUIDANCE_ROLES]


def num_columns(num_roles: int, num_fields: int = 0) -> int:
    """Number of key columns C for a run with ``num_roles`` roles and ``num_fields`` field groups."""
    return ROLE_START + num_roles + num_fields


def role_columns(num_roles: int) -> slice:
    """The key columns of the R role one-hots."""
    return slice(ROLE_START, ROLE_START + num_roles)


def group_columns(num_roles: int) -> slice:
    """The key columns of the F field-group one-hots (after the R roles'; an empty slice without fields)."""
    return slice(ROLE_START + num_roles, None)


def field_onehot(
    fields: torch.Tensor | None, valid: torch.Tensor, num_fields: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[B, T, F] one-hot of the field groups ``fields`` ([B, T] long, -1 for none; None: no position has one),
    zero where ``valid`` ([B, T] bool) is False."""
    b, t = valid.shape
    if fields is None or not num_fields:
        return torch.zeros(b, t, num_fields, dtype=dtype, device=valid.device)
    return role_onehot(fields.to(valid.device), valid, num_fields, dtype)


_COLUMNS = IdentityCache()
_QUERY_HOT = IdentityCache()


def role_onehot(
    roles: torch.Tensor, valid: torch.Tensor, num_roles: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[B, T, R] one-hot of ``roles`` ([B, T] long) over ``num_roles`` R roles, zero where ``valid`` ([B, T] bool)
    is False.

    Role values outside ``0..R-1`` get an all-zero row (ignored).
    """
    ids = torch.arange(num_roles, device=roles.device)
    return ((roles.unsqueeze(-1) == ids) & valid.to(roles.device).bool().unsqueeze(-1)).to(dtype)


def anchor_key_index(key_valid: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of each example's ``position``-th valid key (negative counts from the last).

    key_valid: [B, K] bool. Returns (index [B] long, found [B] bool); ``found`` is False where the
    example has too few valid keys.
    """
    valid = key_valid.bool()
    rank = valid.long().cumsum(1)  # [B, K]: 1-based rank of each valid key
    n_valid = rank[:, -1] if rank.shape[1] else torch.zeros(valid.shape[0], dtype=torch.long, device=valid.device)
    wanted = n_valid + position if position < 0 else torch.full_like(n_valid, position)
    hit = valid & (rank == (wanted + 1).unsqueeze(1))
    return hit.long().argmax(1), hit.any(1)


def sink_index(key_roles: torch.Tensor, key_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of each example's first valid input (non-guidance) key: ([B] long, found [B] bool).

    key_roles: [B, K] long; key_valid: [B, K] bool.
    """
    guidance = (key_roles.unsqueeze(-1) == torch.tensor(_GUIDANCE_IDX, device=key_roles.device)).any(-1)
    ok = key_valid.bool() & ~guidance
    return ok.long().argmax(1), ok.any(1)


def _columns(
    roles: torch.Tensor,
    valid: torch.Tensor,
    num_roles: int,
    dtype: torch.dtype,
    fields: torch.Tensor | None = None,
    num_fields: int = 0,
) -> torch.Tensor:
    """[B, K, C] key columns (0/1): first valid key, sink, every valid key, content keys, then the role one-hots of
    valid keys, then their field-group one-hots (``fields`` [B, K] long, -1 for none; F = ``num_fields`` columns)."""
    hot = role_onehot(roles, valid, num_roles, dtype)
    if num_fields:
        hot = torch.cat([hot, field_onehot(fields, valid, num_fields, dtype)], -1)
    b, k = roles.shape
    rows = torch.arange(b, device=roles.device)
    out = torch.zeros(b, k, 2, dtype=dtype, device=roles.device)
    for col, (index, found) in enumerate((anchor_key_index(valid, 0), sink_index(roles, valid))):
        out[rows[found], index[found], col] = 1.0
    return torch.cat([out, valid.to(dtype).unsqueeze(-1), hot[..., int(Role.CONTENT)].unsqueeze(-1), hot], -1)


def layout_key_columns(event: AttentionEvent) -> torch.Tensor:
    """[B, K, C] float (probs dtype): :func:`key_columns` of all the layout's keys, not only those the event
    covers (for work done once per forward from the first event of any chunk)."""
    return _layout_columns(event)[0]


def columns_of_layout(layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[B, K, C] :func:`key_columns` of all of ``layout``'s keys: what the built-in reducers ask the capture to sum
    the probabilities over (the same tensor for the same layout, as long as its tensors live)."""
    return _columns_of(layout, device, dtype)[0]


def score_columns_of_layout(layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[B, K, 2] the :data:`PLOGP_COLUMNS` of :func:`columns_of_layout` (every valid key, content keys): the weights
    whose score sums (:attr:`~anchorlens.capture.event.AttentionEvent.score_sums`) give :func:`column_plogp` where
    the capture computes no probabilities (the same tensor for the same layout)."""
    return _columns_of(layout, device, dtype)[2]


def score_columns(event: AttentionEvent) -> torch.Tensor:
    """:func:`score_columns_of_layout` of the event's layout (float32)."""
    return score_columns_of_layout(event.layout, event.device, torch.float32)


def _layout_columns(event: AttentionEvent) -> tuple[torch.Tensor, torch.Tensor]:
    """All the layout's key columns [B, K, C] and their :data:`PLOGP_COLUMNS` transposed [B, 2, K], once per
    forward."""
    every, transposed, _ = _columns_of(event.layout, event.device, torch.float32)
    return every, transposed


def _columns_of(
    layout: Layout, dev: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_layout_columns` of a layout and its score columns [B, K, 2], cached by its key tensors."""
    k = layout.k

    def compute() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        every = _columns(k.roles.to(dev), k.valid.to(dev).bool(), k.table.size, dtype, k.fields, len(k.table.fields))
        scored = every[..., PLOGP_COLUMNS]
        return every, scored.transpose(1, 2).contiguous(), scored.contiguous()

    return _COLUMNS.get((k.roles, k.valid, k.fields, k.table, dev, dtype), compute)


def key_columns(event: AttentionEvent) -> torch.Tensor:
    """[B, K', C] float (probs dtype): first valid key, sink, every valid key, content keys, key roles one-hot (zero
    rows for padding), for the K' keys the event's probabilities cover (found among all the layout's keys)."""
    if "key_columns" not in event.cache:
        event.cache["key_columns"] = _layout_columns(event)[0][:, : event.key_count]
    return event.cache["key_columns"]


def query_roles(event: AttentionEvent) -> torch.Tensor:
    """[B, q, R] float64 one-hot of the event's query roles (zero rows for padding queries); cached."""
    return _query_hots(event)[0]


def query_hot_transposed(event: AttentionEvent) -> torch.Tensor:
    """[B, R, q] float64: :func:`query_roles` transposed (contiguous), for sums over the queries of each role."""
    return _query_hots(event)[1]


def _query_hots(event: AttentionEvent) -> tuple[torch.Tensor, torch.Tensor]:
    """The query one-hot [B, q, R] and its transpose [B, R, q] (float64), shared by the layers of a forward."""
    if "q_hot" not in event.cache:
        q, dev = event.layout.q, event.device

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            hot = role_onehot(q.roles.to(dev), q.valid.to(dev).bool(), q.table.size, torch.float64)
            return hot, hot.transpose(1, 2).contiguous()

        event.cache["q_hot"] = _QUERY_HOT.get((q.roles, q.valid, q.table, dev), compute)
    return event.cache["q_hot"]


_FIELD_HOT = IdentityCache()


def query_fields_transposed(event: AttentionEvent) -> torch.Tensor:
    """[B, F, q] float64: one-hot of the event's query field groups, transposed (zero columns for padding queries and
    for queries of no field group; F = 0 when the run's table names no fields), shared by the layers of a forward."""
    if "q_fields" not in event.cache:
        q, dev = event.layout.q, event.device

        def compute() -> torch.Tensor:
            hot = field_onehot(q.fields, q.valid.to(dev).bool(), len(q.table.fields), torch.float64)
            return hot.transpose(1, 2).contiguous()

        event.cache["q_fields"] = _FIELD_HOT.get((q.roles, q.valid, q.fields, q.table, dev), compute)
    return event.cache["q_fields"]


def _per_column(values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Segment sums over key columns: [B, H, q, K] x [B, K, C] -> [B, H, q, C] (one batched matmul)."""
    b, h, q, k = values.shape
    return torch.matmul(values.reshape(b, h * q, k), columns).view(b, h, q, -1)


def column_mass(event: AttentionEvent) -> torch.Tensor:
    """[B, H, q, C] float32: each query's attention on valid keys of each role, its first key and its sink (the
    capture's :attr:`~AttentionEvent.key_sums` when it summed these very columns, else one matmul)."""
    if "column_mass" not in event.cache:
        fused = event.sums_over(_layout_columns(event)[0])
        event.cache["column_mass"] = (
            fused if fused is not None else _per_column(event.probabilities("column_mass"), key_columns(event))
        )
    return event.cache["column_mass"]


def column_plogp(event: AttentionEvent) -> torch.Tensor:
    """[B, H, q, 2] float32: sum of p·log p over every valid key and over content keys (:data:`PLOGP_COLUMNS`);
    cached on the event.

    With the event's ``scores`` and ``log_norm`` no logarithm over [B, H, q, K] is needed:
    sum_k p log p = sum_k p s - (sum_k p) log_norm. Without them, ``xlogy``.
    """
    if "column_plogp" not in event.cache:
        summed = event.score_sums_over(score_columns(event))
        if summed is not None and event.log_norm is not None:
            mass = column_mass(event)[..., PLOGP_COLUMNS]
            event.cache["column_plogp"] = torch.addcmul(summed, mass, event.log_norm, value=-1)
            return event.cache["column_plogp"]
        p = event.probabilities("column_plogp")
        columns_t = _layout_columns(event)[1][..., : event.key_count]
        if event.scores is None or event.log_norm is None:
            event.cache["column_plogp"] = _per_two_columns(torch.xlogy(p, p), columns_t)
        else:
            product = torch.mul(p, event.scores, out=_work_buffer(event))  # [B, H, q, K], consumed at once
            mass = column_mass(event)[..., PLOGP_COLUMNS]
            event.cache["column_plogp"] = torch.addcmul(
                _per_two_columns(product, columns_t), mass, event.log_norm, value=-1
            )
    return event.cache["column_plogp"]


def _per_two_columns(values: torch.Tensor, columns_t: torch.Tensor) -> torch.Tensor:
    """:func:`_per_column` for two columns given transposed ([B, 2, K]): [B, H, q, K] -> [B, H, q, 2].

    With so few columns, [2, K] x [K, H·q] runs about twice as fast on a CPU as [H·q, K] x [K, 2]."""
    b, h, q, k = values.shape
    return torch.matmul(columns_t, values.reshape(b, h * q, k).transpose(1, 2)).transpose(1, 2).view(b, h, q, 2)


def _work_buffer(event: AttentionEvent) -> torch.Tensor:
    """A scratch tensor shaped like the event's probs: the capture's reusable buffer when it lent one
    (``cache["work"]``, flat), else a fresh tensor (a large allocation per layer costs as much as the
    product written into it)."""
    like, buf = event.probabilities("a reducer's scratch"), event.cache.get("work")
    if buf is None or buf.numel() < like.numel() or buf.dtype != like.dtype or buf.device != like.device:
        return torch.empty_like(like)
    return buf[: like.numel()].view(like.shape)


def visible_key_counts(event: AttentionEvent) -> torch.Tensor:
    """[B, H|1, q, R] float32: how many valid keys of each role each query may see after every edit (the event's
    ``visible``: mask, window and knockouts; per head where a knockout selects heads); cached on the event.

    Only for reducers that cache it per mask themselves: it is one [q, K] pass per call."""
    if "visible_key_counts" not in event.cache:
        roles = role_columns(event.layout.k.table.size)
        counts = event.visible_counts(key_columns(event)[..., roles])  # [B, H|1, q, R]
        event.cache["visible_key_counts"] = counts.to(torch.float32)
    return event.cache["visible_key_counts"]


_LIVE = IdentityCache()


def live_queries(event: AttentionEvent) -> torch.Tensor:
    """[B, H|1, q] float64: 1 where a valid query sees at least one valid key after every edit (the event's
    ``visible``), 0 for padding queries and for empty rows (a knockout removed every key the query could see: its
    probabilities are all zero, it has no distribution to average). Shared by the layers and reducers of a forward."""
    q, k, dev = event.layout.q, event.layout.k, event.device

    def compute() -> torch.Tensor:
        sees = event.visible_counts(k.valid.to(dev, torch.float64)[..., None])[..., 0] > 0  # [B, H|1, q]
        return (sees & q.valid.to(dev).bool()[:, None, :]).to(torch.float64)

    return _LIVE.get((event.visibility_key, q.valid, k.valid, dev), compute)
