"""Every checkpoint against every other: paired accuracy differences from per-example outcomes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses.accuracy_pairs import accuracy_pairs, pair_lines
from anchorlens.analyses.stats import newcombe_paired_interval


def _rows(outcomes: dict[str, list[int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"checkpoint": name, "example": i, "metric": metric, "value": float(v) if metric == "correct" else 0.3}
            for name, values in outcomes.items()
            for i, v in enumerate(values)
            for metric in ("correct", "nll")
        ]
    )


def test_pairs_count_discordant_examples_and_test_them():
    outcomes = {
        "base": [1, 1, 0, 0, 1, 0, 1, 0, 0, 0],
        "prompt": [1, 1, 1, 1, 1, 1, 1, 0, 1, 0],
        "capsule": [1, 1, 1, 1, 1, 1, 1, 0, 1, 0],
    }
    table = accuracy_pairs(_rows(outcomes), ["base", "prompt", "capsule"])
    assert list(zip(table["a"], table["b"])) == [("base", "prompt"), ("base", "capsule"), ("prompt", "capsule")]
    first = table.iloc[0]
    assert (first["n"], first["only_a_right"], first["only_b_right"]) == (10, 0, 4)
    assert first["accuracy_a"] == 0.4 and first["accuracy_b"] == 0.8 and first["diff"] == pytest.approx(0.4)
    assert first["p_value"] == pytest.approx(2 * 0.5**4)  # exact McNemar: 4 of 4 discordant one way
    lo, hi = newcombe_paired_interval(outcomes["prompt"], outcomes["base"])
    assert (first["diff_lo"], first["diff_hi"]) == pytest.approx((lo, hi)) and lo > 0
    same = table.iloc[2]  # prompt and capsule agree on every example: no test, no q, an interval all the same
    assert same["diff"] == 0 and math.isnan(same["p_value"]) and math.isnan(same["q_value"])
    assert same["diff_lo"] < 0 < same["diff_hi"]
    assert table["q_value"].iloc[:2].tolist() == pytest.approx([0.125, 0.125])  # BH over the two tested pairs
    lines = pair_lines(table)
    assert lines[0].startswith("- prompt vs base: 0.800 vs 0.400 (n=10), Δ +0.400 [")
    assert "Δ 0 (no example changed" in lines[2]


def test_pairs_use_only_examples_both_sides_scored():
    rows = _rows({"a": [1, 0, 1, 1], "b": [1, 1, 1, 0]})
    rows = rows[~((rows["checkpoint"] == "b") & (rows["example"] == 3))]
    (row,) = accuracy_pairs(rows).itertuples()
    assert row.n == 3 and row.only_b_right == 1 and row.only_a_right == 0
    assert accuracy_pairs(rows[rows["metric"] == "nll"]).empty


def test_a_compare_with_three_checkpoints_writes_the_pairs(tmp_path, tiny_base):
    """accuracy_pairs.csv agrees with task_effects.csv on the pairs with the first checkpoint, and the report shows it."""
    from typer.testing import CliRunner

    from anchorlens.cli import app

    tiny_base("tiny-llama")
    out = tmp_path / "run"
    args = ["compare", "--base", "tiny-llama", "--n", "6", "--no-figures", "--out", str(out)]
    for spec in ("base", "instance", "ko=instance+knockout:keys=instance,mode=renorm"):
        args += ["--ckpt", spec]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    effects = pd.read_csv(out / "task_effects.csv")
    pairs = pd.read_csv(out / "accuracy_pairs.csv")
    assert list(zip(pairs["a"], pairs["b"])) == [("base", "instance"), ("base", "ko"), ("instance", "ko")]
    acc = effects[effects["label"] == "accuracy"].set_index("checkpoint")
    for r in pairs[pairs["a"] == "base"].itertuples():
        assert r.diff == pytest.approx(acc.loc[r.b, "diff"]) and r.diff_lo == pytest.approx(acc.loc[r.b, "diff_lo"])
        assert r.accuracy_b == pytest.approx(acc.loc[r.b, "mean"])
    assert np.isfinite(pairs["accuracy_a"]).all() and (pairs["n"] == 6).all()
    assert "Accuracy of every checkpoint against every other" in (out / "report.html").read_text()
    assert "## Accuracy, every pair" in (md := (out / "summary.md").read_text()) and "| pair | n |" in md
