"""Task metrics from a predictions table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from anchorlens.analyses.stats import bootstrap_ci
from anchorlens.evaluation.metrics import accuracy, exact_match, f1a, macro_f1
from anchorlens.evaluation.predict import score_column
from anchorlens.tasks import Task, get_task


def task_metrics(predictions: pd.DataFrame, task: str | Task, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Accuracy with its bootstrap 95% CI plus the task's own metrics (macro_f1, f1a, em) over labelled rows."""
    task = get_task(task)
    rows = predictions[predictions["label"].notna()] if "label" in predictions else predictions.iloc[:0]
    labels, preds = [_py(v) for v in rows["label"]], [_py(v) for v in rows["pred"]]
    _, low, high = bootstrap_ci(rows["correct"].astype(float).to_numpy(), n_boot=n_boot, seed=seed)
    out: dict = {"n": len(rows), "accuracy": accuracy(labels, preds), "accuracy_ci95": [low, high]}
    if "correct_norm" in rows:  # lm-evaluation-harness acc_norm: log-likelihood per character of the answer
        out["acc_norm"], low, high = bootstrap_ci(
            rows["correct_norm"].astype(float).to_numpy(), n_boot=n_boot, seed=seed
        )
        out["acc_norm_ci95"] = [low, high]
    nll = _label_nll(rows)
    if nll is not None:  # -log p(gold verbalizer) (its whole continuation), as compare's task effects report it
        out["label_nll"], low, high = bootstrap_ci(nll, n_boot=n_boot, seed=seed)
        out["label_nll_ci95"] = [low, high]
    if "macro_f1" in task.metrics:
        out["macro_f1"] = macro_f1(labels, preds)
    if "f1a" in task.metrics:
        out["f1a"] = f1a(labels, preds, positive=task.labels[-1])
    if "em" in task.metrics:
        out["em"] = exact_match(labels, preds, _groups(rows, task))
    return out


def _label_nll(rows: pd.DataFrame) -> np.ndarray | None:
    """[n] -score of each row's gold label (its ``score_<label>`` column); None when the scores are absent."""
    columns = [score_column(label) for label in rows["label"]]
    if not columns or any(c not in rows for c in columns):
        return None
    return -np.array([rows[c].iloc[i] for i, c in enumerate(columns)], dtype=np.float64)


def _py(value):
    """A numpy scalar as the Python value (``np.True_`` -> ``True``) so label comparisons stay type-strict."""
    return value.item() if hasattr(value, "item") else value


def _groups(rows: pd.DataFrame, task: Task) -> list:
    """Group keys for exact match: the task's ``group_fields`` the predictions carry (the finest one required)."""
    fields = [f for f in task.group_fields if f in rows]
    if not task.group_fields:
        raise ValueError(f"exact match for task {task.name} needs group_field in its task file")
    if task.group_fields[-1] not in fields:
        raise ValueError(
            f"exact match for task {task.name} needs a {task.group_fields[-1]!r} column in the predictions"
        )
    return list(zip(*(rows[f] for f in fields)))
