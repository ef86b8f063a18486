"""Table cells of rounding, fixed values and accuracy at small n: what summary.md and the terminal print."""

from __future__ import annotations

import numpy as np
import pandas as pd

from anchorlens.analyses.stats import newcombe_paired_interval, wilson_interval
from anchorlens.reports.tables import SAME_CELL, headline_grid, rounding_note


def _row(checkpoint: str, **kw) -> dict:
    row = {
        "name": "x",
        "label": "input → sink",
        "metric": "decomposition",
        "stack": "decoder",
        "checkpoint": checkpoint,
        "query_role": "input",
        "key_role": "sink",
        "n": 8,
        "mean": 0.5,
        "ci_lo": 0.45,
        "ci_hi": 0.55,
        "diff": np.nan,
        "diff_lo": np.nan,
        "diff_hi": np.nan,
        "p_value": np.nan,
        "q_value": np.nan,
        "fixed": "",
        "max_abs_diff": np.nan,
        "tolerance": 1e-5,
        "within_tolerance": False,
        "constant": False,
    }
    return {**row, **kw}


def test_rounding_reads_zero_without_q_and_a_fixed_value_reads_fixed():
    rows = [
        _row("base"),
        _row("ko", diff=1.8e-8, diff_lo=1.4e-8, diff_hi=2.3e-8, max_abs_diff=4.1e-7, within_tolerance=True),
        _row("real", diff=-0.4, diff_lo=-0.41, diff_hi=-0.39, p_value=0.004, q_value=0.0104),
        # a real change too small for 3 decimals (every example moved, some beyond the tolerance)
        _row("tiny", diff=7.8e-6, diff_lo=2.8e-6, diff_hi=1.4e-5, max_abs_diff=2.3e-5, p_value=0.008, q_value=0.013),
        _row(
            "base", name="e", label="entropy of guidance queries", mean=0.436, ci_lo=0.436, ci_hi=0.436, constant=True
        ),
        _row("ko", name="e", label="entropy of guidance queries", mean=0.436, ci_lo=0.436, ci_hi=0.436, constant=True),
        _row(
            "real", name="e", label="entropy of guidance queries", diff=0.05, diff_lo=0.05, diff_hi=0.05, q_value=0.02
        ),
    ]
    grid = headline_grid(pd.DataFrame(rows), ["base", "ko", "real", "tiny"])
    ko = grid.loc["input → sink (decoder)", "ko"]
    assert ko == "0.500 [0.450, 0.550]; Δ 0 (within rounding: max |Δ| 4e-07 ≤ 1e-05, no test)"
    assert "q=" not in ko
    assert grid.loc["input → sink (decoder)", "tiny"].endswith("Δ +7.8e-06 [+2.8e-06, +1.4e-05] q=0.013")
    assert grid.loc["input → sink (decoder)", "real"].endswith("Δ -0.400 [-0.410, -0.390] q=0.0104")
    assert grid.loc["entropy of guidance queries (decoder)", "base"] == f"0.436 ({SAME_CELL})"
    assert grid.loc["entropy of guidance queries (decoder)", "real"].endswith("Δ +0.050 (same in every example) q=0.02")
    # a table read back from an older headline.csv (no constant column): an interval of no width still reads fixed
    old = pd.DataFrame(rows).drop(columns=["constant"])
    assert (
        headline_grid(old, ["base", "ko", "real"])
        .loc["entropy of guidance queries (decoder)", "ko"]
        .startswith(f"0.436 ({SAME_CELL})")
    )


def test_accuracy_at_small_n_names_its_interval_and_the_examples_that_changed():
    right = np.array([1, 1, 1, 0, 1, 0, 0, 1], dtype=float)
    lo, hi = wilson_interval(5, 8)
    d_lo, d_hi = newcombe_paired_interval(right, right)
    acc = {"label": "accuracy", "metric": "correct", "mean": 5 / 8, "ci_lo": lo, "ci_hi": hi, "interval": "wilson"}
    rows = [
        _row("base", **acc),
        _row(
            "ko",
            **acc,
            diff=0.0,
            diff_lo=d_lo,
            diff_hi=d_hi,
            changed=0,
            within_tolerance=True,
            tolerance=0.0,
            diff_interval="newcombe",
        ),  # fmt: skip
    ]
    grid = headline_grid(pd.DataFrame(rows), ["base", "ko"])
    assert grid.loc["accuracy (decoder)", "base"] == f"0.625 [{lo:.3f}, {hi:.3f}] Wilson"
    cell = grid.loc["accuracy (decoder)", "ko"]
    assert cell.endswith(f"Δ 0 (0 of 8 examples changed, n = 8 is small; [{d_lo:+.3f}, {d_hi:+.3f}] Newcombe)")
    assert "[+0.000, +0.000]" not in cell and "q=" not in cell


def test_rounding_note_names_the_dtypes_tolerances():
    assert "float32" in rounding_note() and "attention and entropy 1e-05" in rounding_note()
    assert "bfloat16" in rounding_note("bf16") and "attention and entropy 5e-02" in rounding_note("bf16")
