"""Tidy rows as columns: what a reducer builds per site before one frame is made for all its sites.

A chunk of 32 examples on a 30-layer model gives hundreds of thousands of rows from hundreds of (site, metric)
pieces; a pandas frame per piece costs more than the rows themselves. :class:`Rows` keeps numbers as arrays and
labels as codes into small vocabularies, concatenates pieces with numpy, and makes one frame
(:meth:`Rows.frame`) with the tidy columns and dtypes of :mod:`anchorlens.analyses.frames`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import ALL, COLUMNS, NO_ROLE, arrow_schema, empty_frame

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

    @classmethod
    def of_column(cls, column: pd.Series) -> Labels:
        """Codes of a frame's string column [n] (missing labels read as ``""``)."""
        codes, uniques = pd.factorize(column, use_na_sentinel=False)
        vocab = tuple("" if pd.isna(v) else str(v) for v in uniques)
        return cls(np.asarray(codes, dtype=np.int64), vocab)

    def column(self) -> pd.api.extensions.ExtensionArray:
        """The labels as the tidy string column."""
        return pd.array(list(self.vocab), dtype="str").take(self.codes)

    def take(self, index: np.ndarray) -> Labels:
        """The labels of rows ``index`` (ints or a bool mask [n])."""
        return Labels(self.codes[index], self.vocab)

    def isin(self, names: Iterable[str]) -> np.ndarray:
        """[n] bool: whether each row's label is one of ``names``."""
        wanted = set(names)
        hit = np.array([v in wanted for v in self.vocab], dtype=bool)
        return hit[self.codes] if len(self.vocab) else np.zeros(len(self.codes), dtype=bool)

    def present(self) -> list[str]:
        """The distinct labels of the rows, in order of first appearance."""
        _, first = np.unique(self.codes, return_index=True)
        return [self.vocab[self.codes[i]] for i in sorted(first)]

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
        names = list(parts[0].labels)
        if any(list(p.labels) != names for p in parts):
            raise ValueError("rows to concatenate have different label columns")
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return Rows(
            cat("example"),
            cat("layer"),
            cat("head"),
            cat("value"),
            cat("count"),
            {c: Labels.concat([p.labels[c] for p in parts]) for c in names},
        )

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> Rows:
        """The tidy rows of a metric frame (a missing ``count`` reads as NaN; extra columns are left out)."""
        if df.empty:
            return cls.empty()
        head = pd.to_numeric(df["head"]).astype("Int64").to_numpy(dtype=np.int64, na_value=NO_HEAD)
        count = df["count"].to_numpy(dtype=np.float64) if "count" in df.columns else np.full(len(df), np.nan)
        return cls(
            df["example"].to_numpy(dtype=np.int64),
            df["layer"].to_numpy(dtype=np.int64),
            np.where(head < 0, NO_HEAD, head),
            df["value"].to_numpy(dtype=np.float64),
            count,
            {c: Labels.of_column(df[c]) for c in LABEL_COLUMNS},
        )

    def take(self, index: np.ndarray) -> Rows:
        """The rows ``index`` (ints or a bool mask [n]), in that order."""
        return Rows(
            self.example[index],
            self.layer[index],
            self.head[index],
            self.value[index],
            self.count[index],
            {c: labels.take(index) for c, labels in self.labels.items()},
        )

    def where(self, column: str, names: Iterable[str]) -> np.ndarray:
        """[n] bool: rows whose label in ``column`` is one of ``names``."""
        return self.labels[column].isin(names) if column in self.labels else np.zeros(len(self), dtype=bool)

    def arrow(self) -> Any:
        """The rows as an Arrow table with the frame's columns and types, labels dictionary-encoded (their codes
        used as they are: no string is built or hashed)."""
        import pyarrow as pa

        names = list(COLUMNS) + [c for c in self.labels if c not in LABEL_COLUMNS]
        if not len(self):
            return arrow_schema(names).empty_table()
        dictionary = pa.dictionary(pa.int32(), pa.string())
        numbers = {
            "example": pa.array(self.example, pa.int64()),
            "layer": pa.array(self.layer, pa.int64()),
            "head": pa.array(self.head, pa.int64(), mask=self.head < 0),
            "value": pa.array(self.value, pa.float64(), mask=np.isnan(self.value)),  # NaN as null, as from pandas
            "count": pa.array(self.count, pa.float64(), mask=np.isnan(self.count)),
        }
        columns = [
            numbers[c]
            if c in numbers
            else pa.DictionaryArray.from_arrays(
                pa.array(self.labels[c].codes, pa.int32()), pa.array(self.labels[c].vocab, pa.string())
            )
            for c in names
        ]
        fields = [pa.field(c, dictionary if c not in numbers else numbers[c].type) for c in names]
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))

    def frame(self) -> pd.DataFrame:
        """The rows as a tidy frame (columns and dtypes of :data:`~anchorlens.analyses.frames.COLUMNS`; label
        columns beyond the tidy ones, such as ``fixed``, follow them as strings)."""
        extra = [c for c in self.labels if c not in LABEL_COLUMNS]
        if not len(self):
            out = empty_frame()
            for c in extra:
                out[c] = pd.Series(dtype="str")
            return out
        head = pd.arrays.IntegerArray(np.where(self.head < 0, 0, self.head).astype(np.int64), self.head < 0)
        columns = {
            "example": self.example,
            "layer": self.layer,
            "head": head,
            "value": self.value,
            "count": self.count,
            **{c: self.labels[c].column() for c in self.labels},
        }
        return pd.DataFrame({c: columns[c] for c in list(COLUMNS) + extra})


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
    keep: np.ndarray | None = None,
) -> Rows:
    """Tidy rows of one site from dense arrays; cells whose count is 0 are left out (unless ``keep``).

    examples: [N]; heads: [H] model head indices, or None for one column of rows averaged over heads
    (head <NA>); value: [N, H, S, R]; count: [N, H, S]; query_labels: S labels; key_labels: R labels;
    keep: [N, H, S] bool, the cells that give rows (default count > 0): an empty cell (queries exist, none sees a
    key) kept with a NaN value and count 0, for :func:`~anchorlens.analyses.derived.with_fixed` to flag.
    """
    cells = np.asarray(count) > 0 if keep is None else np.asarray(keep, dtype=bool)
    keep = np.broadcast_to(cells[..., None], value.shape)
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
