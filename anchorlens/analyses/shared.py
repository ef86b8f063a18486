"""Per-event work the built-in reducers share, done once per attention call whatever reducers ask for it.

Every pass over the [B, H, q, K] probabilities is memory-bound and costs about as much as the next one,
so the reducers read the probabilities through a few shared reductions, each cached on the event:

- :func:`column_mass`: each query's attention on a small set of *key columns*, one batched matmul
  ([B, H·q, K] x [B, K, C]): the key roles (C = R one-hot columns), the example's first valid key and its
  sink (first valid input key, see :func:`sink_index`). First-token mass, role flow and the sink-aware
  decomposition are all read from it: no gather over the probabilities.
- :func:`column_plogp`: the same columns of p·log p, from the event's logits (one product and one matmul).
- :func:`query_role_sums`: a per-query table summed over the queries of each role, in float64 (one
  einsum); :func:`column_mass_by_query_role` is that sum of :func:`column_mass`.

The key columns depend only on the layout, which the layers of one forward share, so they are built once
per forward (:class:`~anchorlens.analyses.base.IdentityCache`).
"""

from __future__ import annotations

import torch

from anchorlens.analyses.base import IdentityCache, role_onehot
from anchorlens.capture.event import AttentionEvent
from anchorlens.roles.kinds import INPUT_ROLES, NUM_ROLES, Role

FIRST_KEY = NUM_ROLES  # column of the example's first valid key
SINK_KEY = NUM_ROLES + 1  # column of the example's first valid input key
NUM_COLUMNS = NUM_ROLES + 2
_INPUT_IDX = [int(r) for r in INPUT_ROLES]

_COLUMNS = IdentityCache()
_QUERY_HOT = IdentityCache()


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
    ok = key_valid.bool() & (key_roles.unsqueeze(-1) == torch.tensor(_INPUT_IDX, device=key_roles.device)).any(-1)
    return ok.long().argmax(1), ok.any(1)


