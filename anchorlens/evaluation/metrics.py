"""Classification metrics: accuracy (with bootstrap CI), macro-F1 (CB), MultiRC F1a and EM."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np


def accuracy(labels: Sequence[Any], preds: Sequence[Any]) -> float:
    """Share of predictions equal to their label (NaN for no examples)."""
    if len(labels) != len(preds):
        raise ValueError(f"{len(labels)} labels but {len(preds)} predictions")
    if not labels:
        return float("nan")
    return float(np.mean([_same(y, p) for y, p in zip(labels, preds)]))


def _same(a: Any, b: Any) -> bool:
    """Type-strict equality (``True`` is not ``1``), as ``Task.label_index`` compares labels."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def binary_f1(labels: Sequence[Any], preds: Sequence[Any], positive: Any) -> float:
    """F1 of the class ``positive`` (0 when it is never predicted nor true)."""
    tp = sum(_same(y, positive) and _same(p, positive) for y, p in zip(labels, preds))
    fp = sum(not _same(y, positive) and _same(p, positive) for y, p in zip(labels, preds))
    fn = sum(_same(y, positive) and not _same(p, positive) for y, p in zip(labels, preds))
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def macro_f1(labels: Sequence[Any], preds: Sequence[Any], classes: Sequence[Any] | None = None) -> float:
    """Mean per-class F1 over ``classes`` (default: the classes seen in labels or predictions, like sklearn)."""
    if classes is None:
        seen: list[Any] = []
        for v in [*labels, *preds]:
            if not any(_same(v, s) for s in seen):
                seen.append(v)
        classes = seen
    if not classes:
        return float("nan")
    return float(np.mean([binary_f1(labels, preds, c) for c in classes]))


def f1a(labels: Sequence[Any], preds: Sequence[Any], positive: Any = 1) -> float:
    """MultiRC F1a: binary F1 of the ``positive`` (correct-answer) class over all answer options."""
    return binary_f1(labels, preds, positive)


def exact_match(labels: Sequence[Any], preds: Sequence[Any], groups: Sequence[Hashable]) -> float:
    """MultiRC EM: share of question groups whose every answer option is predicted right."""
    ok: dict[Hashable, bool] = {}
    for y, p, g in zip(labels, preds, groups):
        ok[g] = ok.get(g, True) and _same(y, p)
    return float(np.mean(list(ok.values()))) if ok else float("nan")
