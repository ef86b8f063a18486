"""Task effects: per-example accuracy, NLL and KL against direct computations; the paired table's statistics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from anchorlens.analyses.stats import benjamini_hochberg, mcnemar_test, newcombe_paired_interval, wilson_interval
from anchorlens.analyses.tolerance import tolerance
from anchorlens.evaluation import predict, scoring_batch, verbalizer_ids
from anchorlens.evaluation.effects import effects_table, example_effects
from anchorlens.methods import load_guided
from anchorlens.tasks import bundled_examples, get_task
from anchorlens.workflows.inputs import resolve_inputs


def test_mcnemar_is_the_exact_binomial_test_of_discordant_pairs():
    assert mcnemar_test([1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]) == pytest.approx(2 / 32)
    # 3 pairs right only in a, 1 only in b: p = 2 * P(X <= 1), X ~ Bin(4, 1/2) = 2 * 5/16
    assert mcnemar_test([1, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 0]) == pytest.approx(10 / 16)
    assert mcnemar_test([1, 0, 1], [1, 0, 1]) == 1.0
    assert mcnemar_test([1, np.nan, 1], [0, 1, 0]) == pytest.approx(min(1.0, 2 * 1 / 4))


def _frame(values: dict[str, dict[str, list[float]]]) -> pd.DataFrame:
    rows = [
        (ckpt, i, metric, v)
        for ckpt, metrics in values.items()
        for metric, vs in metrics.items()
        for i, v in enumerate(vs)
    ]
    return pd.DataFrame(rows, columns=["checkpoint", "example", "metric", "value"])


def test_effects_table_pairs_each_checkpoint_with_the_first():
    rng = np.random.default_rng(0)
    n = 12
    a_correct = rng.integers(0, 2, n).astype(float)
    b_correct = rng.integers(0, 2, n).astype(float)
    a_nll, b_nll = rng.normal(2, 0.5, n), rng.normal(2.5, 0.5, n)
    kl = rng.uniform(0, 1, n)
    frame = _frame(
        {
            "a": {"correct": list(a_correct), "nll": list(a_nll), "kl": [0.0] * n},
            "b": {"correct": list(b_correct), "nll": list(b_nll), "kl": list(kl)},
        }
    )
    table = effects_table(frame, ["a", "b"], n_boot=500, n_perm=4096).set_index(["metric", "checkpoint"])
    assert table.loc[("correct", "a"), "mean"] == pytest.approx(a_correct.mean())
    assert np.isnan(table.loc[("correct", "a"), "diff"])
    b = table.loc[("correct", "b")]
    assert b["diff"] == pytest.approx((b_correct - a_correct).mean())
    assert b["p_value"] == pytest.approx(mcnemar_test(b_correct, a_correct)) and b["test"] == "mcnemar"
    nll = table.loc[("nll", "b")]
    assert nll["diff"] == pytest.approx((b_nll - a_nll).mean())
    assert nll["diff_lo"] < nll["diff"] < nll["diff_hi"]
    assert table.loc[("kl", "b"), "diff"] == pytest.approx(kl.mean())
    assert table.loc[("kl", "b"), "label"] == "KL(a ‖ ·)"
    assert table.loc[("nll", "b"), "label"] == "label NLL"
    p = table["p_value"].to_numpy()
    np.testing.assert_allclose(table["q_value"].to_numpy(), benjamini_hochberg(p)[1], equal_nan=True)


@pytest.fixture(scope="module")
def two_models(tiny_base):
    base = tiny_base("tiny-llama")
    return base, {"base": load_guided("base", base), "instance": load_guided("instance", base)}


def test_label_effects_match_predict_and_a_direct_kl(two_models):
    base, models = two_models
    task = get_task("rte")
    examples = list(bundled_examples("rte", limit=5))
    rows = example_effects(models, examples, task, task.template, batch_size=2, max_length=None)
    got = rows.pivot_table(index=["checkpoint", "example"], columns="metric", values="value")
    # " yes" is two tokens in the tiny tokenizer and the instance token would average an appended answer in: the
    # run scores every model by the first distinguishing token (evaluation.scoring.resolve_scoring)
    for name, model in models.items():
        preds = predict(model, examples, task, batch_size=3, max_length=None, scoring="first_token")
        gold = [preds.loc[i, f"score_{preds.loc[i, 'label']}"] for i in range(len(preds))]
        np.testing.assert_allclose(got.loc[name, "nll"].to_numpy(), -np.array(gold), rtol=1e-5)
        np.testing.assert_array_equal(got.loc[name, "correct"].to_numpy(), preds["correct"].astype(float).to_numpy())
    # KL written out from softmaxes of the two models' logits at the answer position
    verbalizers = verbalizer_ids(base.tokenizer, task, "first_token")
    batch = scoring_batch(base, task, examples, verbalizers, max_length=None)
    rows_b = torch.arange(len(examples))
    with torch.no_grad():
        p = torch.softmax(models["base"].forward(batch.encoded).logits[rows_b, batch.answer_pos].double(), -1)
        q = torch.softmax(models["instance"].forward(batch.encoded).logits[rows_b, batch.answer_pos].double(), -1)
    want = (p * (p.log() - q.log())).sum(-1).numpy()
    np.testing.assert_allclose(got.loc["instance", "kl"].to_numpy(), want, rtol=1e-3, atol=1e-7)
    assert (got.loc["base", "kl"] == 0).all()


@pytest.mark.parametrize("window", [3, 8])
def test_length_sorted_windows_give_the_same_rows_in_the_same_order(two_models, window):
    _, models = two_models
    task = get_task("rte")
    examples = list(bundled_examples("rte", limit=8))
    plain = example_effects(models, examples, task, task.template, batch_size=2, max_length=None)
    sorted_ = example_effects(models, examples, task, task.template, batch_size=2, max_length=None, window=window)
    pd.testing.assert_frame_equal(sorted_.drop(columns="value"), plain.drop(columns="value"))
    np.testing.assert_allclose(sorted_["value"], plain["value"], rtol=1e-5, atol=1e-6)
    lengths = [len(task.template.render(ex).text) for ex in examples]
    assert lengths != sorted(lengths, reverse=True)  # the windows do reorder these examples


def test_text_effects_nll_is_the_language_model_loss(two_models, tmp_path):
    base, models = two_models
    (tmp_path / "doc.txt").write_text(
        "The cat sat on the mat and looked at the door for a long time.\n\nRain fell over the hills all night."
    )
    inputs = resolve_inputs("text", tmp_path / "doc.txt")
    prompts = inputs.prompts(base.tokenizer, 16)
    windows = prompts.examples(inputs.examples)
    rows = example_effects(models, windows, inputs.task, prompts, batch_size=1, max_length=16)
    assert set(rows["metric"]) == {"nll", "kl"}
    from anchorlens.capture.collect import encode_batches

    for batch in encode_batches(models["base"], windows, prompts, batch_size=1, max_length=16):
        example = int(batch.example_ids[0])
        with torch.no_grad():
            loss = base.model(input_ids=batch.input_ids, labels=batch.input_ids).loss  # HF's own mean token NLL
        mine = rows[(rows.checkpoint == "base") & (rows.example == example) & (rows.metric == "nll")]["value"]
        assert float(mine.iloc[0]) == pytest.approx(float(loss), rel=1e-5)
    kl = rows[(rows.checkpoint == "instance") & (rows.metric == "kl")]["value"]
    assert (kl > 0).all() and all(math.isfinite(v) for v in kl)


def test_evaluate_reports_the_label_nll_that_compare_reports(two_models):
    from anchorlens.evaluation import task_metrics

    base, models = two_models
    task = get_task("rte")
    examples = list(bundled_examples("rte", limit=4))
    preds = predict(models["instance"], examples, task, batch_size=2, max_length=None)
    metrics = task_metrics(preds, task, n_boot=200)
    rows = example_effects(models, examples, task, task.template, batch_size=4, max_length=None)
    nll = rows[(rows.checkpoint == "instance") & (rows.metric == "nll")]["value"].mean()
    assert metrics["label_nll"] == pytest.approx(nll, rel=1e-5)
    assert metrics["label_nll_ci95"][0] <= metrics["label_nll"] <= metrics["label_nll_ci95"][1]


def test_accuracy_takes_score_intervals_and_rounding_takes_no_test():
    n = 8
    right = np.array([1, 1, 1, 0, 1, 0, 0, 1], dtype=float)
    nll = np.linspace(0.5, 2.0, n)
    frame = _frame(
        {
            "base": {"correct": list(right), "nll": list(nll), "kl": [0.0] * n},
            # gives back the base: no example changes, NLL within float32 rounding, KL ~1e-8
            "same": {"correct": list(right), "nll": list(nll + 3e-6), "kl": [1e-8] * n},
            "flip": {"correct": list(1 - right), "nll": list(nll + 1.0), "kl": [0.5] * n},
        }
    )
    table = effects_table(frame, ["base", "same", "flip"], n_boot=200, n_perm=256).set_index(["metric", "checkpoint"])
    acc = table.loc[("correct", "base")]
    k = int(right.sum())
    assert acc["interval"] == "wilson" and (acc["ci_lo"], acc["ci_hi"]) == pytest.approx(wilson_interval(k, n))
    assert 0 < acc["ci_lo"] < acc["mean"] < acc["ci_hi"] < 1  # not the bootstrap's point at 0/1 outcomes
    same = table.loc[("correct", "same")]
    assert same["changed"] == 0 and same["within_tolerance"] and np.isnan(same["p_value"]) and np.isnan(same["q_value"])
    assert same["diff_interval"] == "newcombe"
    assert (same["diff_lo"], same["diff_hi"]) == pytest.approx(newcombe_paired_interval(right, right))
    assert same["diff_lo"] < 0 < same["diff_hi"]  # "0 of 8 changed" at n = 8 is not certainty
    flip = table.loc[("correct", "flip")]
    assert flip["changed"] == n and not flip["within_tolerance"]
    assert flip["p_value"] == pytest.approx(mcnemar_test(1 - right, right))
    for metric in ("nll", "kl"):
        row = table.loc[(metric, "same")]
        assert row["within_tolerance"] and np.isnan(row["p_value"]) and row["tolerance"] == tolerance(metric)
        assert not table.loc[(metric, "flip"), "within_tolerance"]
    assert table.loc[("kl", "base"), "constant"] and not table.loc[("nll", "base"), "constant"]
    assert table.loc[("kl", "flip"), "constant"]  # the same KL 0.5 in every example
    finite = table["p_value"].notna().to_numpy()  # BH over the tests only: the rounding rows are not in the family
    q = benjamini_hochberg(table["p_value"].to_numpy()[finite])[1]
    np.testing.assert_allclose(table["q_value"].to_numpy()[finite], q)
    bf16 = effects_table(frame, ["base", "same"], n_boot=50, n_perm=64, dtype="bfloat16").set_index(
        ["metric", "checkpoint"]
    )
    assert bf16.loc[("nll", "same"), "tolerance"] == 5e-2
