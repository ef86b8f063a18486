"""Sinks that consume attention events: full maps for a few examples, or streaming reducers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from anchorlens.capture.event import AttentionEvent, HiddenEvent
from anchorlens.capture.maps import AttentionMaps, StackMaps
from anchorlens.capture.reducer import Reducer, reads_of
from anchorlens.engine.quantities import PROBS, VALUE_NORMS, VALUE_SUMS, VISIBLE
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import GUIDANCE_ROLES, Role
from anchorlens.roles.layout import Layout

_JOINED_KEPT = 16  # joined column tensors a stream remembers (a forward asks for one or two per layout)


class StreamSink:
    """Feeds every event to reducers; holds no map beyond the one being reduced."""

    def __init__(self, reducers: Iterable[Reducer]) -> None:
        self.reducers = list(reducers)
        self.events = 0
        self.plans: dict[str, str] = {}  # site name -> the engine's plan there (``"mixed"`` where it changed)
        # joined column tensors (by id) -> (the tensor, its parts with their first columns), the latest few
        self._joined: dict[int, tuple[torch.Tensor, tuple[tuple[torch.Tensor, int], ...]]] = {}

    def consume(self, event: AttentionEvent) -> None:
        """Update every reducer with the event."""
        for reducer in self.reducers:
            reducer.update(event)
        self.events += 1

    @property
    def reads(self) -> frozenset[str]:
        """The quantities some reducer reads (:mod:`anchorlens.engine.quantities`; a reducer that declares no
        ``reads`` may read anything)."""
        return frozenset().union(*(reads_of(r) for r in self.reducers))

    def readers(self, quantity: str) -> list[str]:
        """The names of the reducers that read ``quantity``."""
        return [str(getattr(r, "name", type(r).__name__)) for r in self.reducers if quantity in reads_of(r)]

    def note_plan(self, site: str, plan: str) -> None:
        """Record the plan the engine took at ``site`` (:mod:`anchorlens.engine.plan`)."""
        merge_plans(self.plans, {site: plan})

    @property
    def wants_value_norms(self) -> bool:
        """Whether some reducer reads the events' ``value_norms``, or the key sums weighted by them (``value_sums``)."""
        return bool(self.reads & {VALUE_NORMS, VALUE_SUMS})

    @property
    def wants_hidden(self) -> bool:
        """Whether some reducer reads block outputs (defines ``update_hidden``): the capture then hooks the blocks."""
        return any(callable(getattr(r, "update_hidden", None)) for r in self.reducers)

    def consume_hidden(self, event: HiddenEvent) -> None:
        """Hand one block's output to the reducers that read block outputs."""
        for reducer in self.reducers:
            update = getattr(reducer, "update_hidden", None)
            if callable(update):
                update(event)

    def key_columns(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """The [B, K, C] key columns the reducers read probability sums over (see :class:`~anchorlens.capture.session.Sink`):
        the tensor the reducers that define ``key_columns`` return, or the distinct ones side by side (each reducer
        finds its own with :meth:`~anchorlens.capture.event.AttentionEvent.sums_over`); None when none asks."""
        return self._columns("key_columns", layout, device, dtype)

    def score_columns(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """The [B, K, S] weight columns the reducers read score sums over (``score_columns``), as :meth:`key_columns`."""
        return self._columns("score_columns", layout, device, dtype)

    def column_parts(self, columns: torch.Tensor | None) -> tuple[tuple[torch.Tensor, int], ...]:
        """The reducers' own column tensors that :meth:`key_columns` or :meth:`score_columns` put side by side in
        ``columns``, each with its first column; empty when ``columns`` is one reducer's own."""
        if columns is None:
            return ()
        hit = self._joined.get(id(columns))
        return hit[1] if hit is not None and hit[0] is columns else ()

    def _columns(self, name: str, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """The tensor the reducers' methods ``name`` return, or their distinct tensors joined (None when none asks)."""
        found: list[torch.Tensor] = []
        for reducer in self.reducers:
            ask = getattr(reducer, name, None)
            columns = ask(layout, device, dtype) if callable(ask) else None
            if columns is not None and not any(columns is seen for seen in found):
                found.append(columns)
        if len(found) <= 1:
            return found[0] if found else None
        joined = torch.cat(found, -1)
        starts = [0]
        for part in found[:-1]:
            starts.append(starts[-1] + part.shape[-1])
        if len(self._joined) >= _JOINED_KEPT:  # the oldest forwards' joins are no longer asked for
            self._joined.pop(next(iter(self._joined)))
        self._joined[id(joined)] = (joined, tuple(zip(found, starts)))
        return joined

    def close(self) -> None:
        """End of the stream: reducers that buffer (those with a ``flush``) move what they hold into their state
        and free their staging buffers."""
        for reducer in self.reducers:
            flush = getattr(reducer, "flush", None)
            if callable(flush):
                flush()


MIXED = "mixed"  # a site where the engine took both plans (some batches or calls one, some the other)


def merge_plans(into: dict[str, str], plans: Mapping[str, str]) -> dict[str, str]:
    """Fold ``plans`` (site name -> plan) into ``into`` and return it: a site keeps its plan where both agree and
    becomes ``"mixed"`` where they differ (chunks, ranks or batches that took different plans)."""
    for site, plan in plans.items():
        into[site] = plan if into.get(site, plan) == plan else MIXED
    return into


def _labels(roles: list[int], source_tokens: list[str]) -> list[str]:
    """Token labels for valid positions: inserted guidance positions become ``<role>``."""
    out, it = [], iter(source_tokens)
    guidance = {int(r) for r in GUIDANCE_ROLES}
    for r in roles:
        out.append(f"<{Role(r).label}>" if r in guidance else next(it, "?"))
    return out


class MapSink:
    """Keeps full [layers, heads, Q, K] maps (padding removed) of at most ``max_examples`` examples."""

    reads = frozenset({PROBS, VISIBLE})

    def __init__(self, max_examples: int = 8) -> None:
        self.max_examples = max_examples
        self._parts: dict[int, dict[str, dict[int, tuple]]] = {}
        self._tokens: dict[int, dict[str, list[str]]] = {}
        self._role_names: dict[int, tuple[str, ...]] = {}

    def begin_batch(self, batch: Encoded) -> None:
        """Remember the token texts of a batch about to run (needed for labels)."""
        for row, ex in enumerate(batch.example_ids.tolist()):
            valid = batch.attention_mask[row].bool().tolist()
            seqs = {"input": [t for t, v in zip(batch.tokens[row], valid) if v]}
            if batch.target_ids is not None and batch.target_mask is not None:
                seqs["target"] = [
                    str(i) for i, v in zip(batch.target_ids[row].tolist(), batch.target_mask[row].tolist()) if v
                ]
            self._tokens[ex] = seqs

    def consume(self, event: AttentionEvent) -> None:
        """Store the valid part of each example's map at this site; query chunks are assembled in order."""
        for row, ex in enumerate(event.example_ids.tolist()):
            if ex not in self._parts and len(self._parts) >= self.max_examples:
                continue
            qv = event.layout.q.valid[row]
            kv = event.layout.k.valid[row]
            probs = event.full_probs()[row][:, qv][:, :, kv].detach().cpu().clone()  # [H, q_valid, K_valid]
            sink = None if event.learned_sink is None else event.learned_sink[row][:, qv].detach().cpu().clone()
            q_roles = event.layout.q.roles[row][qv].cpu()
            site = self._parts.setdefault(ex, {}).setdefault(event.stack, {})
            if not event.is_first_chunk and event.layer in site:
                prev_probs, heads, prev_roles, k_roles, prev_sink = site[event.layer]
                probs = torch.cat([prev_probs, probs], dim=1)
                q_roles = torch.cat([prev_roles, q_roles])
                sink = None if sink is None or prev_sink is None else torch.cat([prev_sink, sink], dim=1)
            site[event.layer] = (probs, event.heads.tolist(), q_roles, event.layout.k.roles[row][kv].cpu(), sink)
            self._role_names[ex] = event.layout.table.names

    def maps(self, stack_sequences: dict[str, tuple[str, str]]) -> list[AttentionMaps]:
        """The collected maps, one ``AttentionMaps`` per example, in arrival order."""
        out = []
        for ex, stacks in self._parts.items():
            built = {}
            for stack, layers in stacks.items():
                order = sorted(layers)
                shapes = {layers[layer][0].shape for layer in order}
                if len(shapes) != 1:
                    raise RuntimeError(f"maps of stack {stack} differ in shape across layers: {sorted(shapes)}")
                _, heads, q_roles, k_roles, _ = layers[order[0]]
                sinks = [layers[layer][4] for layer in order]
                q_name, k_name = stack_sequences[stack]
                toks = self._tokens.get(ex, {})
                built[stack] = StackMaps(
                    probs=torch.stack([layers[layer][0] for layer in order]),
                    layers=order,
                    heads=heads,
                    q_roles=q_roles,
                    k_roles=k_roles,
                    q_tokens=_labels(q_roles.tolist(), toks.get(q_name, [])),
                    k_tokens=_labels(k_roles.tolist(), toks.get(k_name, [])),
                    role_names=self._role_names[ex],
                    learned_sink=None if any(x is None for x in sinks) else torch.stack(sinks),
                )
            out.append(AttentionMaps(example_id=ex, stacks=built))
        return out
