"""Differences that are rounding are not findings: the tolerance table, its rule in paired tests and BH, and score
intervals for accuracy, each checked against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import anchorlens.analyses as A
from anchorlens.analyses.stats import (
    benjamini_hochberg,
    newcombe_paired_interval,
    paired_summary,
    sign_flip_test,
    wilson_interval,
)
from anchorlens.analyses.tolerance import CERTIFICATE, TOLERANCES, dtype_name, kind_of, tolerance
from anchorlens.capture.certificate import THRESHOLDS

Z95 = 1.959963984540054  # the 0.975 standard normal quantile


def test_tolerances_follow_the_certificates_thresholds():
    assert {dtype_name(d): t for d, t in THRESHOLDS.items()} == CERTIFICATE
    for d, t in THRESHOLDS.items():
        att = tolerance("attention", d)
        assert att == tolerance(kind_of("decomposition"), d) == tolerance("entropy", d)
        # half precision: the certificate's threshold; full precision: ~100 eps, at least 10x under the threshold
        eps = torch.finfo(d).eps
        assert att == t if d in (torch.float16, torch.bfloat16) else 30 * eps < att <= t / 10
        assert tolerance("nll", d) == max(t, 1e-5)
    assert tolerance("attention", "bf16") == 5e-2 and tolerance("attention", None) == 1e-5
    assert tolerance("nll", None) == 1e-4
    assert tolerance("kl", "float32") == 1e-6 and tolerance("kl", "bfloat16") == pytest.approx(0.05**2 / 2)
    assert all(v == 0 for v in TOLERANCES["accuracy"].values())
    assert kind_of("correct") == "accuracy" and kind_of("island_score") == "attention"
    with pytest.raises(ValueError, match="int8"):
        tolerance("attention", "int8")


def _pairs(diffs_by_group: dict[str, np.ndarray]) -> pd.DataFrame:
    return pd.concat(
        [pd.DataFrame({"g": g, "example": np.arange(len(d)), "diff": d}) for g, d in diffs_by_group.items()],
        ignore_index=True,
    )


def test_rounding_difference_has_no_p_value_and_leaves_the_bh_family():
    rng = np.random.default_rng(0)
    noise = np.abs(rng.normal(0, 3e-7, 8))  # same sign on all 8: the sign-flip test alone gives p = 2/256
    real = rng.normal(0.05, 0.01, 8)
    d = _pairs({"noise": noise, "real": real})
    plain = paired_summary(d, "g", n_boot=200, n_perm=4096).set_index("g")
    assert plain.loc["noise", "p_value"] == pytest.approx(2 / 256)  # what used to be read as a finding
    out = paired_summary(d, "g", n_boot=200, n_perm=4096, tolerance=1e-4).set_index("g")
    assert out.loc["noise", "within_tolerance"] and np.isnan(out.loc["noise", "p_value"])
    assert out.loc["noise", "max_abs_diff"] == pytest.approx(noise.max())
    assert not out.loc["real", "within_tolerance"]
    assert out.loc["real", "p_value"] == pytest.approx(sign_flip_test(real, n_perm=4096))
    _, q = benjamini_hochberg(out["p_value"].to_numpy())
    assert np.isnan(q[0]) and q[1] == pytest.approx(out.loc["real", "p_value"])  # m = 1: the noise is not a test
    # the rule reads the largest |Δ|, not the mean: one example moved by 0.05 among rounding is a finding
    one = noise.copy()
    one[3] = 0.05
    moved = paired_summary(_pairs({"one": one}), "g", n_boot=50, n_perm=256, tolerance=1e-4).iloc[0]
    assert np.abs(one).mean() < 1e-2 and not moved["within_tolerance"] and np.isfinite(moved["p_value"])


def _frame(values: np.ndarray, metric: str = "decomposition") -> pd.DataFrame:
    """Tidy rows of one cell (input → sink, layer 0, head 0) with one value per example."""
    return pd.DataFrame(
        {
            "example": np.arange(len(values)),
            "stack": "decoder",
            "layer": 0,
            "head": 0,
            "metric": metric,
            "query_role": "input",
            "key_role": "sink",
            "value": values,
            "count": 1.0,
        }
    )


def test_paired_cells_within_the_dtypes_tolerance_are_zero_not_significant():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.3, 0.7, 12)
    frames = {
        "base": pd.concat([_frame(base), _frame(base, "entropy").assign(key_role="")]),
        # a knockout that gives back the base up to float32 rounding, and a real shift of entropy
        "knockout": pd.concat([_frame(base + 2e-7), _frame(base + 0.02, "entropy").assign(key_role="")]),
    }
    out = A.compare_frames(frames, "base", n_boot=200, n_perm=4096).set_index("metric")
    sink, ent = out.loc["decomposition"], out.loc["entropy"]
    assert sink["within_tolerance"] and np.isnan(sink["p_value"]) and np.isnan(sink["q_value"])
    assert not sink["significant"] and sink["tolerance"] == 1e-5
    assert sink["max_abs_diff"] == pytest.approx(2e-7, rel=1e-6)
    assert not ent["within_tolerance"] and ent["significant"] and ent["q_value"] == pytest.approx(ent["p_value"])
    # no row flagged significant whose every |Δ| is below the tolerance
    assert not (out["significant"] & (out["max_abs_diff"] <= out["tolerance"])).any()
    # the same 0.02 shift is rounding in bfloat16 (tolerance 5e-2), not in float32
    bf16 = A.compare_frames(frames, "base", n_boot=50, n_perm=256, dtype=torch.bfloat16).set_index("metric")
    assert bf16["within_tolerance"].all() and bf16["p_value"].isna().all() and bf16["tolerance"].eq(5e-2).all()


HM_SINK = A.HeadlineMetric("sink", "decomposition", "input", "sink", "input → sink", "")
HM_ENT = A.HeadlineMetric("guidance_entropy", "entropy", "guidance", "", "entropy of guidance queries", "")


def test_headline_knockout_that_restores_the_base_has_no_finding_and_a_fixed_value_is_fixed():
    rng = np.random.default_rng(2)
    base = rng.uniform(0.3, 0.7, 8)

    def frame(sink: np.ndarray) -> pd.DataFrame:
        fixed_entropy = _frame(np.full(8, 0.436), "entropy").assign(query_role="guidance", key_role="")
        return pd.concat([_frame(sink), fixed_entropy], ignore_index=True)

    frames = {"base": frame(base), "knockout": frame(base + rng.normal(0, 1e-7, 8)), "shifted": frame(base + 0.03)}
    t = A.headline_table(frames, metrics=(HM_SINK, HM_ENT), n_boot=200).set_index(["name", "checkpoint"])
    ko = t.loc[("sink", "knockout")]
    assert ko["within_tolerance"] and np.isnan(ko["p_value"]) and np.isnan(ko["q_value"])
    shifted = t.loc[("sink", "shifted")]
    assert not shifted["within_tolerance"] and shifted["q_value"] < 0.05 and shifted["diff"] == pytest.approx(0.03)
    assert not (t["q_value"] < 0.05)[t["max_abs_diff"] <= t["tolerance"]].any()
    ent = t.loc["guidance_entropy"]
    assert ent["constant"].all() and np.allclose(ent["mean"], 0.436)
    assert not t.loc["sink", "constant"].any()
    assert ent.loc[["knockout", "shifted"], "within_tolerance"].all()  # the same fixed value: Δ 0, no test


def _wilson_by_bisection(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's interval as the set of p the score test does not reject, |k/n - p| <= z sqrt(p(1-p)/n), solved for
    its two ends by bisection (independent of the closed form)."""
    phat = k / n

    def inside(p: float) -> bool:
        return abs(phat - p) <= z * math.sqrt(p * (1 - p) / n)

    def edge(lo: float, hi: float) -> float:  # inside(lo) != inside(hi)
        for _ in range(200):
            mid = (lo + hi) / 2
            if inside(mid) == inside(lo):
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else edge(0.0, phat)
    high = 1.0 if k == n else edge(1.0, phat)
    return low, high


