"""The training objective: cross-entropy over label verbalizer scores (each label's summed verbalizer
log-likelihood by default, as ``evaluate`` scores it; :mod:`anchorlens.evaluation.verbalizers`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from anchorlens.capture.collect import PromptRenderer
from anchorlens.evaluation.batches import DEFAULT_MAX_LENGTH, scoring_batch
from anchorlens.evaluation.model import as_model, model_device
from anchorlens.evaluation.predict import chunks
from anchorlens.evaluation.scoring import label_scores, resolve_scoring
from anchorlens.evaluation.verbalizers import verbalizer_ids
from anchorlens.tasks import Task, get_task


def classification_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of label scores [B, L] (log-likelihoods used as logits; -inf for a choice a document
    lacks) against labels [B]."""
    return F.cross_entropy(scores, labels.to(scores.device))


@torch.no_grad()
def dataset_loss(
    model: Any,
    examples: Sequence[dict],
    task: str | Task,
    batch_size: int = 16,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    prompts: PromptRenderer | None = None,
    scoring: str = "auto",
) -> float:
    """Mean classification loss of ``model`` over labelled ``examples`` (rendered by ``prompts``, default the
    task's template; labels scored by ``scoring``, ``sum`` or ``first_token``)."""
    task, model = get_task(task), as_model(model)
    verbalizers = verbalizer_ids(
        model.base.tokenizer, task, resolve_scoring(scoring, [model], model.base.tokenizer, task)
    )
    total, count = 0.0, 0
    for span in chunks(len(examples), batch_size):
        part = [examples[i] for i in span]
        batch = scoring_batch(model.base, task, part, verbalizers, max_length=max_length, prompts=prompts)
        batch = batch.to(model_device(model))
        total += float(classification_loss(label_scores(model, batch, verbalizers), batch.labels)) * len(part)
        count += len(part)
    return total / count
