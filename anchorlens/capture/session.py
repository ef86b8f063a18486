"""The active capture session: which modules are sites, which heads, and where events go.

A :class:`CaptureSession` is the engine's observer (:class:`~anchorlens.engine.observer.Observer`): while
:func:`activate` holds it, the engine's attention function hands it the probabilities of every selected site.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch

from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.reducer import reads_of
from anchorlens.capture.selection import Selection, Site
from anchorlens.engine.call import KeySpan
from anchorlens.engine.context import observing
from anchorlens.engine.quantities import KERNEL_QUANTITIES
from anchorlens.errors import UsageError
from anchorlens.roles.layout import Layout, LayoutProvider


class Sink(Protocol):
    """Receives every captured attention event.

    A sink may also define ``key_columns(layout, device, dtype) -> Tensor | None``: weights [B, K, C] over the
    layout's keys whose probability sums its consumers read. Where the capture computes the output from the
    probabilities anyway (fast mode), it computes these sums in the same product and hands them over as
    :attr:`AttentionEvent.key_sums`.
    """

    def consume(self, event: AttentionEvent) -> None:
        """Handle one event (reduce it, or store a copy: its probs and scores are reused buffers)."""
        ...


class CaptureSession:
    """Maps attention modules to sites and forwards recomputed probabilities to a sink (the engine's observer)."""

    def __init__(
        self,
        sites: Sequence[tuple[Site, torch.nn.Module]],
        sink: Sink,
        layout: LayoutProvider,
        example_ids: torch.Tensor,
        selection: Selection = Selection(),
        options: CaptureOptions = CaptureOptions(),
        num_heads: int | None = None,
        scratch: dict | None = None,
        layers_per_stack: dict[str, int] | None = None,
    ) -> None:
        """Raises UsageError before any forward when ``selection`` names layers/heads the model lacks.

        ``scratch``: the buffers (by name) to reuse, shared by the sessions of one stream of batches so that
        they are allocated once, not once per batch (a fresh dict when None). ``layers_per_stack``: blocks per
        stack (hybrid models have blocks without a site; None: one past each stack's last site)."""
        attention: dict[str, set[int]] = {}
        for site, _ in sites:
            attention.setdefault(site.stack, set()).add(site.layer)
        if layers_per_stack is None:
            layers_per_stack = {stack: max(layers) + 1 for stack, layers in attention.items()}
        selection.validate(layers_per_stack, num_heads, attention)
        self._sites = {
            id(module): site for site, module in sites if selection.accepts(site, layers_per_stack[site.stack])
        }
        self.sink = sink
        self.layout = layout
        self.example_ids = example_ids
        self.heads = selection.heads if num_heads is None else selection.head_indices(num_heads)
        self.options = options
        self.scratch: dict = {} if scratch is None else scratch  # reused buffers, by name
        # per-forward work keyed on the mask and layout tensors the layers share (visibility, query slices)
        self.shared = IdentityCache(size=256)
        self._heads_cache: dict[tuple[torch.device, int], torch.Tensor] = {}
        self.plans: dict[str, set[str]] = {}  # site name -> the plans the engine took there
        self._reads = reads_of(sink)
        if options.plan == "kernel":  # refused before any forward where a reducer reads what the kernel plan lacks
            missing = sorted(self._reads - KERNEL_QUANTITIES)
            if missing:
                who = ", ".join(self.readers(missing[0])) or "the sink"
                raise UsageError(
                    f"{who} reads {missing[0]}, which the kernel plan does not compute: capture with plan auto or "
                    "materialised, or leave that reducer out"
                )

    @property
    def selected_sites(self) -> list[Site]:
        """The sites this session records."""
        return sorted(self._sites.values(), key=lambda s: (s.stack, s.layer))

    def site_of(self, module: torch.nn.Module) -> Site | None:
        """The site of an attention module, or None if it is not selected."""
        return self._sites.get(id(module))

    def heads_tensor(self, device: torch.device) -> torch.Tensor | None:
        """[H_sel] long indices of the selected heads on ``device``, or None for all heads."""
        if self.heads is None:
            return None
        if (device, -1) not in self._heads_cache:  # -1: the selection, other widths: every head
            self._heads_cache[device, -1] = torch.tensor(self.heads, dtype=torch.long, device=device)
        return self._heads_cache[device, -1]

    def _event_heads(self, width: int, device: torch.device) -> torch.Tensor:
        """[H] long model head indices of an event's ``width`` heads: one tensor per device for the whole batch
        (sinks recognise the calls of one batch by it)."""
        heads = self.heads_tensor(device)
        if heads is not None:
            return heads
        if (device, width) not in self._heads_cache:
            self._heads_cache[device, width] = torch.arange(width, device=device)
        return self._heads_cache[device, width]

    @property
    def reads(self) -> frozenset[str]:
        """The quantities the sink reads (its ``reads``; every quantity when it declares none)."""
        return self._reads

    def readers(self, quantity: str) -> list[str]:
        """The sink's readers of ``quantity`` (its ``readers``), else its class name when it reads it."""
        ask = getattr(self.sink, "readers", None)
        if callable(ask):
            return list(ask(quantity))
        return [type(self.sink).__name__] if quantity in self._reads else []

    def note_plan(self, site: Site, plan: str) -> None:
        """Record the plan the engine took at ``site`` (and tell the sink, when it keeps a record: ``note_plan``)."""
        self.plans.setdefault(site.name, set()).add(plan)
        tell = getattr(self.sink, "note_plan", None)
        if callable(tell):
            tell(site.name, plan)

    @property
    def wants_value_norms(self) -> bool:
        """Whether the sink reads the per-head value norms (``wants_value_norms`` true): the capture then computes
        them once per attention call."""
        return bool(getattr(self.sink, "wants_value_norms", False))

    def key_columns(self, site: Site, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, C] key columns the sink wants probability sums over at ``site`` (None when it wants none); asked
        once per layout and forward."""
        return self._sink_columns("key_columns", site, device, dtype)

    def score_columns(self, site: Site, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, S] weight columns the sink wants score sums over at ``site`` (None when it wants none)."""
        return self._sink_columns("score_columns", site, device, dtype)

    def _sink_columns(self, name: str, site: Site, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """The sink's method ``name`` for the layout of ``site``, once per layout and forward (None without it)."""
        ask = getattr(self.sink, name, None)
        if not callable(ask):
            return None
        layout = self.layout.layout(site.stack, site.layer)
        return self.shared.get(
            (name, layout.k.roles, layout.k.valid, layout.k.fields, device, dtype), lambda: ask(layout, device, dtype)
        )

    def valid_queries(self, site: Site, device: torch.device) -> torch.Tensor:
        """[B, Q] bool: the real (not padding) queries of ``site``'s layout, once per layout and forward."""
        q = self.layout.layout(site.stack, site.layer).q
        return self.shared.get(("valid_queries", q.valid, device), lambda: q.valid.to(device).bool())

    def emit(
        self,
        site: Site,
        probs: torch.Tensor | None,
        visible: torch.Tensor | KeySpan,
        query_start: int = 0,
        scores: torch.Tensor | None = None,
        log_norm: torch.Tensor | None = None,
        key_sums: torch.Tensor | None = None,
        key_columns: torch.Tensor | None = None,
        learned_sink: torch.Tensor | None = None,
        value_norms: torch.Tensor | None = None,
        score_sums: torch.Tensor | None = None,
        score_columns: torch.Tensor | None = None,
        plan: str = "materialised",
        received: torch.Tensor | None = None,
        value_sums: torch.Tensor | None = None,
    ) -> None:
        """Build the event for ``probs`` [B, H, q, K'] (queries ``query_start:query_start+q``, the first K' keys;
        None under the kernel plan, whose ``log_norm`` [B, H, q, 1] then gives the shape)
        and hand it on. ``key_sums``: [B, H, q, C] sums of ``probs`` over ``key_columns`` [B, K, C] (see
        :meth:`key_columns`), when the capture computed them. ``learned_sink``: [B, H, q], the mass of a learned
        sink logit (gpt-oss), when the site has one. ``value_norms``: [B, H, K] ||v_j W_O^h||, when the sink asks for
        them (:attr:`wants_value_norms`). ``received``: [B, H, K'] the mass each key receives from the valid queries,
        and ``value_sums`` [B, H, q, C] the key sums weighted by the value norms, when the kernel plan computed them
        (the sink reads them)."""
        shaped = probs if probs is not None else log_norm
        assert shaped is not None, "an event without probabilities carries its log normaliser"
        heads = self._event_heads(shaped.shape[1], shaped.device)
        layout = self.layout.layout(site.stack, site.layer)
        q_total = layout.q.roles.shape[1]
        if isinstance(visible, KeySpan):
            span, dense, k_len = visible, None, visible.key_count
        else:
            span, dense, k_len = None, visible, visible.shape[-1]
        q_len = shaped.shape[2]
        if query_start + q_len > q_total or k_len > layout.k.roles.shape[1]:
            raise RuntimeError(
                f"capture at {site.name}: attention is {(q_len, k_len)} (queries, keys) from query "
                f"{query_start} but the layout knows {q_total} queries and {layout.k.roles.shape[1]} keys"
            )
        if q_len != q_total:
            layout = self._query_slice(layout, query_start, query_start + q_len)
        self.sink.consume(
            AttentionEvent(
                site.stack,
                site.layer,
                heads,
                probs,
                dense,
                layout,
                self.example_ids,
                query_start,
                q_total,
                scores,
                log_norm,
                key_sums=key_sums,
                key_columns=key_columns,
                learned_sink=learned_sink,
                value_norms=value_norms,
                score_sums=score_sums,
                score_columns=score_columns,
                plan=plan,
                received=received,
                value_sums=value_sums,
                key_parts=self._column_parts(key_columns),
                score_parts=self._column_parts(score_columns),
                key_span=span,
                cache={}
                if probs is None
                else {"work": self.scratch_buffer("work", probs.numel(), probs.dtype, probs.device)},
            )
        )

    def _column_parts(self, columns: torch.Tensor | None) -> tuple[tuple[torch.Tensor, int], ...]:
        """The reducers' own column tensors the sink joined into ``columns`` (its ``column_parts``), with their first
        columns."""
        ask = getattr(self.sink, "column_parts", None)
        return tuple(ask(columns)) if callable(ask) and columns is not None else ()

    def _query_slice(self, layout: Layout, start: int, stop: int) -> Layout:
        """``layout`` restricted to queries ``start:stop``; the same objects for every layer of the forward
        (so that reducers' per-forward caches, keyed on tensor identity, hit)."""
        q = layout.q
        return self.shared.get(
            ("query_slice", q.roles, q.valid, layout.k.roles, layout.k.valid, start, stop),
            lambda: Layout(q.slice(start, stop), layout.k),
        )

    def scratch_buffer(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat buffer of at least ``numel`` elements reused by every layer (and by the next batches of a stream:
        ``"logits"``/``"probs"``: the attention function's; ``"work"``: lent to reducers as ``cache["work"]``)."""
        key = (name, device, dtype)
        buf = self.scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = self.scratch[key] = torch.empty(numel, dtype=dtype, device=device)
        return buf


@contextmanager
def activate(session: CaptureSession) -> Iterator[CaptureSession]:
    """Make ``session`` the engine's active observer for the duration of the block."""
    with observing(session):
        yield session
