"""Evaluate a (guided) model on a task: predictions.csv + metrics.json in an atomically written run dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.atomic import write_json
from anchorlens.errors import UsageError
from anchorlens.evaluation import DEFAULT_MAX_LENGTH, task_metrics
from anchorlens.evaluation.verbalizers import AUTO, SCORINGS
from anchorlens.methods.spec import load_guided
from anchorlens.models.base import Base
from anchorlens.rundir import OutClaim, claimed, examples_digest, write_manifest
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.first_pass import first_pass
from anchorlens.workflows.inputs import resolve_inputs


@dataclass
class EvalResult:
    """Predictions (one row per example), metrics, and the run dir when one was written."""

    predictions: pd.DataFrame
    metrics: dict[str, Any]
    out: Path | None = None


def evaluate(
    spec_or_model: Any = "base",
    task: str = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    base: Base | str | None = None,
    *,
    batch_size: int = 8,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    out: str | Path | OutClaim | None = None,
    force: bool = False,
    progress: bool = False,
    allow_other_base: bool = False,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    scoring: str = "auto",
) -> EvalResult:
    """Predict every example of ``data`` (or the bundled set) and compute the task's metrics; write them to ``out``.

    ``out`` (a path or an :class:`~anchorlens.rundir.OutClaim`) is claimed before anything is computed;
    ``field_map``/``prompt``: column renames and prompt options (chat, system prompt, few-shot); ``scoring``: ``sum``,
    ``first_token`` or ``auto`` (:func:`~anchorlens.evaluation.scoring.resolve_scoring`): metrics.json and the
    manifest record the one used (``scoring``) and the one asked for (``scoring_requested``).
    """
    check_scoring(scoring)
    read = _Reading(task, data, n, field_map, prompt, scoring)
    if out is None:
        return _evaluate(spec_or_model, read, base, batch_size, max_length, progress, allow_other_base)[0]
    with claimed(out, kind="evaluate", force=force) as claim:
        result, model, inputs = _evaluate(spec_or_model, read, base, batch_size, max_length, progress, allow_other_base)
        with claim.atomic() as tmp:
            result.predictions.to_csv(tmp / "predictions.csv", index=False)
            write_json(tmp / "metrics.json", result.metrics)
            write_manifest(
                tmp,
                "evaluate",
                base_model=model.base,
                data_digest=examples_digest(inputs.examples),
                model=model.config(),
                task=inputs.task.name,
                data=inputs.source,
                **inputs.facts(inputs.prompts(model.base.tokenizer)),
                batch_size=batch_size,
                max_length=max_length,
                scoring=result.metrics["scoring"],
                scoring_requested=scoring,
                **({"first_pass": result.metrics["first_pass"]} if "first_pass" in result.metrics else {}),
            )
        result.out = claim.path
    return result


@dataclass(frozen=True)
class _Reading:
    """What to read: the task, data, count, column renames and prompt options, and how answers are scored."""

    task: Any
    data: str | Path | None
    n: int | None
    field_map: Any
    prompt: PromptOptions | None
    scoring: str = "auto"


def check_scoring(scoring: str) -> None:
    """UsageError (one line) unless ``scoring`` is ``auto``, ``sum`` or ``first_token`` (before anything is read)."""
    if scoring not in (AUTO, *SCORINGS):
        raise UsageError(f"scoring must be one of {AUTO}, {', '.join(SCORINGS)}; got {scoring!r}")


def _evaluate(
    spec_or_model: Any,
    read: _Reading,
    base: Base | str | None,
    batch_size: int,
    max_length: int | None,
    progress: bool,
    allow_other_base: bool,
) -> tuple[EvalResult, Any, Any]:
    """(result without out, model, inputs)."""
    inputs = resolve_inputs(
        read.task, read.data, read.n, need_labels=True, field_map=read.field_map, prompt=read.prompt
    )
    model = load_guided(spec_or_model, base, allow_other_base=allow_other_base)
    prompts = inputs.prompts(model.base.tokenizer)  # as ``predict`` renders them
    done = first_pass(model, prompts.examples(inputs.examples), prompts, batch_size=batch_size, max_length=max_length)
    preds = inputs.predict(model, batch_size=batch_size, max_length=max_length, progress=progress, scoring=read.scoring)
    metrics = {
        "task": inputs.task.name,
        **task_metrics(preds, inputs.task),
        "num_examples": len(preds),
        "scoring": preds.attrs.get("scoring"),  # sum (whole answer) or first_token (evaluation.scoring.resolve_scoring)
        "scoring_requested": read.scoring,
    }
    if done:
        metrics["first_pass"] = done
    return EvalResult(preds, metrics), model, inputs
