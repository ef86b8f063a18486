"""Evaluation: verbalizer log-likelihood classification, predictions tables and task metrics."""

from __future__ import annotations

from anchorlens.evaluation.batches import DEFAULT_MAX_LENGTH, ScoringBatch, scoring_batch
from anchorlens.evaluation.metrics import accuracy, binary_f1, exact_match, f1a, macro_f1
from anchorlens.evaluation.model import Scorable, as_model
from anchorlens.evaluation.predict import predict
from anchorlens.evaluation.report import task_metrics
from anchorlens.evaluation.scoring import label_scores
from anchorlens.evaluation.verbalizers import Verbalizers, verbalizer_ids

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "Scorable",
    "ScoringBatch",
    "Verbalizers",
    "accuracy",
    "as_model",
    "binary_f1",
    "exact_match",
    "f1a",
    "label_scores",
    "macro_f1",
    "predict",
    "scoring_batch",
    "task_metrics",
    "verbalizer_ids",
]
