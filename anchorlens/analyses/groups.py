"""Grouped sums over :class:`~anchorlens.analyses.rows.Rows` keys, in the order a sorted pandas group-by gives.

A chunk's derived metrics group hundreds of thousands of rows by (example, stack, layer, head[, role]); on
integer codes with ``bincount`` this takes milliseconds where pandas group-bys and merges over string columns
took most of a chunk's row time. Keys sort as pandas sorts them: numbers ascending, labels by their text, rows
averaged over heads (head <NA>) after the heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from anchorlens.analyses.keys import first_rows, mixed_radix
from anchorlens.analyses.rows import NO_HEAD, Labels, Rows


def label_ranks(labels: Labels) -> np.ndarray:
    """[n] rank of each row's label among the vocabulary sorted by text."""
    order = np.argsort(np.asarray(labels.vocab, dtype=object).astype(str), kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[labels.codes]


def key_ranks(rows: Rows, column: str) -> np.ndarray:
    """[n] order-preserving integer key of one column: example/layer as they are, head with <NA> last, labels by text."""
    if column in ("example", "layer"):
        return np.asarray(getattr(rows, column), dtype=np.int64)
    if column == "head":
        return np.where(rows.head == NO_HEAD, np.iinfo(np.int32).max, rows.head).astype(np.int64)
    return label_ranks(rows.labels[column])


def combined_key(parts: Sequence[np.ndarray]) -> np.ndarray:
    """[n] one int64 per row that orders rows as the lexicographic order of ``parts`` (each [n] int64)."""
    n = len(parts[0]) if parts else 0
    if not n:
        return np.zeros(n, dtype=np.int64)
    ranges = [(int(part.min()), int(part.max())) for part in parts]
    return mixed_radix(((part - low, high - low + 1) for part, (low, high) in zip(parts, ranges, strict=True)), n)


@dataclass(frozen=True)
class Groups:
    """Rows grouped by a key: ``inverse`` [n] group of each row (groups numbered in key order), ``first`` [G] the
    first row of each group."""

    inverse: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, rows: Rows, columns: Sequence[str]) -> Groups:
        """Group ``rows`` by ``columns`` (names of :class:`Rows` columns or labels)."""
        return cls.by(combined_key([key_ranks(rows, c) for c in columns]))

    @classmethod
    def by(cls, key: np.ndarray) -> Groups:
        """Group by one int64 key per row [n]; groups in ascending key order."""
        codes, uniques = pd.factorize(key, sort=True)  # hash, then sort only the distinct keys
        codes = np.asarray(codes, dtype=np.int64)
        return cls(codes, first_rows(codes, len(uniques)))

    def __len__(self) -> int:
        return len(self.first)

    def sum(self, values: np.ndarray) -> np.ndarray:
        """[G] sum of ``values`` [n] per group."""
        return np.bincount(self.inverse, weights=values, minlength=len(self)).astype(np.float64)


def member_of(key: np.ndarray, known: np.ndarray) -> np.ndarray:
    """[n] bool: whether each ``key`` [n] is among ``known`` [m]."""
    return np.isin(key, known)


def lookup(key: np.ndarray, known: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found [n] bool, value [n]) of each ``key`` in the table ``known`` [m] (unique) -> ``values`` [m]."""
    index = pd.Index(known).get_indexer(key)
    found = index >= 0
    return found, np.where(found, np.asarray(values)[np.where(found, index, 0)], np.nan)
