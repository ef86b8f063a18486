"""--scoring on the command line (evaluate, compare's task effects): the method is the user's, recorded in metrics.json
and the manifest; a bad value is one line, exit 2; evaluate's summary shows acc_norm beside acc under sum scoring.

The task is rte's t5 prompt (` entailment` / ` not_entailment`: several tokens after a shared one), where the whole
continuation and its first distinguishing token give different numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.cli.options import SCORING_NAMES
from anchorlens.evaluation import predict
from anchorlens.evaluation.verbalizers import AUTO, SCORINGS
from anchorlens.tasks import get_task, load_examples

RTE_T5 = """task: rte_t5
doc_to_text: "rte hypothesis: {{hypothesis}} premise: {{premise}}"
doc_to_target: label
doc_to_choice: ['entailment', 'not_entailment']
"""
ROWS = [
    {"premise": f"The cat number {i} sat on the mat.", "hypothesis": f"A cat {i} sat.", "label": i % 2, "idx": i}
    for i in range(6)
]


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    task = tmp_path / "rte_t5.yaml"
    task.write_text(RTE_T5)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return task, data


def evaluate(task: Path, data: Path, *extra: str):
    args = ["evaluate", "--ckpt", "base", "--base", "tiny-llama", "--task", str(task), "--data", str(data), *extra]
    return CliRunner().invoke(app, args)


def test_the_scoring_names_are_the_code_s():
    assert SCORING_NAMES == (AUTO, *SCORINGS)


@pytest.mark.parametrize("value", ["bogus", "whole", "first"])
def test_a_bad_scoring_is_one_line_exit_2(files, tmp_path, value):
    result = evaluate(*files, "--scoring", value, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--scoring: {value!r} is not a scoring method" in lines[0], result.output
    assert "auto" in lines[0] and "sum" in lines[0] and "first_token" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("given", "used"), [("first_token", "first_token"), ("first-token", "first_token"),
                                             ("sum", "sum"), ("auto", "sum")])  # fmt: skip
def test_evaluate_scores_as_asked_and_records_it(files, tmp_path, tiny_base, given, used):
    out = tmp_path / "out"
    result = evaluate(*files, "--scoring", given, "--out", str(out))
    assert result.exit_code == 0, result.output
    task = get_task(str(files[0]))
    expected = predict(tiny_base("tiny-llama"), load_examples(files[1], task), task, scoring=used)
    got = pd.read_csv(out / "predictions.csv")
    for column in ("score_0", "score_1", "pred", "pred_norm"):
        assert got[column].tolist() == pytest.approx(expected[column].tolist(), abs=1e-4)
    other = predict(tiny_base("tiny-llama"), load_examples(files[1], task), task, scoring=({*SCORINGS} - {used}).pop())
    assert got["score_1"].tolist() != pytest.approx(other["score_1"].tolist(), abs=1e-3)  # the two truly differ
    metrics = json.loads((out / "metrics.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert metrics["scoring"] == manifest["scoring"] == used
    assert metrics["scoring_requested"] == manifest["scoring_requested"] == given.replace("-", "_")
    said = result.output
    line = said[said.index("base on rte_t5: accuracy") :].splitlines()[0]
    assert line.endswith(f"scoring {used}")
    norm = f"acc_norm {metrics['acc_norm']:.3f} [{metrics['acc_norm_ci95'][0]:.3f}, {metrics['acc_norm_ci95'][1]:.3f}]"
    if used == "sum":  # acc_norm beside acc: the whole answers' log-likelihood per character
        assert metrics["acc_norm"] == pytest.approx(float((expected["pred_norm"] == expected["label"]).mean()))
        lo, hi = metrics["accuracy_ci95"]
        assert line.startswith(f"base on rte_t5: accuracy {metrics['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  {norm} (n=6)")
    else:
        assert "acc_norm" not in line


def test_compare_task_effects_score_as_asked(files, tmp_path, tiny_base):
    out = tmp_path / "cmp"
    args = ["compare", "--ckpt", "base", "--ckpt", "instance", "--base", "tiny-llama", "--task", str(files[0]),
            "--data", str(files[1]), "--scoring", "first_token", "--no-figures", "--map-examples", "0",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["scoring"] == "first_token"
    task = get_task(str(files[0]))
    expected = predict(tiny_base("tiny-llama"), load_examples(files[1], task), task, scoring="first_token")
    gold = [-expected.loc[i, f"score_{label}"] for i, label in enumerate(expected["label"])]
    effects = pd.read_parquet(out / "effects.parquet")
    nll = effects[(effects["checkpoint"] == "base") & (effects["metric"] == "nll")].sort_values("example")
    assert nll["value"].tolist() == pytest.approx(gold, abs=1e-4)
    bad = CliRunner().invoke(app, [*args[:-2], "--scoring", "nope", "--out", str(tmp_path / "cmp2")])
    assert bad.exit_code == 2 and "--scoring: 'nope' is not a scoring method" in bad.output