@pytest.mark.parametrize(("k", "n"), [(0, 8), (5, 8), (8, 8), (1, 29), (81, 263), (15, 148)])
def test_wilson_interval_is_the_inverted_score_test(k, n):
    assert wilson_interval(k, n) == pytest.approx(_wilson_by_bisection(k, n), abs=1e-9)


def test_wilson_interval_published_values():
    # Newcombe (1998), Stat Med 17:857, Table I: 81/263 -> 0.2553, 0.3662; 0/20 -> upper z²/(n+z²) = 0.1611
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert wilson_interval(0, 20) == (0.0, pytest.approx(Z95**2 / (20 + Z95**2)))
    assert wilson_interval(0, 0) != wilson_interval(0, 0)  # NaNs


def _newcombe_reference(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Newcombe's method 10 from the bisected Wilson intervals and the Pearson correlation of the 0/1 outcomes."""
    n = len(a)
    p1, p2 = a.mean(), b.mean()
    l1, u1 = _wilson_by_bisection(int(a.sum()), n)
    l2, u2 = _wilson_by_bisection(int(b.sum()), n)
    phi = 0.0 if a.std() == 0 or b.std() == 0 else float(np.corrcoef(a, b)[0, 1])
    if phi:  # Newcombe's correction of phi's numerator AD - BC (= phi * sqrt(margins) = n² cov(a, b))
        cross = n * n * float(np.mean(a * b) - a.mean() * b.mean())
        corrected = cross - n / 2 if cross > n / 2 else min(cross, 0.0)
        phi *= corrected / cross
    dl = math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    du = math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return p1 - p2 - dl, p1 - p2 + du


@pytest.mark.parametrize("seed", range(5))
def test_newcombe_paired_interval_matches_an_independent_computation(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 40))
    a = rng.integers(0, 2, n).astype(float)
    b = np.where(rng.random(n) < 0.3, 1 - a, a)
    lo, hi = newcombe_paired_interval(a, b)
    assert (lo, hi) == pytest.approx(_newcombe_reference(a, b), abs=1e-8)
    assert lo <= a.mean() - b.mean() <= hi


