"""compare with a knockout: the task effects beside the attention tables, and bad knockouts as one line, exit 2."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    "spec, words",
    [
        ("instance+knockout:keys=hypothesis_words", "no role 'hypothesis_words'"),
        ("instance+knockout:keys=instance,layers=3-40", "outside the model"),
        ("knockout:keys=capsule", "inserts no capsule positions"),
        ("prefix+knockout:keys=pos=0,mode=mean", "prefix keys have none"),
        ("instance+knockout:mode=erase", "unknown knockout mode"),
    ],
)
def test_bad_knockouts_are_one_line_and_exit_2(tiny_base, tmp_path, spec, words):
    tiny_base("tiny-llama")
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["compare", "--ckpt", "base", "--ckpt", spec, "--base", "tiny-llama", "--n", "2", "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in result.output, result.output
    assert not out.exists()


@pytest.mark.slow  # three tiny-llama captures and scorings
def test_compare_writes_task_effects_and_a_full_instance_knockout_is_the_base(tiny_base, tmp_path):
    tiny_base("tiny-llama")
    out = tmp_path / "cmp"
    ckpts = ["base", "instance", "instance+knockout:keys=instance,mode=renorm"]
    args = ["compare", *(a for c in ckpts for a in ("--ckpt", c)), "--base", "tiny-llama", "--n", "4"]
    result = runner.invoke(app, [*args, "--out", str(out), "--no-figures"])
    assert result.exit_code == 0, result.output
    assert "label NLL (answer token)" in result.output and "KL(base ‖ ·) (answer token)" in result.output
    table = pd.read_csv(out / "task_effects.csv").set_index(["metric", "checkpoint"])
    rows = pd.read_parquet(out / "effects.parquet")
    assert set(rows["metric"]) == {"correct", "nll", "kl"} and len(rows) == 3 * 3 * 4
    assert "## Task effects" in (out / "summary.md").read_text()
    assert "Task effects" in (out / "report.html").read_text()
    # nobody attends to the instance token at any layer: RoPE is relative, so this is the base's distribution
    knocked = "instance+knockout:keys=instance,mode=renorm"
    assert table.loc[("kl", knocked), "mean"] < 1e-5
    assert table.loc[("nll", knocked), "mean"] == pytest.approx(table.loc[("nll", "base"), "mean"], abs=1e-4)
    assert table.loc[("kl", "instance"), "mean"] > 1e-4


@pytest.mark.slow  # tiny-llama scorings of three models
def test_sweep_knockout_windows_and_the_full_window_is_the_base(tiny_base):
    from anchorlens.evaluation.effects import effects_table, example_effects
    from anchorlens.methods import load_guided
    from anchorlens.tasks import bundled_examples, get_task
    from anchorlens.workflows.sweeps import sweep_knockout

    base = tiny_base("tiny-llama")
    halves = sweep_knockout("instance", "instance", window=3, base=base, n=4, n_boot=200)
    assert list(halves["layers"]) == ["0-2", "3-3"] and list(halves["layer"]) == [0, 3]
    assert halves["spec"].iloc[0] == "instance+knockout:keys=instance,layers=0-2,mode=renorm"
    whole = sweep_knockout("instance", "instance", window=4, base=base, n=4, n_boot=200)
    # every layer knocked out is the base (RoPE is relative): the sweep's ΔNLL is base − instance
    task = get_task("rte")
    models = {"instance": load_guided("instance", base), "base": load_guided("base", base)}
    rows = example_effects(models, list(bundled_examples("rte", limit=4)), task, task.template, max_length=None)
    direct = effects_table(rows, ["instance", "base"], n_boot=200).set_index(["metric", "checkpoint"])
    assert whole["d_nll"].iloc[0] == pytest.approx(direct.loc[("nll", "base"), "diff"], abs=1e-4)
    assert whole["kl"].iloc[0] == pytest.approx(direct.loc[("kl", "base"), "mean"], rel=1e-3, abs=1e-6)


def test_evaluate_with_a_mean_knockout_makes_its_first_pass(tiny_base, tmp_path):
    """The CLI's evaluate runs the first pass over its examples and records the mean's norm per layer."""
    import json

    tiny_base("tiny-llama")
    out = tmp_path / "ev"
    spec = "instance+knockout:keys=instance,layers=1-2,mode=mean"
    result = runner.invoke(app, ["evaluate", "--base", "tiny-llama", "--ckpt", spec, "--n", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    (record,) = manifest["first_pass"]
    assert record["knockout"] == "knockout:keys=instance,layers=1-2,mode=mean"
    assert record["examples"] == 3 and record["keys"] == 3 and set(record["mean_norm"]) == {"1", "2"}
    assert json.loads((out / "metrics.json").read_text())["first_pass"] == [record]


@pytest.mark.slow  # two tiny-llama captures and scorings
def test_compare_with_a_mean_knockout_writes_task_effects(tiny_base, tmp_path):
    import json

    tiny_base("tiny-llama")
    out = tmp_path / "cmp"
    mean = "instance+knockout:keys=instance,mode=mean"
    args = ["compare", "--ckpt", "instance", "--ckpt", mean, "--base", "tiny-llama", "--n", "4", "--no-figures"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "task_effects.csv").set_index(["metric", "checkpoint"])
    assert table.loc[("kl", mean), "mean"] > 1e-6 and table.loc[("nll", mean), "n"] == 4
    facts = json.loads((out / "manifest.json").read_text())
    (record,) = facts["first_pass"][mean]
    assert record["examples"] == 4 and set(record["mean_norm"]) == {"0", "1", "2", "3"}
