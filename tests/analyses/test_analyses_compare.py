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
    assert list(out.columns[:8]) == ["checkpoint", "baseline", "metric", "stack", "layer", "head",
                                     "query_role", "key_role"]
    am = out[out["metric"] == "anchor_mass"]
    assert len(am) == 4 and (am["n"] == 12).all()
    assert np.allclose(am["diff"], 0.1) and np.allclose(am["ci_lo"], 0.1) and np.allclose(am["ci_hi"], 0.1)
    assert np.allclose(am["p_value"], 2 / 4096)
    assert am["significant"].all()
    ent = out[out["metric"] == "entropy"]
    assert np.allclose(ent["diff"], 0.0) and np.allclose(ent["p_value"], 1.0) and not ent["significant"].any()
    assert (out["q_value"] >= out["p_value"] - 1e-12).all()
    with pytest.raises(KeyError):
        A.compare_frames(frames, "missing")


def test_headline_table():
    frames = {"pt": fake_frame(0.0), "capt": fake_frame(0.1), "other": fake_frame(0.0, seed=3)}
    t = A.headline_table(frames, metrics=("anchor_mass", "entropy", "island_score"), n_boot=200)
    assert list(t["metric"]) == ["anchor_mass"] * 3 + ["entropy"] * 3
    assert list(t["checkpoint"]) == ["pt", "capt", "other"] * 2
    pt = t[(t["metric"] == "anchor_mass") & (t["checkpoint"] == "pt")].iloc[0]
    assert np.isnan(pt["diff"]) and pt["n"] == 12
    assert pt["ci_lo"] <= pt["mean"] <= pt["ci_hi"]
    capt = t[(t["metric"] == "anchor_mass") & (t["checkpoint"] == "capt")].iloc[0]
    assert capt["diff"] == pytest.approx(0.1) and capt["q_value"] < 0.05
    ent = t[t["metric"] == "entropy"]
    assert set(ent["query_role"]) == {"all"}  # the 'all' rows are picked over per-role rows


def test_headline_ambiguous_roles():
    df = fake_frame(0.0)
    df2 = pd.concat([df, df[df["metric"] == "anchor_mass"].assign(key_role="first_token")])
    with pytest.raises(ValueError, match="several role pairs"):
        A.headline_table({"a": df2}, metrics=("anchor_mass",))
    t = A.headline_table({"a": df2}, metrics=("anchor_mass",), roles={"anchor_mass": (None, "capsule")},
                         n_boot=100)
    assert t["key_role"].tolist() == ["capsule"]