def _columns(roles: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, K, C] key columns: role one-hots of valid keys, then first valid key, then sink (0/1)."""
    hot = role_onehot(roles, valid, dtype)
    b, k = roles.shape
    rows = torch.arange(b, device=roles.device)
    out = torch.zeros(b, k, 2, dtype=dtype, device=roles.device)
    for col, (index, found) in enumerate((anchor_key_index(valid, 0), sink_index(roles, valid))):
        out[rows[found], index[found], col] = 1.0
    return torch.cat([hot, out], -1)


def key_columns(event: AttentionEvent) -> torch.Tensor:
    """[B, K', C] float (probs dtype): key roles one-hot (zero rows for padding), first valid key, sink, for the
    K' keys the event's probabilities cover (found among all the layout's keys)."""
    if "key_columns" not in event.cache:
        k, dev, dtype = event.layout.k, event.probs.device, event.probs.dtype
        every = _COLUMNS.get(
            (k.roles, k.valid, dev, dtype), lambda: _columns(k.roles.to(dev), k.valid.to(dev).bool(), dtype)
        )
        event.cache["key_columns"] = every[:, : event.key_count]
    return event.cache["key_columns"]


def query_roles(event: AttentionEvent) -> torch.Tensor:
    """[B, q, R] float64 one-hot of the event's query roles (zero rows for padding queries); cached."""
    return _query_hots(event)[0]


def _query_hots(event: AttentionEvent) -> tuple[torch.Tensor, torch.Tensor]:
    """The query one-hot [B, q, R] and its transpose [B, 1, R, q] (float64), shared by the layers of a forward."""
    if "q_hot" not in event.cache:
        q, dev = event.layout.q, event.probs.device

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            hot = role_onehot(q.roles.to(dev), q.valid.to(dev).bool(), torch.float64)
            return hot, hot.transpose(1, 2).unsqueeze(1).contiguous()

        event.cache["q_hot"] = _QUERY_HOT.get((q.roles, q.valid, dev), compute)
    return event.cache["q_hot"]


def _per_column(values: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Segment sums over key columns: [B, H, q, K] x [B, K, C] -> [B, H, q, C] (one batched matmul)."""
    b, h, q, k = values.shape
    return torch.matmul(values.reshape(b, h * q, k), columns).view(b, h, q, -1)


def column_mass(event: AttentionEvent) -> torch.Tensor:
    """[B, H, q, C] float32: each query's attention on valid keys of each role, its first key and its sink."""
    if "column_mass" not in event.cache:
        event.cache["column_mass"] = _per_column(event.probs, key_columns(event))
    return event.cache["column_mass"]


def column_plogp(event: AttentionEvent) -> torch.Tensor:
    """[B, H, q, C] float32: sum of p·log p over the keys of each column; cached on the event.

    With the event's ``scores`` and ``log_norm`` no logarithm over [B, H, q, K] is needed:
    sum_k p log p = sum_k p s - (sum_k p) log_norm. Without them, ``xlogy``.
    """
    if "column_plogp" not in event.cache:
        p, columns = event.probs, key_columns(event)
        if event.scores is None or event.log_norm is None:
            event.cache["column_plogp"] = _per_column(torch.xlogy(p, p), columns)
        else:
            product = torch.mul(p, event.scores, out=_work_buffer(event))  # [B, H, q, K], consumed at once
            event.cache["column_plogp"] = _per_column(product, columns) - column_mass(event) * event.log_norm
    return event.cache["column_plogp"]


def _work_buffer(event: AttentionEvent) -> torch.Tensor:
    """A scratch tensor shaped like the event's probs: the capture's reusable buffer when it lent one
    (``cache["work"]``, flat), else a fresh tensor (a large allocation per layer costs as much as the
    product written into it)."""
    like, buf = event.probs, event.cache.get("work")
    if buf is None or buf.numel() < like.numel() or buf.dtype != like.dtype or buf.device != like.device:
        return torch.empty_like(like)
    return buf[: like.numel()].view(like.shape)


def visible_key_counts(event: AttentionEvent) -> torch.Tensor:
    """[B, q, R] float32: how many valid keys of each role each query may see; cached on the event.

    Only for reducers that cache it per mask themselves: it is one [q, K] pass per call."""
    if "visible_key_counts" not in event.cache:
        seen = event.visible.to(event.probs.device)[:, 0].to(event.probs.dtype)  # [B|1, q, K]
        event.cache["visible_key_counts"] = torch.matmul(seen, key_columns(event)[..., :NUM_ROLES])
    return event.cache["visible_key_counts"]


def query_role_sums(event: AttentionEvent, values: torch.Tensor) -> torch.Tensor:
    """Sum per-query values over the valid queries of each role: [B, H, q, ...] -> [B, H, R, ...] float64.

    Padding queries weigh 0; their values may be NaN (a fully masked row) and are zeroed first.
    """
    transposed = _query_hots(event)[1]  # [B, 1, R, q]
    b, h, q = values.shape[:3]
    flat = values.reshape(b, h, q, -1).to(torch.float64, copy=True).nan_to_num_()  # [B, H, q, C], a copy
    return torch.matmul(transposed, flat).reshape(b, h, transposed.shape[2], *values.shape[3:])


def column_mass_by_query_role(event: AttentionEvent) -> torch.Tensor:
    """[B, H, R, C] float64: :func:`column_mass` summed over the valid queries of each role; cached."""
    if "column_mass_by_query_role" not in event.cache:
        event.cache["column_mass_by_query_role"] = query_role_sums(event, column_mass(event))
    return event.cache["column_mass_by_query_role"]


def query_counts(event: AttentionEvent) -> torch.Tensor:
    """[B, H, R] float64: valid queries of each role (the same for every head); cached on the event."""
    if "query_counts" not in event.cache:
        q_hot = query_roles(event)
        counts = q_hot.sum(1)[:, None, :].expand(q_hot.shape[0], event.probs.shape[1], q_hot.shape[-1])
        event.cache["query_counts"] = counts
    return event.cache["query_counts"]


def all_and_content(columns: torch.Tensor) -> torch.Tensor:
    """[..., C] key-column sums -> [..., 2]: over every valid key (all role columns) and over content keys."""
    return torch.matmul(columns, _ALL_AND_CONTENT.to(columns.device, columns.dtype))


_ALL_AND_CONTENT = torch.zeros(NUM_COLUMNS, 2)
_ALL_AND_CONTENT[:NUM_ROLES, 0] = 1.0
_ALL_AND_CONTENT[int(Role.CONTENT), 1] = 1.0
