"""Shared machinery of the metric reducers: staging, site tables, merging, state dicts."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd
import torch

from anchorlens.analyses.frames import ALL
from anchorlens.analyses.rows import Rows
from anchorlens.analyses.shared import columns_of_layout, score_columns_of_layout
from anchorlens.analyses.stage import QueryStage, Stager
from anchorlens.analyses.table import SiteSums, SiteTable
from anchorlens.capture.event import AttentionEvent
from anchorlens.engine.quantities import KEY_SUMS, PROBS, SCORE_SUMS, SCORES, VALUE_SUMS, VISIBLE
from anchorlens.errors import UsageError
from anchorlens.roles.layout import Layout
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable


def with_all(sums: torch.Tensor, counts: torch.Tensor, roles: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the ``all`` query-role total along dim 2: [N, H, S, ...], [N, H, S] -> [N, H, S+1, ...], [N, H, S+1].

    ``roles``: sum only the first ``roles`` entries (the roles, which partition the queries; the field groups after
    them are a finer partition of ``content`` and would count its queries twice); None sums all S."""
    part = slice(None) if roles is None else slice(0, roles)
    return (
        torch.cat([sums, sums[:, :, part].sum(2, keepdim=True)], dim=2),
        torch.cat([counts, counts[:, :, part].sum(2, keepdim=True)], dim=2),
    )


