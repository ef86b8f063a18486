"""Per-example, per-head sum tables: the whole state of a metric reducer at one site."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

SiteKey = tuple[str, int]  # (stack, layer)


class SiteTable:
    """Float64 sums of one (stack, layer) site, one row per example and one column per head.

    arrays[name]: [capacity, H, *shapes[name]]; row ``i`` belongs to example ``examples[i]`` and
    column ``j`` to model head ``heads[j]``. Adding is ``index_put_(accumulate=True)``, so the
    same example seen twice (or in two shards) simply sums, in any order.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self._rows: dict[int, int] = {}
        self._cols: dict[int, int] = {}
        self.arrays = {k: torch.zeros(0, 0, *s, dtype=torch.float64) for k, s in self.shapes.items()}

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
        rows = [self._rows.setdefault(int(e), len(self._rows)) for e in example_ids.tolist()]
        cols = [self._cols.setdefault(int(h), len(self._cols)) for h in heads.tolist()]
        self._reserve()
        # the common case (new examples in order, every head in order) is a slice: no scatter
        r0, c0 = rows[0] if rows else 0, cols[0] if cols else 0
        block = rows == list(range(r0, r0 + len(rows))) and cols == list(range(c0, c0 + len(cols)))
        index = None if block else (torch.tensor(rows).view(-1, 1), torch.tensor(cols).view(1, -1))
        for name, value in values.items():
            value = value.detach().to(device="cpu", dtype=torch.float64)
            if index is None:
                self.arrays[name][r0 : r0 + len(rows), c0 : c0 + len(cols)] += value
            else:
                self.arrays[name].index_put_(index, value, accumulate=True)

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
        """Grow the arrays (rows doubling) to hold every known example and head."""
        n, h = len(self._rows), len(self._cols)
        for name, a in self.arrays.items():
            cap, width = a.shape[0], a.shape[1]
            if n <= cap and h == width:
                continue
            new_cap = max(n, 2 * cap, 8) if n > cap else cap
            grown = torch.zeros(new_cap, h, *self.shapes[name], dtype=torch.float64)
            grown[:cap, :width] = a
            self.arrays[name] = grown


class SiteSums:
    """One :class:`SiteTable` per site, with the events of one batch summed on the device before they reach it.

    The attention calls of one forward (every layer, every query chunk) arrive as many small sums for the
    same examples and heads; adding each to a table costs a device-to-host copy and a scatter. Sums for the
    very same ``example_ids`` and ``heads`` tensors (the capture passes one object per batch) are added in
    place to a pending block per site instead, and the block goes into the table once, when another batch
    reaches the site or anyone reads (:meth:`flush`, :meth:`tables`).
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self._tables: dict[SiteKey, SiteTable] = {}
        self._pending: dict[SiteKey, tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = {}

    def add(
        self, site: SiteKey, example_ids: torch.Tensor, heads: torch.Tensor, values: Mapping[str, torch.Tensor]
    ) -> None:
        """Add ``values[name]`` ([B, H, *shape]) for ``example_ids`` ([B]) and ``heads`` ([H]) at ``site``."""
        pending = self._pending.get(site)
        if pending is not None and pending[0] is example_ids and pending[1] is heads:
            for name, value in values.items():
                pending[2][name].add_(value.detach())
            return
        if pending is not None:
            self._commit(site)
        block = {name: value.detach().to(torch.float64, copy=True) for name, value in values.items()}
        self._pending[site] = (example_ids, heads, block)

    def flush(self) -> None:
        """Move every pending block into its table."""
        for site in list(self._pending):
            self._commit(site)

    def tables(self) -> dict[SiteKey, SiteTable]:
        """The per-site tables, pending sums included."""
        self.flush()
        return self._tables

    def table(self, site: SiteKey) -> SiteTable:
        """The table of one site (created empty if new), pending sums included."""
        if site in self._pending:
            self._commit(site)
        if site not in self._tables:
            self._tables[site] = SiteTable(self.shapes)
        return self._tables[site]

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
        self._tables = dict(tables)

    def _commit(self, site: SiteKey) -> None:
        example_ids, heads, block = self._pending.pop(site)
        self.table(site).add(example_ids, heads, block)