def test_no_example_changed_at_n_8_is_not_certainty():
    for k in range(9):  # k of 8 right, the same examples on both sides
        same = (np.arange(8) < k).astype(float)
        lo, hi = newcombe_paired_interval(same, same)
        assert (lo, hi) == pytest.approx(_newcombe_reference(same, same), abs=1e-8)
        assert lo == pytest.approx(-hi) and hi > 0.1  # never the bootstrap's [0, 0]
    half = (np.arange(8) < 4).astype(float)
    # AD - BC = 16 corrected to 16 - 4 = 12, phi = 12/16; both Wilson arms 0.2849: half-width 0.2849 sqrt(2 - 1.5)
    arm = 0.5 - _wilson_by_bisection(4, 8)[0]
    assert newcombe_paired_interval(half, half)[1] == pytest.approx(arm * math.sqrt(0.5), abs=1e-8)
    ones = np.ones(8)  # 8 of 8 right on both sides: no correlation to use, the Wilson arm 1 - 0.676 both ways
    arm = 1 - _wilson_by_bisection(8, 8)[0]
    assert newcombe_paired_interval(ones, ones) == pytest.approx((-arm, arm), abs=1e-8)


def test_a_mean_difference_below_the_tolerance_is_no_finding_even_when_some_examples_move_more():
    from anchorlens.analyses.stats import not_a_finding

    got = not_a_finding([2.3e-5, 3e-5, 4e-6, np.nan], [8e-6, 2e-5, -1e-6, np.nan], 1e-5)
    assert got.tolist() == [True, False, True, False]
