"""Predict labels for task examples by verbalizer log-likelihood; one row per example."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pandas as pd
import torch

from anchorlens.capture.collect import PromptRenderer
from anchorlens.evaluation.batches import DEFAULT_MAX_LENGTH, length_sorted_batches, scoring_batch
from anchorlens.evaluation.model import as_model, model_device
from anchorlens.evaluation.scoring import label_scores, resolve_scoring
from anchorlens.evaluation.verbalizers import verbalizer_ids
from anchorlens.tasks import Task, get_task

LENGTH_WINDOW = 256  # examples sorted by length together into batches (rows still come in the examples' order)


def chunks(n: int, size: int) -> Iterator[range]:
    """Consecutive index ranges of at most ``size`` covering ``range(n)``."""
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {size}")
    for start in range(0, n, size):
        yield range(start, min(start + size, n))


def score_column(label: Any) -> str:
    """Column name of a label's score (``score_entailment``, ``score_True``)."""
    return f"score_{label}"


@torch.no_grad()
def predict(
    model: Any,
    examples: Sequence[dict],
    task: str | Task,
    batch_size: int = 8,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    progress: bool = False,
    prompts: PromptRenderer | None = None,
    scoring: str = "auto",
) -> pd.DataFrame:
    """Columns idx, label, pred, score_<label> (log-likelihood) per label, correct, pred_norm, correct_norm
    (+ the task's group fields).

    ``prompts``: how examples are rendered (chat template, demonstrations); default the task's template.
    ``scoring``: ``sum`` ranks labels by their verbalizer's summed log-likelihood (lm-evaluation-harness ``acc``)
    and ``pred_norm`` by that divided by the answer's length in characters (``acc_norm``); ``first_token`` by the
    first distinguishing token's log-probability (``pred_norm`` then equals ``pred``); ``auto`` (default) is ``sum``
    unless the model's guidance would see an appended answer (:func:`~anchorlens.evaluation.scoring.resolve_scoring`).
    The scoring used is ``frame.attrs["scoring"]``. A task whose choices vary
    per document has the choice indices as labels (score_0, score_1, ... up to its most choices).
    """
    task = get_task(task)
    model = as_model(model)
    base = model.base
    scoring = resolve_scoring(scoring, [model], base.tokenizer, task)
    verbalizers = verbalizer_ids(base.tokenizer, task, scoring)
    device = model_device(model)
    render = prompts if prompts is not None else task.template
    lengths = [len(render.render(ex).text) for ex in examples]
    spans: Iterable[list[int]] = length_sorted_batches(lengths, batch_size, LENGTH_WINDOW)
    if progress:
        from tqdm.auto import tqdm

        spans = tqdm(spans, desc=f"predict {task.name}", unit="batch")
    records: dict[int, dict] = {}
    for span in spans:
        part = [examples[i] for i in span]
        batch = scoring_batch(base, task, part, verbalizers, example_ids=span, max_length=max_length, prompts=prompts)
        scores = label_scores(model, batch.to(device), verbalizers).cpu()
        assert batch.norm_chars is not None
        norm = scores / batch.norm_chars if verbalizers.scoring == "sum" else scores
        for i, ex, row, row_norm in zip(span, part, scores, norm):
            records[i] = _record(task, ex, row, row_norm, verbalizers.per_document)
    frame = pd.DataFrame.from_records([records[i] for i in range(len(examples))])
    frame.attrs["scoring"] = scoring
    return frame


def _record(task: Task, example: dict, scores: torch.Tensor, norm: torch.Tensor, per_document: bool) -> dict:
    """One prediction row from an example and its [L] scores and [L] length-normalised scores (-inf: no such
    choice for this document)."""
    values = list(range(int(torch.isfinite(scores).sum()))) if per_document else list(task.labels)
    pred, pred_norm = values[int(scores.argmax())], values[int(norm.argmax())]
    label = example.get("label")
    rec: dict = {"idx": example.get("idx"), "label": label, "pred": pred}
    for value, s in zip(values, scores.tolist()):
        rec[score_column(value)] = s
    rec["correct"] = None if label is None else task.label_index(label) == task.label_index(pred)
    rec["pred_norm"] = pred_norm
    rec["correct_norm"] = None if label is None else task.label_index(label) == task.label_index(pred_norm)
    for key in task.group_fields:
        if key in example:
            rec[key] = example[key]
    return rec
