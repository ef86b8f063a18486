"""Train a guidance method on a task: ``OUT/final`` checkpoint, step checkpoints, history, metrics.

Layout of ``out``::

    checkpoints/step-N/   guidance checkpoint + trainer_state.{safetensors,json} (resumable)
    final/                the trained guidance (best eval state), training summary inside
    history.csv           loss / train accuracy per step, eval accuracy where evaluated
    metrics.json          task metrics of ``final`` on the eval examples
    summary.json, manifest.json
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.errors import UsageError
from anchorlens.evaluation import DEFAULT_MAX_LENGTH, predict, task_metrics
from anchorlens.models.base import Base
from anchorlens.rundir import examples_digest, manifest
from anchorlens.training import TrainConfig, Trainer, split_train_eval, steps_for_epochs
from anchorlens.training.checkpointing import CHECKPOINTS, latest_checkpoint, save_guidance_atomic, write_text_atomic
from anchorlens.workflows.evaluate import describe, resolve_model
from anchorlens.workflows.inputs import resolve_inputs

DEFAULT_STEPS = 250
PROMPT_NAMES = ("prompt", "soft-prompt", "soft_prompt")
PAPER_PROMPT_LENGTH = 100


@dataclass
class TrainRun:
    """The trained model, its training summary and history, eval metrics and the output dir."""

    guided: Any
    summary: dict[str, Any]
    history: pd.DataFrame
    metrics: dict[str, Any]
    out: Path | None


def with_paper_defaults(spec: str) -> str:
    """Give a bare ``prompt`` part the paper's length (``prompt`` -> ``prompt:n=100``); other parts pass."""
    if Path(spec.strip()).expanduser().is_dir():
        return spec
    parts = []
    for part in spec.split("+"):
        name, colon, opts = part.strip().partition(":")
        names = {o.strip().split("=")[0].strip().lower() for o in opts.split(",") if o.strip()}
        if name.strip().lower() in PROMPT_NAMES and "n" not in names:
            opts = ",".join(filter(None, [f"n={PAPER_PROMPT_LENGTH}", opts.strip()]))
            part = f"{name}:{opts}"
        parts.append(part.strip())
    return "+".join(parts)


def prepare_out(out: Path, resume: bool, force: bool) -> None:
    """Refuse a non-empty ``out`` unless resuming (a training run dir) or ``force`` (moved aside, then removed)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory; choose another --out")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if force:
        old = out.with_name(f".{out.name}.old-{datetime.now().strftime('%H%M%S%f')}")
        out.rename(old)
        shutil.rmtree(old, ignore_errors=True)
        return
    if resume:
        if not (out / CHECKPOINTS).is_dir():
            raise UsageError(f"{out} is not a training run (no {CHECKPOINTS}/); cannot resume from it")
        return
    raise UsageError(f"{out} already exists; pass --resume to continue it, --force to replace it, or choose another --out")


def train(
    method_spec: str = "capsule",
    task: str = "rte",
    data: str | Path | None = None,
    eval_data: str | Path | None = None,
    base: Base | str = "smollm2-135m",
    steps: int | None = None,
    epochs: float | None = None,
    lr: float = 1e-2,
    batch_size: int = 8,
    grad_accum: int = 1,
    optimizer: str = "adamw",
    seed: int = 0,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    eval_every: int = 50,
    patience: int | None = 5,
    *,
    save_every: int | None = None,
    n: int | None = None,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    weight_decay: float = 0.0,
    progress: bool = True,
) -> TrainRun:
    """Train ``method_spec``'s guidance (base frozen) on ``task``; eval on ``eval_data`` or a seeded 10% split.

    ``steps`` wins over ``epochs``; neither means 250 steps. ``out`` None trains in memory only.
    """
    inputs = resolve_inputs(task, data, n)
    if eval_data is not None:
        train_ex, eval_ex = inputs.examples, resolve_inputs(task, eval_data).examples
    else:
        try:
            train_ex, eval_ex = split_train_eval(inputs.examples, inputs.task, 0.1, seed)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if steps is None:
        steps = DEFAULT_STEPS if epochs is None else steps_for_epochs(len(train_ex), batch_size, grad_accum, epochs)
    try:
        config = TrainConfig(steps=steps, lr=lr, batch_size=batch_size, grad_accum=grad_accum, optimizer=optimizer,
                             weight_decay=weight_decay, seed=seed, eval_every=eval_every, patience=patience,
                             save_every=eval_every if save_every is None else save_every, max_length=max_length)
    except ValueError as err:
        raise UsageError(str(err)) from None
    spec = with_paper_defaults(method_spec)
    guided = resolve_model(spec, base, seed=seed)
    out_path = None if out is None else Path(out).expanduser()
    if out_path is not None:
        prepare_out(out_path, resume, force)
    trainer = Trainer(guided, inputs.task, train_ex, eval_ex, config, out=out_path, progress=progress)
    result = trainer.fit(resume=resume and out_path is not None)
    summary = {**result.summary, "method_spec": spec, "data": inputs.source,
               "eval_data": str(eval_data) if eval_data is not None else "split:0.1"}
    history = pd.DataFrame(result.state.history)
    metrics: dict[str, Any] = {}
    if eval_ex:
        preds = predict(result.guided, eval_ex, inputs.task, batch_size=config.eval_batch_size, max_length=max_length)
        metrics = {"task": inputs.task.name, "split": "eval", **task_metrics(preds, inputs.task)}
    if out_path is not None:
        _write_outputs(out_path, result.guided, inputs, summary, history, metrics, train_ex, eval_ex)
    return TrainRun(result.guided, summary, history, metrics, out_path)


def _write_outputs(out: Path, guided: Any, inputs: Any, summary: dict, history: pd.DataFrame, metrics: dict,
                   train_ex: list[dict], eval_ex: list[dict]) -> None:
    """``final/`` (with the summary as ``training``), history.csv, metrics.json, summary.json, manifest.json."""
    import json

    save_guidance_atomic(guided, out / "final", task=inputs.task.name, template=inputs.task.template.spec,
                         training=json.loads(json.dumps(summary, default=str)), overwrite=True)
    write_text_atomic(out / "history.csv", history.to_csv(index=False))
    dump = lambda obj: json.dumps(obj, indent=2, default=str) + "\n"  # noqa: E731
    write_text_atomic(out / "metrics.json", dump(metrics))
    write_text_atomic(out / "summary.json", dump(summary))
    write_text_atomic(out / "manifest.json", dump(manifest(
        job="train", model=describe(guided), task=inputs.task.name, data=inputs.source,
        train_hash=examples_digest(train_ex), eval_hash=examples_digest(eval_ex),
        latest_checkpoint=str(latest_checkpoint(out)),
    )))
