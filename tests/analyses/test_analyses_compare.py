"""Checkpoint comparison tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import anchorlens.analyses as A


def fake_frame(shift: float, seed: int = 0, n: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for ex in range(n):
        for layer in range(2):
            for head in range(2):
                base = rng.random()
                rows.append((ex, "decoder", layer, head, "anchor_mass", "input", "capsule", base + shift, 3.0))
                rows.append((ex, "decoder", layer, head, "entropy", "all", "", base, 5.0))
                rows.append((ex, "decoder", layer, head, "entropy", "content", "", base, 2.0))
    return pd.DataFrame(rows, columns=list(A.COLUMNS))


def test_compare_frames():
    frames = {"pt": fake_frame(0.0), "capt": fake_frame(0.1)}
    out = A.compare_frames(frames, "pt", n_boot=200)
    assert list(out.columns[:8]) == [
        "checkpoint",
        "baseline",
        "metric",
        "stack",
        "layer",
        "head",
        "query_role",
        "key_role",
    ]
    am = out[out["metric"] == "anchor_mass"]
    assert len(am) == 4 and (am["n"] == 12).all()
    assert np.allclose(am["diff"], 0.1) and np.allclose(am["ci_lo"], 0.1) and np.allclose(am["ci_hi"], 0.1)
    assert np.allclose(am["p_value"], 2 / 4096)
    assert am["significant"].all()
    ent = out[out["metric"] == "entropy"]
    # every example's Δ is 0: rounding, not a test (no p or q; before: p = 1)
    assert np.allclose(ent["diff"], 0.0) and ent["p_value"].isna().all() and not ent["significant"].any()
    assert ent["within_tolerance"].all() and (ent["max_abs_diff"] == 0).all() and not am["within_tolerance"].any()
    tested = out["p_value"].notna()
    assert (out["q_value"][tested] >= out["p_value"][tested] - 1e-12).all() and out["q_value"][~tested].isna().all()
    with pytest.raises(KeyError):
        A.compare_frames(frames, "missing")


HM_MASS = A.HeadlineMetric("mass", "anchor_mass", "input", "capsule", "input → capsule", "")
HM_ENT = A.HeadlineMetric("entropy", "entropy", "all", "", "entropy", "")
HM_ISLAND = A.HeadlineMetric("island", "island_score", "guidance", "guidance", "island", "")


def test_compare_frames_equals_join_and_groupby_path():
    rng = np.random.default_rng(5)
    a, b = fake_frame(0.0, seed=1, n=9), fake_frame(0.2, seed=2, n=9)
    a.loc[rng.choice(len(a), 7, replace=False), "value"] = np.nan  # unmeasured cells
    b = b.drop(index=rng.choice(len(b), 11, replace=False))  # missing rows
    new = A.compare_frames({"base": a, "ckpt": b}, "base", n_boot=300, n_perm=500)
    cell = ["metric", "stack", "layer", "head", "query_role", "key_role"]
    d = A.paired_differences(b, a, on=["example", *cell])
    old = A.paired_summary(d, cell, n_boot=300, n_perm=500)
    merged = new.merge(old, on=cell, suffixes=("", "_old"))
    assert len(merged) == len(old) == len(new)
    for col in ("n", "diff", "ci_lo", "ci_hi", "p_value"):
        np.testing.assert_allclose(
            merged[col].astype(float), merged[col + "_old"].astype(float), rtol=1e-12, atol=1e-12
        )
    np.testing.assert_allclose(merged["mean_checkpoint"], merged["mean_a"], rtol=1e-12)
    with pytest.raises(ValueError, match="several rows"):
        A.compare_frames({"base": pd.concat([a, a]), "ckpt": b}, "base", n_boot=10)


def test_headline_table():
    frames = {"pt": fake_frame(0.0), "capt": fake_frame(0.1), "other": fake_frame(0.0, seed=3)}
    t = A.headline_table(frames, metrics=(HM_MASS, HM_ENT, HM_ISLAND), n_boot=200)
    assert list(t["name"]) == ["mass"] * 3 + ["entropy"] * 3  # no island rows: no guidance queries
    assert list(t["checkpoint"]) == ["pt", "capt", "other"] * 2
    pt = t[(t["name"] == "mass") & (t["checkpoint"] == "pt")].iloc[0]
    assert np.isnan(pt["diff"]) and pt["n"] == 12
    assert pt["ci_lo"] <= pt["mean"] <= pt["ci_hi"]
    capt = t[(t["name"] == "mass") & (t["checkpoint"] == "capt")].iloc[0]
    assert capt["diff"] == pytest.approx(0.1) and capt["q_value"] < 0.05
    ent = t[t["name"] == "entropy"]
    assert set(ent["query_role"]) == {"all"} and (t["fixed"] == "").all()


def test_headline_reports_mask_fixed_metric_as_fixed_not_as_a_value():
    df = fake_frame(0.0)
    island = df[df["metric"] == "anchor_mass"].assign(
        metric="island_score",
        query_role="guidance",
        key_role="guidance",
        value=np.nan,
        fixed="fixed by the causal mask: guidance queries see only guidance keys",
    )
    df = pd.concat([df.assign(fixed=""), island], ignore_index=True)
    t = A.headline_table({"a": df, "b": df}, metrics=(HM_MASS, HM_ISLAND), n_boot=50)
    row = t[t["name"] == "island"]
    assert len(row) == 2 and row["mean"].isna().all() and row["fixed"].str.contains("causal mask").all()


def test_average_heads_equals_groupby_mean_skipping_nan():
    df = pd.concat([fake_frame(0.0, seed=4, n=5), fake_frame(0.0, seed=4, n=5).assign(head=pd.NA)])
    df.loc[df.index[::5], "value"] = np.nan
    df["checkpoint"] = "x"
    new = A.average_heads(df)
    pos = df[df["head"].notna()]
    keys = [c for c in df.columns if c not in ("head", "value", "count")]
    old = (
        pos.groupby(keys, sort=False, dropna=False).agg(value=("value", "mean"), count=("count", "mean")).reset_index()
    )
    m = new.merge(old, on=keys, suffixes=("", "_old"))
    assert len(m) == len(old) == len(new) and new["head"].isna().all()
    np.testing.assert_allclose(m["value"], m["value_old"], rtol=1e-12)
    np.testing.assert_allclose(m["count"], m["count_old"])
