"""Out-of-core per-example values: every cell's values over examples, spilled to disk in blocks of cells.

A run's metric rows arrive one chunk of examples at a time, example-major; paired tests and bootstrap CIs
need them cell-major (one cell's values over every example, in example order). :class:`CellSpill` does the
transposition on disk: cells (metric, stack, layer, head, roles, ...) are numbered as they first appear
(:class:`CellIndex`, bounded by layers x heads x roles, whatever the number of examples) and each row's
``(cell, example, value)`` is appended to the binary file of its block of cells and side (a checkpoint). A
block holds as many cells as keep a ``[cells, examples]`` float64 matrix under a fixed budget, so reading a
block back costs the same memory at 64 or 100,000 examples. Statistics then run block by block.

Why flat binary files and not a columnar engine (DuckDB, Polars, pyarrow datasets): the access pattern is one
transposition (write example-major, read cell-major) followed by numpy matrix statistics; appending
fixed-width records needs no dependency and no sort, and a block is read with one sequential ``np.fromfile``.
A columnar scan would re-read the whole example-major file once per block. The user-facing per-example file
(``metrics.parquet``) stays parquet, written in row groups as chunks finish.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from anchorlens.analyses.keys import first_rows, mixed_radix

RECORD = np.dtype([("cell", "<i8"), ("example", "<i8"), ("value", "<f8")])
BUDGET = 1 << 18  # cell x example values of one block (2 MiB of float64; the statistics hold a few such matrices)
_READ_RECORDS = 1 << 16  # records read back at a time (1.5 MiB)
_NA_HEAD = -1  # head <NA> (rows averaged over heads) inside cell keys


class CellIndex:
    """Cell keys (tuples over ``columns``) numbered in order of first appearance; ``head`` <NA> is a key value."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self._ids: dict[tuple, int] = {}
        self._keys: list[tuple] = []

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self, frame: pd.DataFrame) -> np.ndarray:
        """Cell id [rows] int64 of every row of ``frame`` (new cells are numbered).

        Rows are grouped by a mixed-radix code of the columns' factorized values (no MultiIndex, no sort); only
        one row per distinct cell is turned into a key tuple.
        """
        if frame.empty:
            return np.empty(0, dtype=np.int64)
        columns = []
        for c in self.columns:
            col = frame[c]
            if c == "head":
                col = pd.Series(pd.array(col, dtype="Int64").fillna(_NA_HEAD), index=col.index)
            codes, uniques = pd.factorize(col, use_na_sentinel=False)
            columns.append((np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)))
        code = mixed_radix(((codes, len(uniques)) for codes, uniques in columns), len(frame))
        inverse, distinct = pd.factorize(code)
        first = first_rows(inverse, len(distinct))  # a row of each distinct cell
        lookup = np.empty(len(distinct), dtype=np.int64)
        keys = zip(*(uniques[codes[first]] for codes, uniques in columns))
        for i, key in enumerate(keys):
            key = tuple(v.item() if isinstance(v, np.generic) else v for v in key)
            found = self._ids.get(key)
            if found is None:
                found = self._ids[key] = len(self._keys)
                self._keys.append(key)
            lookup[i] = found
        return lookup[inverse]

    def frame(self, ids: Sequence[int] | np.ndarray | None = None) -> pd.DataFrame:
        """The key columns of cells ``ids`` (default: every cell), ``head`` as nullable Int64."""
        keys = self._keys if ids is None else [self._keys[int(i)] for i in ids]
        out = pd.DataFrame(keys, columns=self.columns) if keys else pd.DataFrame(columns=self.columns)
        if "head" in out.columns:
            out["head"] = pd.array([None if int(h) == _NA_HEAD else int(h) for h in out["head"]], dtype="Int64")
        if "layer" in out.columns:
            out["layer"] = out["layer"].astype(np.int64)
        return out


