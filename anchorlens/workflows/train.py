"""Train a guidance method on a task: ``OUT/final`` checkpoint, step checkpoints, history, metrics.

Layout of ``out``::

    checkpoints/step-N/   guidance checkpoint + trainer_state.{safetensors,json} (resumable)
    final/                the trained guidance (best eval state), training summary inside
    history.csv           loss / train accuracy per step, eval accuracy where evaluated
    metrics.json          task metrics of ``final`` on the eval examples
    summary.json, manifest.json

What shapes the training tokens (the chat template's text, source and arguments, the prompt options: chat, system
prompt, shots; the task file, the few-shot draw and the data) is hashed into a run key (:func:`train_identity`, the
facts capture's resume key hashes), recorded in every step checkpoint, ``final/anchorlens.json`` and the manifest. A
resume whose key differs is refused in one line naming what changed, before anything in OUT is written.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.atomic import write_json, write_text
from anchorlens.errors import UsageError
from anchorlens.evaluation import DEFAULT_MAX_LENGTH, predict, task_metrics
from anchorlens.methods.spec import load_guided
from anchorlens.models.base import Base
from anchorlens.rundir import OutClaim, claimed, examples_digest, manifest
from anchorlens.tasks.prompts import PromptOptions, build_prompts
from anchorlens.training import DEFAULT_LR, TrainConfig, Trainer, split_train_eval, steps_for_epochs
from anchorlens.training.checkpointing import latest_checkpoint, read_state_facts, save_guidance_atomic
from anchorlens.training.trainer import check_resumable
from anchorlens.workflows.capture_run import describe_changes, facts_key, token_facts
from anchorlens.workflows.inputs import Inputs, resolve_inputs

DEFAULT_STEPS = 250


@dataclass
class TrainRun:
    """The trained model, its training summary and history, eval metrics and the output dir."""

    guided: Any
    summary: dict[str, Any]
    history: pd.DataFrame
    metrics: dict[str, Any]
    out: Path | None


def train(
    method_spec: str = "capsule",
    task: str = "rte",
    data: str | Path | None = None,
    eval_data: str | Path | None = None,
    base: Base | str = "smollm2-135m",
    steps: int | None = None,
    epochs: float | None = None,
    lr: float = DEFAULT_LR,
    batch_size: int = 8,
    grad_accum: int = 1,
    optimizer: str = "adamw",
    seed: int = 0,
    out: str | Path | OutClaim | None = None,
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
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    group_by_length: bool = False,
) -> TrainRun:
    """Train ``method_spec``'s guidance (base frozen) on ``task``; eval on ``eval_data`` or a seeded 10% split.

    ``group_by_length``: batch training examples of similar token length (far less padding; same epochs).
    ``field_map``/``prompt``: column renames and prompt options (chat, system prompt, few-shot: demonstrations
    are drawn from the training examples unless ``prompt.shots_from`` names a file).

    ``steps`` wins over ``epochs``; neither means 250 steps. ``out`` None trains in memory only; a path
    (or the command's :class:`~anchorlens.rundir.OutClaim`) is claimed before anything is computed:
    ``resume`` continues the training run there, ``force`` replaces an anchorlens run there.
    """
    run = functools.partial(
        _train,
        method_spec,
        task,
        data,
        eval_data,
        base,
        steps,
        epochs,
        lr,
        batch_size,
        grad_accum,
        optimizer,
        seed,
        eval_every=eval_every,
        patience=patience,
        save_every=save_every,
        n=n,
        max_length=max_length,
        weight_decay=weight_decay,
        progress=progress,
        field_map=field_map,
        prompt=prompt,
        group_by_length=group_by_length,
    )
    if out is None:
        return run(None, False)
    with claimed(out, kind="train", force=force, resume=resume) as claim:
        try:
            return run(claim, resume)
        except BaseException:
            claim.discard_if_empty()  # stopped before its first checkpoint: no OUT left behind
            raise


def _train(
    method_spec: str,
    task: str,
    data: str | Path | None,
    eval_data: str | Path | None,
    base: Base | str,
    steps: int | None,
    epochs: float | None,
    lr: float,
    batch_size: int,
    grad_accum: int,
    optimizer: str,
    seed: int,
    claim: OutClaim | None,
    resume: bool,
    eval_every: int,
    patience: int | None,
    save_every: int | None,
    n: int | None,
    max_length: int | None,
    weight_decay: float,
    progress: bool,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    group_by_length: bool = False,
) -> TrainRun:
    """:func:`train` with ``out`` already claimed (or None)."""
    inputs = resolve_inputs(task, data, n, need_labels=True, field_map=field_map, prompt=prompt)
    if eval_data is not None:
        held = resolve_inputs(task, eval_data, need_labels=True, field_map=field_map, prompt=prompt)
        train_ex, eval_ex = list(inputs.examples), list(held.examples)
    else:
        try:
            train_ex, eval_ex = split_train_eval(inputs.examples, inputs.task, 0.1, seed)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if steps is None:
        steps = DEFAULT_STEPS if epochs is None else steps_for_epochs(len(train_ex), batch_size, grad_accum, epochs)
    try:
        config = TrainConfig(
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            grad_accum=grad_accum,
            optimizer=optimizer,
            weight_decay=weight_decay,
            seed=seed,
            eval_every=eval_every,
            patience=patience,
            save_every=eval_every if save_every is None else save_every,
            max_length=max_length,
            group_by_length=group_by_length,
        )
    except ValueError as err:
        raise UsageError(str(err)) from None
    spec = method_spec
    guided = load_guided(spec, base, seed=seed)
    prompts = build_prompts(
        inputs.task,
        guided.base.tokenizer,
        inputs.prompt,
        queries=train_ex,
        pool=inputs.pool,
        pool_source=inputs.pool_source,
        queries_source=inputs.source,
    )
    identity = train_identity(inputs, prompts, eval_ex)
    if claim is not None and resume:
        check_resume(claim.path, config, guided, identity)  # before anything in OUT is written
    out_path = None if claim is None else claim.start_in_place()
    trainer = Trainer(
        guided,
        inputs.task,
        train_ex,
        eval_ex,
        config,
        out=out_path,
        progress=progress,
        prompts=prompts,
        inputs=identity,
    )
    result = trainer.fit(resume=resume and out_path is not None)
    summary = {
        **result.summary,
        "method_spec": spec,
        "data": inputs.source,
        "eval_data": str(eval_data) if eval_data is not None else "split:0.1",
    }
    history = pd.DataFrame(result.state.history)
    metrics: dict[str, Any] = {}
    if eval_ex:
        preds = result.predictions  # scored once, inside the trainer's final evaluation
        if preds is None:  # resumed at the last step: nothing was evaluated in this session
            preds = predict(
                result.guided,
                eval_ex,
                inputs.task,
                batch_size=config.eval_batch_size,
                max_length=max_length,
                progress=progress,
                prompts=prompts,
            )
        metrics = {"task": inputs.task.name, "split": "eval", **task_metrics(preds, inputs.task)}
    if claim is not None:
        _write_outputs(
            claim, result.guided, inputs, summary, history, metrics, train_ex, eval_ex, seed, prompts, identity
        )
    return TrainRun(result.guided, summary, history, metrics, out_path)


def train_identity(inputs: Inputs, prompts: Any, eval_ex: list[dict]) -> dict[str, Any]:
    """What shapes a training run's tokens, with its ``run_key`` (SHA-256 of the rest, first 16 hex): the task file
    (source and sha256), the prompt options (chat, system prompt, shots, template name and arguments), the chat
    template (text sha256, source, arguments: :meth:`~anchorlens.tasks.prompts.Prompts.chat_template`), the few-shot
    draw (:meth:`~anchorlens.tasks.prompts.Prompts.demonstrations`) and the data and eval digests; the facts and
    names :func:`~anchorlens.workflows.capture_run.run_identity` hashes for a capture."""
    facts = {**token_facts(inputs, prompts), "eval_digest": examples_digest(eval_ex)}
    facts = json.loads(json.dumps(facts, sort_keys=True, default=str))  # the form a checkpoint records it in
    return {**facts, "run_key": facts_key(facts)}


def check_resume(out: Path, config: TrainConfig, guided: Any, identity: dict[str, Any]) -> None:
    """Refuse (UsageError, one line) to resume ``out``'s latest step checkpoint when what shapes the training tokens
    changed (naming what: :func:`~anchorlens.workflows.capture_run.describe_changes`) or the settings did; nothing
    is read but its ``trainer_state.json`` and nothing is written. A checkpoint from before inputs were recorded is
    checked on its settings only."""
    path = latest_checkpoint(out)
    if path is None:
        return
    facts = read_state_facts(path)
    stored = facts.get("inputs")
    if isinstance(stored, dict) and stored.get("run_key") != identity["run_key"]:
        raise UsageError(
            f"cannot resume {path}: the training tokens would differ ({describe_changes(stored, identity)}); "
            "rerun the original command to resume it, or pass --force to start over"
        )
    check_resumable(path, facts, config, guided.config()["methods"])


def _write_outputs(
    claim: OutClaim,
    guided: Any,
    inputs: Any,
    summary: dict,
    history: pd.DataFrame,
    metrics: dict,
    train_ex: list[dict],
    eval_ex: list[dict],
    seed: int,
    prompts: Any,
    identity: dict[str, Any],
) -> None:
    """``final/`` (with the summary and what shaped its tokens as ``training``), history.csv, metrics.json,
    summary.json, then manifest.json (the chat template, prompt options, task file and few-shot draw, and the run
    key that hashes them)."""
    out = claim.path
    save_guidance_atomic(
        guided,
        out / "final",
        task=inputs.task.name,
        template=inputs.task.template.spec,
        training=json.loads(json.dumps({**summary, "inputs": identity}, default=str)),
    )
    write_text(out / "history.csv", history.to_csv(index=False))
    write_json(out / "metrics.json", metrics)
    write_json(out / "summary.json", summary)
    claim.finish_in_place(
        manifest(
            "train",
            base_model=guided.base,
            data_digest=examples_digest(train_ex),
            seed=seed,
            model=guided.config(),
            task=inputs.task.name,
            data=inputs.source,
            **inputs.facts(prompts),
            roles=prompts.roles.to_json(),
            eval_digest=examples_digest(eval_ex),
            run_key=identity["run_key"],
            latest_checkpoint=str(latest_checkpoint(out)),
        )
    )
