"""Per-query values of several layers, reduced together: a reducer's small operations run once per group of layers.

After its passes over the [B, H, q, K] probabilities, an attention event costs a reducer a few dozen
operations on small per-query tables (entropy terms, sums over query roles, adding to the state): on a CPU
about 20 µs each, as much as the passes themselves. The layers of one forward share their batch, their
query chunks and (usually) their mask, so a reducer only keeps each event's per-query tensors in a
:class:`QueryStage` of such layers and reduces the whole stage at once: when it is full, when the next batch
comes, or when the state is read. A stage keeps at most about :data:`STAGE_BYTES` per reducer and call (a
few layers at long inputs, every layer at short ones; reducers keeping views of the same tensors share
them), so memory does not grow with depth. Sums over a chunk's queries run in the per-query values'
precision (float32 from the capture); the state they are added to is float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from anchorlens.analyses.shared import live_queries, query_fields_transposed, query_hot_transposed
from anchorlens.analyses.table import SiteKey
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache, identity_key, same_tensors

STAGE_BYTES = 4 << 20  # per reducer and attention call (all its query chunks together)
_MAX_SLOTS = 64


class QueryStage:
    """Per-query values of up to ``capacity`` sites that share a batch, a query chunk and a mask.

    Each slot keeps the event's per-query tensors as they are ([B, H, q, F_i] each: the reducer hands over
    tensors it owns, such as the shared key-column sums, never views of the capture's reused buffers), so
    staging an event costs no tensor operation; :meth:`stacked` stacks a part of every slot in one.
    ``sites[i]`` is the (stack, layer) of slot i. What the slots share comes from the first event:
    ``example_ids`` [B], ``heads`` [H], ``query_hot_t`` [B, R, q] float64 (the one-hot of the chunk's query
    roles, zero columns for padding queries), ``live`` [B, H|1, q] float64 (1 where a valid query sees at least one
    valid key after every edit: an empty row, all of whose keys a knockout removed, is 0) and ``constants``, what the reducer derived once from that
    event's mask and layout (for example visible-key counts). ``shared`` is the cache of the event during
    which the stage is reduced (every reducer reduces its stages on the same event, so work on the very same
    tensors, such as the role sums of the shared key-column sums, is done once and dies with the event).
    """

    def __init__(self, event: AttentionEvent, capacity: int, constants: dict, scratch: dict | None = None) -> None:
        self.capacity = capacity
        self._scratch = {} if scratch is None else scratch
        self.slots: list[tuple[torch.Tensor, ...]] = []
        self.sites: list[SiteKey] = []
        self.example_ids = event.example_ids
        self.heads = event.heads
        self.query_hot_t = query_hot_transposed(event)
        self.query_fields_t = query_fields_transposed(event)  # [B, F, q]: the field groups' one-hot (F may be 0)
        self.live = live_queries(event)
        self.constants = constants
        self.shared: dict = {}

    @property
    def full(self) -> bool:
        """Whether every slot is filled."""
        return len(self.slots) >= self.capacity

    def add(self, event: AttentionEvent, parts: Sequence[torch.Tensor]) -> None:
        """Keep the event's per-query values (``parts``: [B, H, q, F_i] each, no autograd) in the next slot."""
        self.slots.append(tuple(parts))
        self.sites.append((event.stack, int(event.layer)))

    def stacked(self, part: int = 0) -> torch.Tensor:
        """[B, H, q, L, F]: one part of every filled slot, stacked along a slot dim next to the columns, in a buffer
        the stager reuses for that part (valid until the next stage's: fresh pages for every stage would cost
        more than the copy)."""
        tensors = [slot[part] for slot in self.slots]
        like = tensors[0]
        shape = (*like.shape[:3], len(tensors), like.shape[3])
        numel = math.prod(shape)
        buf = self._scratch.get((part, like.device, like.dtype))
        if buf is None or buf.numel() < numel:
            buf = self._scratch[part, like.device, like.dtype] = torch.empty(
                numel, dtype=like.dtype, device=like.device
            )
        return torch.stack(tensors, dim=3, out=buf[:numel].view(shape))

    def role_sums_of(self) -> torch.Tensor:
        """[L, B, H, R, F] float64: :meth:`role_sums` of the first part, computed once for the reducers that staged
        the very same tensors (the shared key-column sums) and reduce the stage during the same event."""
        tensors = tuple(slot[0] for slot in self.slots)
        cache = self.shared.setdefault("role_sums", IdentityCache(size=16))
        return cache.get((self.query_hot_t, *tensors), lambda: self.role_sums(self.stacked(0)))

    def role_sums(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` [B, H, q, L, F'] over the valid queries of each role: -> [L, B, H, R, F'] float64.

        Padding queries weigh 0; their values may be NaN (a fully masked row) and are zeroed first (in place:
        pass a tensor the caller owns, such as :meth:`stacked`'s). The sum over the chunk's queries runs in the
        values' precision (float32: relative error ~1e-7·√q); what it returns is float64, as the state is.
        """
        b, h, q, slots, f = values.shape
        hot = self.query_hot_t.to(values.dtype)[:, None]  # [B, 1, R, q]
        sums = torch.matmul(hot, values.nan_to_num_().view(b, h, q, slots * f))  # [B, H, R, L·F']: one product
        return sums.to(torch.float64).view(b, h, -1, slots, f).permute(3, 0, 1, 2, 4)

    def field_sums(self, values: torch.Tensor) -> torch.Tensor:
        """:meth:`role_sums` over the valid queries of each field group: [B, H, q, L, F'] -> [L, B, H, F, F'] float64
        (F = 0 when the run names no fields). Reads ``values`` only (NaN rows of padding queries weigh 0)."""
        b, h, q, slots, f = values.shape
        hot = self.query_fields_t.to(values.dtype)[:, None]  # [B, 1, F, q]
        sums = torch.matmul(hot, values.nan_to_num().view(b, h, q, slots * f))  # [B, H, F, L·F']
        return sums.to(torch.float64).view(b, h, -1, slots, f).permute(3, 0, 1, 2, 4)

    def field_query_counts(self) -> torch.Tensor:
        """[1, B, 1, F] float64: :meth:`query_counts` of the field groups."""
        return self.query_fields_t.sum(-1)[None, :, None, :]

    def field_live_counts(self) -> torch.Tensor:
        """[1, B, H|1, F] float64: :meth:`live_counts` of the field groups."""
        return torch.matmul(self.query_fields_t[:, None], self.live.unsqueeze(-1)).squeeze(-1)[None]

    def query_counts(self) -> torch.Tensor:
        """[1, B, 1, R] float64: valid queries of each role in the chunk (broadcasts over slots and heads), empty
        ones included: how many queries of each role exist (see :meth:`live_counts` for the ones averaged)."""
        return self.query_hot_t.sum(-1)[None, :, None, :]

    def live_counts(self) -> torch.Tensor:
        """[1, B, H|1, R] float64: valid queries of each role that see at least one valid key after every edit
        (mask, window, knockout): the queries a per-query mean averages over. A fully masked row (every key it could
        see knocked out) is all zeros: averaging it in as a value would pull every mean towards 0."""
        return torch.matmul(self.query_hot_t[:, None], self.live.unsqueeze(-1)).squeeze(-1)[None]


class Stager:
    """The open stages of one reducer: every event goes to the stage of its batch, query chunk and mask.

    Stages fill in the order of the events; a full stage, every stage when a new batch begins, and every
    stage on :meth:`close_all` move to :attr:`ready`, where the reducer takes them from (:meth:`next_ready`).
    """

    def __init__(self, budget_bytes: int = STAGE_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._open: dict[tuple, tuple[tuple, QueryStage]] = {}
        self._batch: torch.Tensor | None = None
        self._scratch: dict = {}  # stacking buffers, by part
        self.ready: list[QueryStage] = []

    def add(self, event: AttentionEvent, parts: Sequence[torch.Tensor], constants: Callable[[], dict]) -> None:
        """Keep the event's per-query values ``parts`` ([B, H, q, F_i]) in its stage (``constants()`` is called
        only when the event opens a new stage)."""
        if self._batch is not None and self._batch is not event.example_ids:
            self.close_all()  # a new batch: every open stage is complete
        self._batch = event.example_ids
        layout = event.layout
        keys = (
            event.example_ids,
            event.heads,
            layout.q.roles,
            layout.q.valid,
            layout.k.roles,
            layout.k.valid,
            event.visibility_key,
            event.stack,
            event.query_start,
            event.shape[1:3],
            event.device,
        )
        ident = identity_key(keys)
        hit = self._open.get(ident)
        if hit is not None and same_tensors(hit[0], keys):
            stage = hit[1]
        else:
            if hit is not None:  # cannot happen while the kept keys hold their ids; never drop a stage anyway
                self.ready.append(hit[1])
            stage = QueryStage(event, self._capacity(event, parts), constants(), self._scratch)
            self._open[ident] = (keys, stage)
        stage.add(event, parts)
        if stage.full:
            del self._open[ident]
            self.ready.append(stage)

    def _capacity(self, event: AttentionEvent, parts: Sequence[torch.Tensor]) -> int:
        """Slots per stage: the budget over the bytes one layer keeps for *all* query chunks of the call (the
        storage behind the parts, which may be views of larger tensors), so that the chunks' stages hold the
        same layers and fill together."""
        kept = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in parts}.values())
        total = event.query_total if event.query_total is not None else event.shape[2]
        per_layer = kept * max(total, 1) // max(event.shape[2], 1)
        return max(1, min(_MAX_SLOTS, self.budget_bytes // max(per_layer, 1)))

    def close_all(self) -> None:
        """Move every open stage to :attr:`ready`."""
        self.ready.extend(stage for _, stage in self._open.values())
        self._open.clear()
        self._batch = None

    def next_ready(self, shared: dict | None = None) -> QueryStage | None:
        """The oldest stage ready to reduce (it leaves the stager), with ``shared`` as its cache; None when none is."""
        if not self.ready:
            return None
        stage = self.ready.pop(0)
        if shared is not None:
            stage.shared = shared
        return stage

    def sites(self) -> set[SiteKey]:
        """The sites of every stage not reduced yet."""
        stages = [stage for _, stage in self._open.values()] + self.ready
        return {site for stage in stages for site in stage.sites}

    def release_buffers(self) -> None:
        """Free the stacking buffers (a stream allocates them again at its first full stage)."""
        self._scratch.clear()

    def clear(self) -> None:
        """Drop every stage, open or ready, and the stacking buffers."""
        self._open.clear()
        self.ready.clear()
        self._batch = None
        self.release_buffers()