class CellSpill:
    """Per-example values of many cells and sides, on disk under ``folder`` in blocks of cells.

    ``n_examples``: example ids run over ``range(n_examples)`` (their position in every matrix);
    ``budget``: cell x example values per block (memory of one block matrix).
    """

    def __init__(self, folder: str | Path, columns: Sequence[str], n_examples: int, budget: int = BUDGET) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cells = CellIndex(columns)
        self.n_examples = int(n_examples)
        self.block = max(1, int(budget) // max(self.n_examples, 1))
        self.sides: list[str] = []

    def _path(self, side: str, block: int) -> Path:
        return self.folder / f"s{self.sides.index(side):03d}-b{block:06d}.bin"

    @property
    def n_blocks(self) -> int:
        """Number of cell blocks so far."""
        return -(-len(self.cells) // self.block)

    def add(self, side: str, frame: pd.DataFrame, value: str = "value") -> None:
        """Append the rows of ``frame`` (key columns, ``example``, ``value``) to ``side``'s blocks."""
        if side not in self.sides:
            self.sides.append(side)
        if frame.empty:
            return
        examples = frame["example"].to_numpy(dtype=np.int64)
        if examples.min() < 0 or examples.max() >= self.n_examples:
            raise ValueError(f"example ids must lie in [0, {self.n_examples}); got {examples.min()}..{examples.max()}")
        records = np.empty(len(frame), dtype=RECORD)
        records["cell"] = self.cells.ids(frame)
        records["example"] = examples
        records["value"] = frame[value].to_numpy(dtype=np.float64)
        blocks = records["cell"] // self.block
        order = np.argsort(blocks, kind="stable")
        records, blocks = records[order], blocks[order]
        bounds = np.flatnonzero(np.diff(blocks)) + 1
        for part in np.split(records, bounds):
            path = self._path(side, int(part["cell"][0] // self.block))
            try:
                with open(path, "ab") as f:
                    f.write(part.tobytes())  # (numpy's tofile loses the errno of a full disk)
            except OSError as err:
                raise OSError(err.errno, err.strerror or str(err), str(path)) from None

    def read(self, side: str, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(cell ids [c], values [c, n_examples] float64, NaN where a cell has no row for an example) of one block."""
        first = block * self.block
        ids = np.arange(first, min(first + self.block, len(self.cells)))
        values = np.full((len(ids), self.n_examples), np.nan)
        path = self._path(side, block) if side in self.sides else None
        if path is not None and path.exists():
            with open(path, "rb") as f:  # in slices: the 24-byte records of a whole block never sit in memory at once
                while len(records := np.fromfile(f, dtype=RECORD, count=_READ_RECORDS)):
                    values[records["cell"] - first, records["example"]] = records["value"]
        return ids, values

    def blocks(self, side: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every block of ``side`` in cell order (see :meth:`read`)."""
        for b in range(self.n_blocks):
            yield self.read(side, b)

    def long_rows(self, side: str, ids: np.ndarray, values: np.ndarray) -> pd.DataFrame:
        """A block back as tidy rows (key columns, example, value), finite values only, example order per cell."""
        cell, example = np.nonzero(np.isfinite(values))
        out = self.cells.frame(ids[cell]) if len(cell) else self.cells.frame([])
        out["example"] = example.astype(np.int64)
        out["value"] = values[cell, example]
        return out


class CellMeans:
    """Mean over examples of every cell's finite values (and of its ``count``), bounded by the number of cells."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.cells = CellIndex(columns)
        self._sum = np.zeros(0)
        self._count_sum = np.zeros(0)
        self._n = np.zeros(0)
        self._rows = np.zeros(0)

    def add(self, frame: pd.DataFrame) -> None:
        """Fold the rows of ``frame`` (key columns, ``value``, ``count``) into the sums."""
        if frame.empty:
            return
        ids = self.cells.ids(frame)
        size = len(self.cells)
        if size > len(self._sum):
            grow = size - len(self._sum)
            self._sum, self._count_sum, self._n, self._rows = (
                np.concatenate([a, np.zeros(grow)]) for a in (self._sum, self._count_sum, self._n, self._rows)
            )
        v = frame["value"].to_numpy(dtype=np.float64)
        ok = np.isfinite(v)
        self._sum += np.bincount(ids, weights=np.where(ok, v, 0.0), minlength=size)
        self._n += np.bincount(ids, weights=ok.astype(np.float64), minlength=size)
        self._rows += np.bincount(ids, minlength=size)
        if "count" in frame.columns:
            c = frame["count"].to_numpy(dtype=np.float64)
            self._count_sum += np.bincount(ids, weights=np.where(np.isfinite(c), c, 0.0), minlength=size)

    def frame(self) -> pd.DataFrame:
        """One row per cell: its key columns, ``value`` (mean of the finite values, NaN when none), ``count``
        (mean count) and ``n`` (rows seen)."""
        out = self.cells.frame()
        with np.errstate(invalid="ignore", divide="ignore"):
            out["value"] = np.where(self._n > 0, self._sum / np.maximum(self._n, 1), np.nan)
            out["count"] = np.where(self._rows > 0, self._count_sum / np.maximum(self._rows, 1), np.nan)
        out["n"] = self._rows.astype(np.int64)
        return out
