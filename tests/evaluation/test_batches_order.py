"""length_sorted_batches: every example once, each window longest first, in order without a window."""

from __future__ import annotations

import pytest

from anchorlens.evaluation.batches import length_sorted_batches


def test_windows_sort_longest_first_and_cover_every_example_once():
    lengths = [3, 9, 1, 7, 5, 2, 8]
    got = length_sorted_batches(lengths, batch_size=2, window=4)
    assert got == [[1, 3], [0, 2], [6, 4], [5]]  # window 0-3 by length 9,7,3,1; window 4-6 by 8,5,2
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))


def test_no_window_keeps_the_order():
    assert length_sorted_batches([5, 1, 9], batch_size=2, window=None) == [[0, 1], [2]]
    assert length_sorted_batches([], batch_size=2, window=3) == []


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        length_sorted_batches([1], batch_size=0, window=None)