def mean_of(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``sums / counts`` broadcast over trailing dims of ``sums``, 0 where the count is 0."""
    c = counts.reshape(counts.shape + (1,) * (sums.dim() - counts.dim()))
    return (sums / c.clamp_min(1e-300)).masked_fill_(c <= 0, 0.0)


def mean_or_empty(sums: torch.Tensor, live: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, keep): ``sums / live`` (:func:`mean_of`) with NaN where queries exist (``queries`` > 0) but none of
    them sees a key (``live`` == 0: empty rows, never averaged in as zeros), and keep [..] = queries > 0 (the cells
    that give a row: measured, or empty and flagged). live, queries: [N, H, S]; sums [N, H, S, ...]."""
    value = mean_of(sums, live)
    empty = (live <= 0).reshape(live.shape + (1,) * (sums.dim() - live.dim()))
    return value.masked_fill_(empty.expand_as(value), float("nan")), queries > 0


def _ascending(index: torch.Tensor) -> bool:
    """Whether a 1-d index is already sorted (then reordering by it would copy every array for nothing)."""
    return index.numel() < 2 or bool((index[1:] >= index[:-1]).all())


class SiteReducer:
    """Base of the metric reducers: per-site :class:`SiteTable` of per-example sums.

    ``roles``: the run's role table; state arrays have one entry per role (R = ``roles.size``) and frames name
    the roles from it. Events of another table are refused (build the reducer with the run's roles).
    Subclasses set ``name`` and implement ``_shapes`` (state arrays per example and head), ``_per_query``
    (an event's per-query values, e.g. read from the shared key-column sums), ``_reduce_stage`` (the
    per-query values of a stage of layers -> their sums) and ``_site_frame`` (arrays -> tidy rows), and list
    the options that change the state in ``state_options``. Each event only hands its per-query tensors to
    a :class:`~anchorlens.analyses.stage.QueryStage`; stages are reduced several layers at a time, and their
    sums wait on the device (:class:`SiteSums`) until the next batch comes or the state is read.
    """

    name: ClassVar[str] = ""
    # the quantities ``update`` reads (:mod:`anchorlens.engine.quantities`): the engine computes only what some
    # reducer reads, and picks a plan that gives all of it; a reducer that reads the maps themselves keeps ``probs``
    reads: frozenset[str] = frozenset({PROBS, SCORES, VISIBLE})

    def __init__(self, roles: RoleTable = BUILTIN_ROLES) -> None:
        if not isinstance(roles, RoleTable):
            raise TypeError(f"roles must be a RoleTable, got {type(roles).__name__}")
        self.roles = roles
        self._sums = SiteSums(self._shapes())
        self._stager = Stager()

    @property
    def num_roles(self) -> int:
        """R, the number of roles of the run."""
        return self.roles.size

    @property
    def query_labels(self) -> tuple[str, ...]:
        """Query-role labels of the frames: every role, then ``all``."""
        return self.roles.names + (ALL,)

    # -- to implement -------------------------------------------------------------------------
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-example, per-head shape of every state array."""
        raise NotImplementedError

    def _per_query(self, event: AttentionEvent) -> tuple[torch.Tensor, ...]:
        """The event's per-query values: [B, H, q, F_i] float tensors the reducer may keep (not views of the
        capture's reused buffers), one stage part each."""
        raise NotImplementedError

    def _stage_constants(self, event: AttentionEvent) -> dict:
        """What every slot of a new stage shares, derived once from its first event's mask and layout."""
        return {}

    def _reduce_stage(self, stage: QueryStage) -> dict[str, torch.Tensor]:
        """A stage's sums: name -> [L or 1, B, H or 1, *shape] (size-1 dims broadcast over slots or heads)."""
        raise NotImplementedError

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """Tidy rows of one site from its arrays (rows sorted by example, columns by head)."""
        raise NotImplementedError

    def state_options(self) -> dict:
        """Options that change what the state means; merging requires them equal (the role names always: they give
        the state's role axes)."""
        return {"roles": list(self.roles.names), **self._options()}

    def _options(self) -> dict:
        """A subclass's own state options."""
        return {}

    def key_columns(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, C] key columns whose probability sums ``_per_query`` reads (:func:`column_mass`), for the capture
        to compute with the output; None when it reads none (then the capture does not compute them for it)."""
        return columns_of_layout(layout, device, dtype) if self.reads & {KEY_SUMS, VALUE_SUMS} else None

    def score_columns(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, S] weight columns whose score sums ``_per_query`` reads (:func:`column_plogp`), for the capture to
        compute where it computes no probabilities; None when it reads none."""
        return score_columns_of_layout(layout, device, dtype) if SCORE_SUMS in self.reads else None

    # -- Reducer protocol ---------------------------------------------------------------------
    def update(self, event: AttentionEvent) -> None:
        """Stage one batch's per-query values at one site; reduce the stages that are complete."""
        self._check_roles(event)
        self._stager.add(event, self._per_query(event), lambda: self._stage_constants(event))
        if self._stager.ready:
            self._reduce_ready(event.cache)

    def _check_roles(self, event: AttentionEvent) -> None:
        """Refuse (UsageError) an event whose role table is not the one this reducer counts."""
        table = event.layout.k.table
        if table is not self.roles and table.names != self.roles.names:
            raise UsageError(
                f"reducer {self.name} counts roles {', '.join(self.roles.names)} but the run has "
                f"{', '.join(table.names)}; build it with the run's roles (roles=...)"
            )

    def _reduce_ready(self, shared: dict | None = None) -> None:
        """Reduce every complete stage into the pending sums (one at a time: an error loses no other stage)."""
        while (stage := self._stager.next_ready(shared)) is not None:
            self._add_stage(stage)

    def _add_stage(self, stage: QueryStage) -> None:
        """Add one stage's sums to the state."""
        self._sums.add(stage.sites, stage.example_ids, stage.heads, self._reduce_stage(stage))

    def flush(self) -> None:
        """Reduce every stage and move the pending sums into the tables (reading the state does it first)."""
        self._stager.close_all()
        self._reduce_ready()
        self._stager.release_buffers()
        self._sums.flush()

    def merge(self, other: SiteReducer) -> None:
        """Add another reducer's sums (same class and state options) into this one."""
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        if other.state_options() != self.state_options():
            raise ValueError(
                f"cannot merge {self.name} reducers with options {other.state_options()} and {self.state_options()}"
            )
        self.flush()
        other.flush()
        self._sums.merge(other._sums)

    def state_dict(self) -> dict:
        """``{"name", "options", "sites": [{"stack", "layer", "examples", "heads", "arrays"}]}``."""
        self.flush()
        return {
            "name": self.name,
            "options": dict(self.state_options()),
            "sites": [
                {"stack": stack, "layer": layer, **table.state()} for (stack, layer), table in self._sums.items()
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the state with ``state_dict()`` output of a reducer of the same name and options."""
        if state.get("name") != self.name:
            raise ValueError(f"state of reducer {state.get('name')!r} given to {self.name!r}")
        if dict(state.get("options", {})) != self.state_options():
            raise ValueError(f"state options {state.get('options')} differ from {self.state_options()}")
        shapes = self._shapes()
        self._stager.clear()
        self._sums.replace(
            {(str(site["stack"]), int(site["layer"])): SiteTable.from_state(shapes, site) for site in state["sites"]}
        )

    def rows(self) -> Rows:
        """Tidy rows as columns (:class:`~anchorlens.analyses.rows.Rows`), sorted by stack, layer, example, head."""
        self.flush()
        parts = []
        for (stack, layer), table in self._sums.items():
            examples, heads = table.examples, table.heads
            if examples.numel() == 0 or heads.numel() == 0:
                continue
            arrays = table.trimmed()
            if not _ascending(examples):
                row_order = torch.argsort(examples)
                examples, arrays = examples[row_order], {k: v.index_select(0, row_order) for k, v in arrays.items()}
            if not _ascending(heads):
                col_order = torch.argsort(heads)
                heads, arrays = heads[col_order], {k: v.index_select(1, col_order) for k, v in arrays.items()}
            parts.append(self._site_rows(stack, layer, examples.numpy(), heads.numpy(), arrays))
        return Rows.concat(parts)

    def frame(self) -> pd.DataFrame:
        """Tidy rows (see :mod:`anchorlens.analyses.frames`), sorted by stack, layer, example, head."""
        return self.rows().frame()

    def sites(self) -> list[tuple[str, int]]:
        """The (stack, layer) sites seen so far, sorted."""
        self.flush()
        return sorted(self._sums.tables())

    def __repr__(self) -> str:
        sites = self._sums.known_sites() | self._stager.sites()  # no flush: printing must not reduce anything
        return f"{type(self).__name__}(sites={len(sites)}, options={self.state_options()})"
