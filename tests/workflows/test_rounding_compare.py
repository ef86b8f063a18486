"""compare of a knockout that gives back the base: its differences are rounding, never findings."""

from __future__ import annotations

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from anchorlens.analyses.tolerance import tolerance
from anchorlens.cli import app

runner = CliRunner()
KNOCKED = "instance+knockout:keys=instance,mode=renorm"  # no query sees the instance token: RoPE is relative, the base


def test_a_knockout_that_gives_back_the_base_has_no_finding_below_the_tolerance(tiny_base, tmp_path):
    tiny_base("tiny-llama")
    out = tmp_path / "cmp"
    args = ["compare", "--ckpt", "base", "--ckpt", KNOCKED, "--base", "tiny-llama", "--n", "8", "--no-figures"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    paired, headline = pd.read_csv(out / "paired.csv"), pd.read_csv(out / "headline.csv")
    effects = pd.read_csv(out / "task_effects.csv").set_index(["metric", "checkpoint"])
    for table in (paired, headline):
        below = table["max_abs_diff"] <= table["tolerance"]
        assert table["within_tolerance"].eq(below).all()
        assert not (table["q_value"] < 0.05)[below].any() and table["p_value"][below].isna().all()
    # the attention of input queries to every key is the base's: every cell is rounding, none is tested
    decomposition = paired[paired["metric"] == "decomposition"]
    assert len(decomposition) and decomposition["within_tolerance"].all() and decomposition["q_value"].isna().all()
    assert (decomposition["tolerance"] == tolerance("attention", "float32")).all()
    sink = headline[(headline["name"] == "sink") & (headline["checkpoint"] == KNOCKED)].iloc[0]
    assert sink["within_tolerance"] and np.isnan(sink["q_value"]) and sink["max_abs_diff"] <= 1e-5
    # task effects: no example changed, NLL and KL within their tolerances, no test, and the cells say so
    assert effects.loc[("correct", KNOCKED), "changed"] == 0
    assert effects.loc[("correct", KNOCKED), "diff_lo"] < 0 < effects.loc[("correct", KNOCKED), "diff_hi"]
    for metric in ("correct", "nll", "kl"):
        assert effects.loc[(metric, KNOCKED), "within_tolerance"] and np.isnan(
            effects.loc[(metric, KNOCKED), "q_value"]
        )
    summary = (out / "summary.md").read_text()
    assert "0 of 8 examples changed" in summary and "Δ 0 (within rounding" in summary
