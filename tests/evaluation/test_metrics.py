"""Metrics against hand-computed values."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from anchorlens.analyses.stats import bootstrap_ci
from anchorlens.evaluation import accuracy, binary_f1, exact_match, f1a, macro_f1, task_metrics


def test_accuracy_is_type_strict():
    assert accuracy([True, False, True, True], [True, True, True, False]) == 0.5
    assert accuracy([1, 0], [True, False]) == 0.0  # True is not the label 1
    assert math.isnan(accuracy([], []))


def test_macro_f1_by_hand():
    labels = ["entailment", "entailment", "contradiction", "neutral", "neutral", "entailment"]
    preds = ["entailment", "contradiction", "contradiction", "entailment", "neutral", "entailment"]
    # entailment: tp=2 fp=1 fn=1 -> 4/6; contradiction: tp=1 fp=1 fn=0 -> 2/3; neutral: tp=1 fp=0 fn=1 -> 2/3
    assert macro_f1(labels, preds) == pytest.approx((4 / 6 + 2 / 3 + 2 / 3) / 3)
    # a class never seen in labels or predictions is left out (sklearn's default), unless listed
    assert macro_f1(["a", "a"], ["a", "a"]) == 1.0
    assert macro_f1(["a", "a"], ["a", "a"], classes=["a", "b"]) == 0.5


def test_f1a_and_em_by_hand():
    labels = [1, 0, 1, 0, 1, 1]
    preds = [1, 0, 0, 0, 1, 1]
    groups = ["q1", "q1", "q2", "q2", "q3", "q3"]
    # positive class 1: tp=3 fp=0 fn=1 -> 6/7
    assert f1a(labels, preds) == pytest.approx(6 / 7)
    assert binary_f1(labels, preds, positive=0) == pytest.approx(2 * 2 / (2 * 2 + 1))
    # q1 all right, q2 one wrong, q3 all right -> 2/3
    assert exact_match(labels, preds, groups) == pytest.approx(2 / 3)


def test_accuracy_ci_is_the_project_bootstrap():
    preds = pd.DataFrame({"label": [True] * 10, "pred": [True] * 7 + [False] * 3, "correct": [True] * 7 + [False] * 3})
    m = task_metrics(preds, "boolq", seed=1)
    mean, low, high = bootstrap_ci([1.0] * 7 + [0.0] * 3, seed=1)
    assert m["accuracy"] == pytest.approx(mean) and m["accuracy_ci95"] == [low, high]
    assert 0.0 <= low <= 0.7 <= high <= 1.0


def test_task_metrics_multirc_groups_by_passage_and_question():
    df = pd.DataFrame(
        {
            "label": [1, 0, 1, 1],
            "pred": [1, 0, 1, 0],
            "correct": [True, True, True, False],
            "group": [0, 0, 0, 0],
            "passage_idx": [0, 0, 1, 1],
        }
    )
    m = task_metrics(df, "multirc")
    assert m["em"] == 0.5  # (passage 0, q0) right, (passage 1, q0) wrong
    assert m["f1a"] == pytest.approx(2 * 2 / (2 * 2 + 1))
    assert m["accuracy"] == 0.75 and m["n"] == 4


def test_task_metrics_cb_has_macro_f1_and_numpy_bools_stay_bools():
    df = pd.DataFrame({"label": [True, False], "pred": [True, True], "correct": [True, False]})
    assert df["label"].dtype == bool
    m = task_metrics(df, "boolq")
    assert m["accuracy"] == 0.5 and "macro_f1" not in m
    cb = pd.DataFrame({"label": ["neutral"], "pred": ["neutral"], "correct": [True]})
    assert task_metrics(cb, "cb")["macro_f1"] == 1.0
