"""Bootstrap, sign-flip test, Benjamini-Hochberg, grouped summaries."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import anchorlens.analyses as A


def test_bh_hand_computed():
    p = [0.01, 0.04, 0.03, 0.005, np.nan, 0.5]
    rejected, adjusted = A.benjamini_hochberg(p, alpha=0.05)
    np.testing.assert_allclose(adjusted, [0.025, 0.05, 0.05, 0.025, np.nan, 0.5])
    assert rejected.tolist() == [True, True, True, True, False, False]
    rejected, _ = A.benjamini_hochberg(p, alpha=0.03)
    assert rejected.tolist() == [True, False, False, True, False, False]
    r, a = A.benjamini_hochberg([])
    assert r.size == 0 and a.size == 0


def test_bootstrap_contains_mean_and_is_seeded():
    v = np.random.default_rng(1).normal(0.3, 0.1, size=200)
    mean, lo, hi = A.bootstrap_ci(v)
    assert mean == pytest.approx(v.mean())
    assert lo < mean < hi and hi - lo < 0.1
    assert A.bootstrap_ci(v) == (mean, lo, hi)
    assert A.bootstrap_ci(v, seed=1) != (mean, lo, hi)
    m90 = A.bootstrap_ci(v, ci=0.9)
    assert m90[1] >= lo and m90[2] <= hi


def test_bootstrap_degenerate():
    assert A.bootstrap_ci([0.1] * 7) == (0.1, 0.1, 0.1)
    assert A.bootstrap_ci([0.4]) == (0.4, 0.4, 0.4)
    assert all(np.isnan(A.bootstrap_ci([])))
    assert A.bootstrap_ci([0.2, np.nan, 0.2]) == (0.2, 0.2, 0.2)


def test_sign_flip():
    assert A.sign_flip_test([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)  # exact: only all+ and all-
    assert A.sign_flip_test([0.0, 0.0]) == 1.0
    rng = np.random.default_rng(0)
    assert A.sign_flip_test(rng.normal(1.0, 0.1, 40), n_perm=2000) == pytest.approx(1 / 2001)
    assert A.sign_flip_test(rng.normal(0.0, 1.0, 40), n_perm=2000) > 0.01
    assert np.isnan(A.sign_flip_test([]))


def test_summarize_matches_bootstrap_ci():
    rng = np.random.default_rng(2)
    df = pd.DataFrame({"g": np.repeat(["a", "b", "c"], [30, 30, 5]), "value": rng.random(65)})
    df.loc[3, "value"] = np.nan
    s = A.summarize(df, by="g", n_boot=500).set_index("g")
    assert s.loc["a", "n"] == 29 and s.loc["c", "n"] == 5
    for g in "abc":
        vals = df[df["g"] == g]["value"].dropna()
        mean, lo, hi = A.bootstrap_ci(vals, n_boot=500)
        assert (s.loc[g, "mean"], s.loc[g, "ci_lo"], s.loc[g, "ci_hi"]) == pytest.approx((mean, lo, hi))
    assert list(A.summarize(df, by=[])[["n"]].iloc[0]) == [64]


def test_paired_differences_and_summary():
    a = pd.DataFrame({"example": range(10), "metric": "m", "value": np.arange(10) / 10})
    b = a.assign(value=a["value"] + 0.05).iloc[2:]
    d = A.paired_differences(a, b, on=["example", "metric"])
    assert len(d) == 8 and np.allclose(d["diff"], -0.05)
    s = A.paired_summary(d, "metric")
    row = s.iloc[0]
    assert row["n"] == 8 and row["diff"] == pytest.approx(-0.05)
    assert row["ci_lo"] == pytest.approx(-0.05) and row["ci_hi"] == pytest.approx(-0.05)
    assert row["p_value"] == pytest.approx(2 / 256)
    assert row["mean_a"] == pytest.approx(a["value"].iloc[2:].mean())
    with pytest.raises(ValueError):
        A.paired_differences(pd.concat([a, a]), b, on=["example", "metric"])
