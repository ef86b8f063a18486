"""Out-of-core cell spills: block by block statistics equal the in-memory functions exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_analyses_compare import HM_ENT, HM_MASS, fake_frame

import anchorlens.analyses as A
from anchorlens.analyses.compare import HeadlineRows, _per_example, compare_spill, headline_from_rows, paired_cell
from anchorlens.analyses.spill import CellMeans, CellSpill


def _ragged(shift: float, seed: int, n: int = 11) -> pd.DataFrame:
    """fake_frame with unmeasured values, missing rows and head-averaged rows (head <NA>)."""
    rng = np.random.default_rng(seed)
    df = fake_frame(shift, seed=seed, n=n)
    df.loc[rng.choice(len(df), 9, replace=False), "value"] = np.nan
    df = df.drop(index=rng.choice(len(df), 13, replace=False))
    df = A.concat_frames([df, A.average_heads(df)])
    return df.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # rows in no particular order


def _chunks(df: pd.DataFrame, size: int):
    for start in range(0, int(df["example"].max()) + 1, size):
        yield df[(df["example"] >= start) & (df["example"] < start + size)]


@pytest.mark.parametrize("budget", [1, 7, 1 << 20])  # one cell per block, a few, every cell in one block
def test_compare_spill_equals_compare_frames(tmp_path, budget):
    frames = {"base": _ragged(0.0, 1), "a": _ragged(0.1, 2), "b": _ragged(-0.05, 3)}
    old = A.compare_frames(frames, "base", n_boot=300, n_perm=500, family=["checkpoint", "metric"])
    spill = CellSpill(tmp_path, paired_cell(A.COLUMNS), n_examples=11, budget=budget)
    for name, df in frames.items():
        for chunk in _chunks(df, 4):  # chunks of examples, as a run streams them
            spill.add(name, chunk)
    assert spill.n_blocks == -(-len(spill.cells) // max(1, budget // 11))
    new = compare_spill(spill, "base", n_boot=300, n_perm=500, family=["checkpoint", "metric"])
    # equal up to BLAS rounding: the bootstrap matmul of a block of fewer cells may round its last bit differently
    pd.testing.assert_frame_equal(new, old, check_exact=False, rtol=1e-12, atol=1e-15)


def test_spill_keeps_memory_to_one_block(tmp_path):
    spill = CellSpill(tmp_path, paired_cell(A.COLUMNS), n_examples=1000, budget=4000)
    assert spill.block == 4  # cells per block: 4 x 1000 values read at a time
    spill.add("x", fake_frame(0.0, n=3))
    ids, values = spill.read("x", 0)
    assert values.shape == (4, 1000) and np.isfinite(values[:, :3]).all() and np.isnan(values[:, 3:]).all()
    with pytest.raises(ValueError, match="example ids"):
        spill.add("x", fake_frame(0.0, n=1).assign(example=1000))


def test_a_block_read_in_slices_equals_one_read_whole(tmp_path, monkeypatch):
    import anchorlens.analyses.spill as spill_module

    spill = CellSpill(tmp_path, paired_cell(A.COLUMNS), n_examples=11, budget=1 << 20)
    for chunk in _chunks(_ragged(0.0, 6), 4):
        spill.add("x", chunk)
    ids, whole = spill.read("x", 0)
    monkeypatch.setattr(spill_module, "_READ_RECORDS", 7)  # many slices, the last one partial
    ids_sliced, sliced = spill.read("x", 0)
    assert (ids == ids_sliced).all() and np.isfinite(whole).sum() > 100
    np.testing.assert_array_equal(sliced, whole)


@pytest.mark.parametrize("merge", [2, 64])  # parts merged into one frame as they come, or kept apart
def test_headline_rows_by_chunk_equal_the_whole_frame(merge, monkeypatch):
    import anchorlens.analyses.compare as compare_module

    monkeypatch.setattr(compare_module, "_MERGE_PARTS", merge)
    metrics = [HM_MASS, HM_ENT]
    frames = {"base": _ragged(0.0, 4), "ckpt": _ragged(0.2, 5)}
    old = A.headline_table(frames, metrics, n_boot=200, n_perm=300)
    rows = HeadlineRows(metrics)
    for name, df in frames.items():
        for chunk in _chunks(df, 3):
            rows.add(name, chunk)
    per, fixed = rows.result()
    whole = _per_example(frames, metrics)
    pd.testing.assert_frame_equal(per, whole[0], check_exact=True)
    new = headline_from_rows(per, fixed, list(frames), metrics, n_boot=200, n_perm=300)
    pd.testing.assert_frame_equal(new, old, check_exact=True)


def test_a_metric_is_fixed_only_when_every_chunk_fixes_it():
    df = fake_frame(0.0, n=4).assign(fixed="")
    mass = df["metric"] == "anchor_mass"
    df.loc[mass, "value"], df.loc[mass, "fixed"] = np.nan, "fixed by the causal mask"
    rows = HeadlineRows([HM_MASS])
    rows.add("c", df[df.example < 2])
    rows.add("c", df[df.example >= 2])
    assert rows.result()[1] == {("mass", "c"): ("fixed by the causal mask", ["decoder"])}
    measured = fake_frame(0.0, n=4).assign(fixed="")
    rows.add("c", measured[measured.example == 3])  # one example measures it: not fixed
    per, fixed = rows.result()
    assert fixed == {} and set(per["example"]) == {3}


def test_cell_means_equal_groupby_means():
    df = _ragged(0.0, 6)
    means = CellMeans(paired_cell(A.COLUMNS))
    for chunk in _chunks(df, 5):
        means.add(chunk)
    got = means.frame().set_index(["metric", "layer", "head", "query_role"])["value"].sort_index()
    want = df.groupby(["metric", "layer", "head", "query_role"], dropna=False)["value"].mean().sort_index()
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-12)
