"""The tidy frame's head column: per-head indices, and <NA> (never -1) for rows averaged over heads."""

from __future__ import annotations

import pandas as pd
import pytest
from analyses_helpers import random_event

import anchorlens.analyses as A
from anchorlens.analyses.frames import conform, head_column, head_means, per_head
from anchorlens.analyses.registry import make_reducer
from anchorlens.figures._frames import pick_head


def _frame() -> pd.DataFrame:
    reducer = make_reducer("decomposition")
    reducer.update(random_event(9, h=3))
    return reducer.frame()


def test_head_means_are_null_not_minus_one():
    df = _frame()
    assert str(df["head"].dtype) == "Int64"
    vis = df[df["metric"] == "visible_share"]
    assert len(vis) and vis["head"].isna().all()  # visibility does not depend on the head
    dec = df[df["metric"] == "decomposition"]
    assert set(dec["head"].astype(int)) == {0, 1, 2}
    assert not (df["head"].dropna() < 0).any()
    avg = A.average_heads(dec)
    assert avg["head"].isna().all() and len(head_means(avg)) == len(avg) and per_head(avg).empty


def test_parquet_round_trip_keeps_the_null_marker(tmp_path):
    df = A.concat_frames([_frame(), A.average_heads(_frame())])
    path = tmp_path / "metrics.parquet"
    df.to_parquet(path, index=False)
    back = pd.read_parquet(path)
    assert str(back["head"].dtype) == "Int64"
    pd.testing.assert_series_equal(back["head"], df["head"])


def test_old_frames_and_csv_read_the_same():
    old = pd.DataFrame({"head": [0, 2, -1]})
    assert head_column(old["head"]).tolist() == [0, 2, pd.NA]
    csv = pd.Series(["0", "", "2"], dtype=object)  # read_csv(keep_default_na=False) of a null head
    assert head_column(csv).tolist() == [0, pd.NA, 2]
    legacy = _frame().astype({"head": "float64"}).fillna({"head": -1.0}).astype({"head": "int64"})
    assert conform(legacy)["head"].isna().sum() == _frame()["head"].isna().sum()


def test_pick_head_reads_mean_and_negative_indices_like_heads_option():
    df = A.concat_frames([_frame(), A.average_heads(_frame())])
    dec = df[df["metric"] == "decomposition"]
    assert pick_head(dec, "mean")["head"].isna().all()
    assert set(pick_head(dec, -1)["head"]) == {2}  # the last head, as --heads -1
    assert set(pick_head(dec, 0)["head"]) == {0}
    with pytest.raises(ValueError, match="available: 0, 1, 2, mean"):
        pick_head(dec, 7)
