"""One int64 key per row from several integer columns: how rows are grouped without pandas group-bys.

Each column is given as codes in ``0 .. size-1``; the key is their mixed-radix number, which orders rows as the
lexicographic order of the columns. Before a product could overflow int64 the key so far is re-ranked densely
(its order kept), so any number of columns of any size gives exact keys.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

_LIMIT = 1 << 62  # keys stay below this (int64)


def dense_rank(key: np.ndarray) -> np.ndarray:
    """[n] the rank of each key among the distinct keys (order kept, range at most n)."""
    codes, _ = pd.factorize(key, sort=True)
    return np.asarray(codes, dtype=np.int64)


def mixed_radix(parts: Iterable[tuple[np.ndarray, int]], n: int) -> np.ndarray:
    """[n] int64 key of rows from ``parts``, each (codes [n] in ``0 .. size-1``, size): equal keys for rows equal in
    every part, ordered as the parts' lexicographic order."""
    code = np.zeros(n, dtype=np.int64)
    for codes, size in parts:
        size = max(int(size), 1)
        if size > _LIMIT:
            codes, size = dense_rank(codes), n
        if n and int(code.max()) + 1 > _LIMIT // size:  # re-rank before the product could overflow
            code = dense_rank(code)
        code = code * size + np.asarray(codes, dtype=np.int64)
    return code


def first_rows(groups: np.ndarray, n_groups: int) -> np.ndarray:
    """[G] int64: the first row of each group, from each row's group number [n] (every group 0..G-1 present)."""
    first = np.empty(n_groups, dtype=np.int64)
    first[groups[::-1]] = np.arange(len(groups) - 1, -1, -1, dtype=np.int64)  # the last write is a group's first row
    return first
