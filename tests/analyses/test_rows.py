"""Rows: tidy rows as columns, made into one frame; checked against frames built cell by cell with pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses.frames import COLUMNS, conform, empty_frame
from anchorlens.analyses.rows import Labels, Rows, cell_rows, long_rows


def _reference_long(stack, layer, examples, heads, metric, value, count, q_labels, k_labels) -> pd.DataFrame:
    """The rows of long_rows, one python loop over cells (count > 0)."""
    rows = []
    n, h, s, r = value.shape
    for i in range(n):
        for j in range(h):
            for a in range(s):
                if count[i, j, a] <= 0:
                    continue
                for b in range(r):
                    head = None if heads is None else int(heads[j])
                    rows.append(
                        (
                            int(examples[i]),
                            stack,
                            layer,
                            head,
                            metric,
                            q_labels[a],
                            k_labels[b],
                            value[i, j, a, b],
                            count[i, j, a],
                        )
                    )
    return conform(pd.DataFrame(rows, columns=list(COLUMNS)))


@pytest.mark.parametrize("heads", [np.array([0, 2, 5]), None])
def test_long_rows_frame_equals_the_cell_by_cell_reference(heads):
    rng = np.random.default_rng(0)
    h = 3 if heads is not None else 1
    value = rng.random((4, h, 3, 2))
    count = rng.integers(0, 3, (4, h, 3)).astype(float)
    args = ("decoder", 7, np.array([10, 11, 12, 13]), heads, "role_flow", value, count, ("a", "b", "all"), ("x", "y"))
    got = long_rows(*args).frame()
    pd.testing.assert_frame_equal(got, _reference_long(*args))
    assert got["head"].isna().all() == (heads is None)


def test_concat_merges_vocabularies_and_keeps_order():
    one = long_rows(
        "decoder", 0, np.array([1]), np.array([0]), "m1", np.ones((1, 1, 1, 2)), np.ones((1, 1, 1)), ("q",), ("x", "y")
    )
    two = long_rows(
        "encoder", 3, np.array([2]), None, "m2", np.full((1, 1, 2, 1), 2.0), np.ones((1, 1, 2)), ("p", "q"), ("z",)
    )
    got = Rows.concat([one, Rows.empty(), two]).frame()
    want = pd.concat([one.frame(), two.frame()], ignore_index=True)
    pd.testing.assert_frame_equal(got, conform(want))
    assert got["key_role"].tolist() == ["x", "y", "z", "z"]
    assert got["stack"].tolist() == ["decoder", "decoder", "encoder", "encoder"]
    assert got["query_role"].tolist() == ["q", "q", "p", "q"]


def test_cell_rows_with_per_cell_labels():
    keep = np.array([[True, False], [True, True]])
    roles = np.array([["sink", "content"], ["", "structural"]], dtype=object)
    got = cell_rows(
        "decoder",
        2,
        np.array([5, 6]),
        np.array([1, 4]),
        "alpha",
        np.arange(4.0).reshape(2, 2),
        np.ones((2, 2)),
        keep,
        "all",
        roles,
    ).frame()
    assert got["key_role"].tolist() == ["sink", "", "structural"]
    assert got["head"].tolist() == [1, 1, 4]
    assert got["example"].tolist() == [5, 6, 6]
    assert got["value"].tolist() == [0.0, 2.0, 3.0]


def test_empty_rows_give_the_empty_tidy_frame():
    none = long_rows("decoder", 0, np.array([1]), None, "m", np.ones((1, 1, 1, 1)), np.zeros((1, 1, 1)), ("q",), ("k",))
    assert len(none) == 0
    pd.testing.assert_frame_equal(Rows.concat([none]).frame(), empty_frame())


def test_labels_of_codes_the_labels():
    labels = Labels.of(np.array(["b", "a", "b"], dtype=object))
    assert [labels.vocab[c] for c in labels.codes] == ["b", "a", "b"]
