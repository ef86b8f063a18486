"""Per-example, per-head sum tables: the whole state of a metric reducer at one site."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch

SiteKey = tuple[str, int]  # (stack, layer)


class Packing:
    """Where each named array lives in one packed last dimension: name -> [*lead, *shape] views of [*lead, width].

    One tensor per table (and per pending block) instead of one per array means one addition per site
    instead of one per array, which is most of the cost of updating a table with small sums.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self.slices: dict[str, slice] = {}
        start = 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            self.slices[name] = slice(start, start + size)
            start += size
        self.width = start

    def unpack(self, packed: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``packed`` [*lead, width]: name -> [*lead, *shape]."""
        lead = packed.shape[:-1]
        return {name: packed[..., sl].view(*lead, *self.shapes[name]) for name, sl in self.slices.items()}

    def pack(self, values: Mapping[str, torch.Tensor], lead: tuple[int, ...]) -> torch.Tensor:
        """One float64 tensor [*lead, width] from ``values[name]`` ([*lead, *shape], size-1 dims broadcast)."""
        if set(values) != set(self.shapes):
            raise ValueError(f"values {sorted(values)} do not match the arrays {sorted(self.shapes)}")
        first = next(iter(values.values()))
        packed = torch.empty(*lead, self.width, dtype=torch.float64, device=first.device)
        for name, view in self.unpack(packed).items():
            view.copy_(values[name].detach().expand(view.shape))
        return packed


class SiteTable:
    """Float64 sums of one (stack, layer) site, one row per example and one column per head.

    arrays[name]: [capacity, H, *shapes[name]], views of one packed tensor (:class:`Packing`); row ``i``
    belongs to example ``examples[i]`` and column ``j`` to model head ``heads[j]``. Adding is
    ``index_put_(accumulate=True)``, so the same example seen twice (or in two shards) simply sums, in any
    order.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.packing = Packing(shapes)
        self.shapes = self.packing.shapes
        self._rows: dict[int, int] = {}
        self._cols: dict[int, int] = {}
        self._data = torch.zeros(0, 0, self.packing.width, dtype=torch.float64)
        self.arrays = self.packing.unpack(self._data)

    @property
    def examples(self) -> torch.Tensor:
        """[N] long: example ids in row order."""
        return torch.tensor(list(self._rows), dtype=torch.long)

    @property
    def heads(self) -> torch.Tensor:
        """[H] long: model head indices in column order."""
        return torch.tensor(list(self._cols), dtype=torch.long)

    def trimmed(self) -> dict[str, torch.Tensor]:
        """The arrays without spare capacity: name -> [N, H, *shape]."""
        n = len(self._rows)
        return {k: a[:n] for k, a in self.arrays.items()}

    def add(self, example_ids: torch.Tensor, heads: torch.Tensor, values: Mapping[str, torch.Tensor]) -> None:
        """Add ``values[name]`` ([B, H, *shape]) to the rows of ``example_ids`` ([B]) and columns of ``heads`` ([H])."""
        lead = (example_ids.numel(), heads.numel())
        self.add_packed(example_ids.tolist(), heads.tolist(), self.packing.pack(values, lead))

    def add_packed(self, example_ids: list[int], heads: list[int], packed: torch.Tensor) -> None:
        """Add packed values [B, H, width] (any device) to the rows of ``example_ids`` and columns of ``heads``."""
        rows = [self._rows.setdefault(int(e), len(self._rows)) for e in example_ids]
        cols = [self._cols.setdefault(int(h), len(self._cols)) for h in heads]
        self._reserve()
        packed = packed.detach().to(device="cpu", dtype=torch.float64)
        # the common case (new examples in order, every head in order) is a slice: no scatter
        r0, c0 = rows[0] if rows else 0, cols[0] if cols else 0
        if rows == list(range(r0, r0 + len(rows))) and cols == list(range(c0, c0 + len(cols))):
            self._data[r0 : r0 + len(rows), c0 : c0 + len(cols)].add_(packed)
        else:
            self._data.index_put_(
                (torch.tensor(rows).view(-1, 1), torch.tensor(cols).view(1, -1)), packed, accumulate=True
            )

    def merge(self, other: SiteTable) -> None:
        """Add another table's sums (same shapes) into this one."""
        if other.shapes != self.shapes:
            raise ValueError(f"cannot merge tables of shapes {other.shapes} into {self.shapes}")
        if other._rows and other._cols:
            self.add(other.examples, other.heads, other.trimmed())

    def state(self) -> dict:
        """Plain tensors: ``examples`` [N], ``heads`` [H] and ``arrays`` name -> [N, H, *shape]."""
        return {
            "examples": self.examples,
            "heads": self.heads,
            "arrays": {k: v.clone() for k, v in self.trimmed().items()},
        }

    @classmethod
    def from_state(cls, shapes: Mapping[str, tuple[int, ...]], state: Mapping) -> SiteTable:
        """Rebuild a table from ``state()`` output."""
        table = cls(shapes)
        arrays = state["arrays"]
        if set(arrays) != set(table.shapes):
            raise ValueError(f"state arrays {sorted(arrays)} do not match {sorted(table.shapes)}")
        examples = torch.as_tensor(state["examples"], dtype=torch.long)
        heads = torch.as_tensor(state["heads"], dtype=torch.long)
        if examples.numel() and heads.numel():
            table.add(examples, heads, {k: torch.as_tensor(v) for k, v in arrays.items()})
        return table

    def _reserve(self) -> None:
        """Grow the packed data (rows doubling) to hold every known example and head."""
        n, h = len(self._rows), len(self._cols)
        cap, width = self._data.shape[0], self._data.shape[1]
        if n <= cap and h == width:
            return
        new_cap = max(n, 2 * cap, 8) if n > cap else cap
        grown = torch.zeros(new_cap, h, self.packing.width, dtype=torch.float64)
        grown[:cap, :width] = self._data
        self._data = grown
        self.arrays = self.packing.unpack(grown)


class SiteSums:
    """One :class:`SiteTable` per site, with the sums of one batch added up on the device before they reach it.

    The attention calls of one forward (every layer, every query chunk) arrive as many small sums for the
    same examples and heads; adding each to a table costs a device-to-host copy and a scatter. Sums arrive
    for a group of sites at once (the layers of a stage, stacked) and wait in a pending block per group:
    further sums for the very same group, ``example_ids`` and ``heads`` tensors (the capture passes one object
    per batch; the query chunks of a call fill stages of the same layers) are added to it in place, in one
    operation for the whole group. A block goes into the tables once, when one of its sites is reached by
    another group or batch, or when anyone reads (:meth:`flush`, :meth:`tables`).
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self._tables: dict[SiteKey, SiteTable] = {}
        self.packing = Packing(shapes)
        # group of sites -> (example_ids, heads, packed sums [L, B, H, width])
        self._pending: dict[tuple[SiteKey, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._group_of: dict[SiteKey, tuple[SiteKey, ...]] = {}

    def add(
        self,
        sites: Sequence[SiteKey],
        example_ids: torch.Tensor,
        heads: torch.Tensor,
        values: Mapping[str, torch.Tensor],
    ) -> None:
        """Add ``values[name]`` ([L, B, H, *shape], size-1 dims broadcast) to the L ``sites``, rows
        ``example_ids`` ([B]) and columns ``heads`` ([H])."""
        group = tuple(sites)
        if len(set(group)) != len(group):  # a site twice in one group: add the slots one by one
            for i, site in enumerate(group):
                one = {name: v[i : i + 1] if v.shape[0] > 1 else v for name, v in values.items()}
                self.add([site], example_ids, heads, one)
            return
        pending = self._pending.get(group)
        if pending is not None and pending[0] is example_ids and pending[1] is heads:
            for name, view in self.packing.unpack(pending[2]).items():
                view.add_(values[name].detach())
            return
        for site in group:  # sites still waiting in another group (or batch) go to their tables first
            if site in self._group_of:
                self._commit(self._group_of[site])
        block = self.packing.pack(values, (len(group), example_ids.numel(), heads.numel()))
        self._pending[group] = (example_ids, heads, block)
        for site in group:
            self._group_of[site] = group

    def flush(self) -> None:
        """Move every pending block into its tables."""
        for group in list(self._pending):
            self._commit(group)

    def tables(self) -> dict[SiteKey, SiteTable]:
        """The per-site tables, pending sums included."""
        self.flush()
        return self._tables

    def table(self, site: SiteKey) -> SiteTable:
        """The table of one site (created empty if new), pending sums included."""
        if site in self._group_of:
            self._commit(self._group_of[site])
        if site not in self._tables:
            self._tables[site] = SiteTable(self.shapes)
        return self._tables[site]

    def known_sites(self) -> set[SiteKey]:
        """Every site with a table or pending sums (commits nothing)."""
        return set(self._tables) | set(self._group_of)

    def items(self) -> Iterator[tuple[SiteKey, SiteTable]]:
        """(site, table) pairs sorted by site, pending sums included."""
        return iter(sorted(self.tables().items()))

    def merge(self, other: SiteSums) -> None:
        """Add another ``SiteSums``' tables (same shapes) into these."""
        for site, table in other.tables().items():
            self.table(site).merge(table)

    def replace(self, tables: Mapping[SiteKey, SiteTable]) -> None:
        """Drop everything (pending sums included) and hold ``tables`` instead."""
        self._pending.clear()
        self._group_of.clear()
        self._tables = dict(tables)

    def _commit(self, group: tuple[SiteKey, ...]) -> None:
        example_ids, heads, block = self._pending.pop(group)
        for site in group:
            del self._group_of[site]
        block = block.to("cpu")  # one host copy for the whole group
        ids, cols = example_ids.tolist(), heads.tolist()
        for i, site in enumerate(group):
            self.table(site).add_packed(ids, cols, block[i])
