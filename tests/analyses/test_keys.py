"""Mixed-radix row keys: equal exactly for equal rows, ordered lexicographically, exact past int64."""

from __future__ import annotations

import numpy as np
import pytest

from anchorlens.analyses.keys import dense_rank, mixed_radix


def _reference(parts: list[np.ndarray]) -> np.ndarray:
    """Dense lexicographic rank of each row's tuple (the key's meaning, computed with tuples)."""
    rows = list(zip(*(p.tolist() for p in parts), strict=True))
    order = {t: i for i, t in enumerate(sorted(set(rows)))}
    return np.array([order[t] for t in rows])


@pytest.mark.parametrize(
    "sizes",
    [
        [3, 5, 2],  # small: one product
        [1 << 40, 1 << 30, 7],  # the product of the first two overflows int64 without a re-rank
        [1 << 20] * 6,  # many columns: re-ranked more than once
        [1],  # a constant column
    ],
)
def test_keys_rank_rows_as_their_tuples(sizes):
    rng = np.random.default_rng(len(sizes))
    n = 500
    # few distinct values per column (rows repeat), spread over the whole range of each column
    parts = [rng.choice(rng.integers(0, size, 6), n) for size in sizes]
    key = mixed_radix(((p, size) for p, size in zip(parts, sizes, strict=True)), n)
    assert key.dtype == np.int64
    np.testing.assert_array_equal(dense_rank(key), _reference(parts))


def test_no_rows_and_no_columns_give_empty_or_zero_keys():
    assert mixed_radix([], 0).shape == (0,)
    np.testing.assert_array_equal(mixed_radix([], 4), np.zeros(4, dtype=np.int64))
    assert mixed_radix([(np.zeros(0, dtype=np.int64), 0)], 0).shape == (0,)


def test_dense_rank_keeps_order():
    np.testing.assert_array_equal(dense_rank(np.array([40, -3, 40, 7])), [2, 0, 2, 1])


def test_first_rows_are_each_groups_earliest_row():
    from anchorlens.analyses.keys import first_rows

    groups = np.array([2, 0, 2, 1, 0, 1, 2])
    np.testing.assert_array_equal(first_rows(groups, 3), [1, 3, 0])
