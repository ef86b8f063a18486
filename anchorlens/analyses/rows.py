"""Tidy rows as columns: what a reducer builds per site before one frame is made for all its sites.

A chunk of 32 examples on a 30-layer model gives hundreds of thousands of rows from hundreds of (site, metric)
pieces; a pandas frame per piece costs more than the rows themselves. :class:`Rows` keeps numbers as arrays and
labels as codes into small vocabularies, concatenates pieces with numpy, and makes one frame
(:meth:`Rows.frame`) with the tidy columns and dtypes of :mod:`anchorlens.analyses.frames`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import ALL, COLUMNS, NO_ROLE, empty_frame

LABEL_COLUMNS: tuple[str, ...] = ("stack", "metric", "query_role", "key_role")
NO_HEAD = -1  # head code of rows averaged over heads (<NA> in the frame)


@dataclass(frozen=True)
class Labels:
    """One string column as ``codes`` [n] (int) into ``vocab``."""

    codes: np.ndarray
    vocab: tuple[str, ...]

    @classmethod
    def constant(cls, label: str, n: int) -> Labels:
        """``label`` on every one of ``n`` rows."""
        return cls(np.zeros(n, dtype=np.int64), (str(label),))

    @classmethod
    def of(cls, labels: np.ndarray) -> Labels:
        """Codes of an array of labels [n] (any strings)."""
        vocab, codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
        return cls(codes.reshape(-1).astype(np.int64), tuple(str(v) for v in vocab))

    def column(self) -> pd.api.extensions.ExtensionArray:
        """The labels as the tidy string column."""
        return pd.array(list(self.vocab), dtype="str").take(self.codes)

    @staticmethod
    def concat(parts: Sequence[Labels]) -> Labels:
        """One column of the parts' rows, in order, over the union of their vocabularies."""
        index: dict[str, int] = {}
        codes = []
        for part in parts:
            mapping = np.array([index.setdefault(v, len(index)) for v in part.vocab], dtype=np.int64)
            codes.append(mapping[part.codes] if len(part.codes) else part.codes)
        return Labels(np.concatenate(codes), tuple(index))


@dataclass(frozen=True)
class Rows:
    """Tidy rows as columns: example, layer, head (``NO_HEAD`` for head means), value, count [n]; labels."""

    example: np.ndarray
    layer: np.ndarray
    head: np.ndarray
    value: np.ndarray
    count: np.ndarray
    labels: dict[str, Labels]

    def __len__(self) -> int:
        return len(self.value)

    @classmethod
    def empty(cls) -> Rows:
        """No rows."""
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, none.astype(np.float64), none.astype(np.float64), {})

    @staticmethod
    def concat(parts: Iterable[Rows]) -> Rows:
        """The parts' rows, in order (empty parts dropped)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return Rows.empty()
        if len(parts) == 1:
            return parts[0]
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return Rows(
            cat("example"),
            cat("layer"),
            cat("head"),
            cat("value"),
            cat("count"),
            {c: Labels.concat([p.labels[c] for p in parts]) for c in LABEL_COLUMNS},
        )

    def frame(self) -> pd.DataFrame:
        """The rows as a tidy frame (columns and dtypes of :data:`~anchorlens.analyses.frames.COLUMNS`)."""
        if not len(self):
            return empty_frame()
        head = pd.arrays.IntegerArray(np.where(self.head < 0, 0, self.head).astype(np.int64), self.head < 0)
        columns = {
            "example": self.example,
            "layer": self.layer,
            "head": head,
            "value": self.value,
            "count": self.count,
            **{c: self.labels[c].column() for c in LABEL_COLUMNS},
        }
        return pd.DataFrame({c: columns[c] for c in COLUMNS})


def _site(
    layer: int, examples: np.ndarray, n: np.ndarray, heads: np.ndarray | None, h: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """example, layer and head columns of the rows at (n, h)."""
    example = np.asarray(examples, dtype=np.int64)[n]
    head = np.full(n.size, NO_HEAD, dtype=np.int64) if heads is None else np.asarray(heads, dtype=np.int64)[h]
    return example, np.full(n.size, int(layer), dtype=np.int64), head


def long_rows(
    stack: str,
    layer: int,
    examples: np.ndarray,
    heads: np.ndarray | None,
    metric: str,
    value: np.ndarray,
    count: np.ndarray,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
) -> Rows:
    """Tidy rows of one site from dense arrays; cells whose count is 0 are left out.

    examples: [N]; heads: [H] model head indices, or None for one column of rows averaged over heads
    (head <NA>); value: [N, H, S, R]; count: [N, H, S]; query_labels: S labels; key_labels: R labels.
    """
    keep = np.broadcast_to((np.asarray(count) > 0)[..., None], value.shape)
    n, h, s, r = np.nonzero(keep)
    if n.size == 0:
        return Rows.empty()
    example, layers, head = _site(layer, examples, n, heads, h)
    return Rows(
        example,
        layers,
        head,
        np.asarray(value, dtype=np.float64)[n, h, s, r],
        np.asarray(count, dtype=np.float64)[n, h, s],
        {
            "stack": Labels.constant(stack, n.size),
            "metric": Labels.constant(metric, n.size),
            "query_role": Labels(s, tuple(query_labels)),
            "key_role": Labels(r, tuple(key_labels)),
        },
    )


def cell_rows(
    stack: str,
    layer: int,
    examples: np.ndarray,
    heads: np.ndarray | None,
    metric: str,
    value: np.ndarray,
    count: np.ndarray,
    keep: np.ndarray,
    query_role: str | np.ndarray = ALL,
    key_role: str | np.ndarray = NO_ROLE,
) -> Rows:
    """Tidy rows of one metric of one site from [N, H] arrays, for metrics whose roles differ from cell to cell.

    examples: [N]; heads: [H] model head indices, or None for one column of rows over all heads (head <NA>);
    value, count, keep (bool: which cells give a row): [N, H]; query_role / key_role: one label, or [N, H] labels.
    """
    n, h = np.nonzero(keep)
    if n.size == 0:
        return Rows.empty()

    def labels(role: str | np.ndarray) -> Labels:
        return Labels.constant(role, n.size) if isinstance(role, str) else Labels.of(np.asarray(role)[n, h])

    example, layers, head = _site(layer, examples, n, heads, h)
    return Rows(
        example,
        layers,
        head,
        np.asarray(value, dtype=np.float64)[n, h],
        np.asarray(count, dtype=np.float64)[n, h],
        {
            "stack": Labels.constant(stack, n.size),
            "metric": Labels.constant(metric, n.size),
            "query_role": labels(query_role),
            "key_role": labels(key_role),
        },
    )
