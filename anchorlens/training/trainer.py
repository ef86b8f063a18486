"""The training loop: guidance parameters only, classification loss over verbalizer scores, resumable."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from anchorlens.capture.collect import PromptRenderer
from anchorlens.errors import UsageError
from anchorlens.evaluation.batches import scoring_batch
from anchorlens.evaluation.model import model_device
from anchorlens.evaluation.predict import predict
from anchorlens.evaluation.scoring import label_scores, resolve_scoring
from anchorlens.evaluation.verbalizers import Verbalizers, verbalizer_ids
from anchorlens.tasks import Task, get_task
from anchorlens.training import checkpointing as ckpt
from anchorlens.training.config import TrainConfig
from anchorlens.training.data import BatchOrder
from anchorlens.training.guards import assert_base_has_no_grad, trainable_guidance
from anchorlens.training.losses import classification_loss
from anchorlens.training.optim import load_optimizer_state, make_optimizer, optimizer_state
from anchorlens.training.resources import peak_cuda_mb, peak_rss_mb
from anchorlens.training.state import TrainerState, rng_state, set_rng_state

StepCallback = Callable[[TrainerState], None]


def resume_mismatch(
    facts: Mapping[str, Any], config: TrainConfig, method: Any, inputs: Mapping[str, Any] | None = None
) -> list[str]:
    """What differs between a step checkpoint's recorded facts (its ``trainer_state.json``) and this run: the
    settings (``name: saved -> now``), the method, and the inputs that shape the tokens (by ``run_key``; the names of
    the facts that differ). A checkpoint written before inputs were recorded is compared on its settings only."""
    diff = config.resume_mismatch(facts["config"])
    if facts.get("method") != method:
        diff.append(f"method: {facts.get('method')} -> {method}")
    stored = facts.get("inputs")
    if inputs is not None and isinstance(stored, Mapping) and stored.get("run_key") != inputs.get("run_key"):
        names = sorted(k for k in {*stored, *inputs} - {"run_key"} if stored.get(k) != inputs.get(k))
        diff.append(f"inputs: {', '.join(names) or 'run_key'} (the training tokens would differ)")
    return diff


def check_resumable(
    path: Path, facts: Mapping[str, Any], config: TrainConfig, method: Any, inputs: Mapping[str, Any] | None = None
) -> None:
    """UsageError (one line) when the step checkpoint ``path`` (its recorded ``facts``) cannot be resumed by this
    run (:func:`resume_mismatch`)."""
    diff = resume_mismatch(facts, config, method, inputs)
    if diff:
        raise UsageError(
            f"cannot resume {path}: settings changed ({'; '.join(diff)}); use the same settings or --force"
        )


@dataclass
class TrainResult:
    """The trained model (best eval state restored when ``keep_best``), the state and a summary."""

    guided: Any
    state: TrainerState
    summary: dict[str, Any]
    predictions: pd.DataFrame | None = None  # eval predictions of ``guided`` as returned (scored once, not again)


class Trainer:
    """Trains a GuidedModel's guidance on a task; see ``fit``."""

    def __init__(
        self,
        guided: Any,
        task: str | Task,
        train_examples: Sequence[dict],
        eval_examples: Sequence[dict] | None,
        config: TrainConfig,
        out: str | Path | None = None,
        progress: bool = True,
        checkpoint_meta: dict[str, Any] | None = None,
        prompts: PromptRenderer | None = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> None:
        """Prepare optimizer and data order (seeds torch's global RNG); ``out`` (optional) receives ``checkpoints/step-N``;
        ``prompts`` renders examples (chat template, demonstrations; default the task's template).

        ``inputs``: what shapes the training tokens (the chat template, prompt options, task file, few-shot draw,
        data digests) with its ``run_key``, as the train workflow records it: kept in every step checkpoint, and a
        resume whose ``run_key`` differs is refused (:func:`resume_mismatch`)."""
        self.guided, self.task, self.config = guided, get_task(task), config
        self.prompts = prompts
        self.inputs = None if inputs is None else json.loads(json.dumps(dict(inputs), default=str))
        self.train_examples = list(train_examples)
        self.eval_examples = list(eval_examples or [])
        if not self.train_examples:
            raise UsageError("no training examples")
        if any(ex.get("label") is None for ex in self.train_examples):
            raise UsageError("training examples must all be labelled")
        self.out = None if out is None else Path(out)
        self.progress = progress
        self.meta = {"task": self.task.name, "template": self.task.template.spec, **(checkpoint_meta or {})}
        self.params = trainable_guidance(guided)
        scoring = resolve_scoring("auto", [guided], guided.base.tokenizer, self.task)  # as evaluate scores it
        self.verbalizers: Verbalizers = verbalizer_ids(guided.base.tokenizer, self.task, scoring)
        self.device = model_device(guided)
        self.optimizer = make_optimizer(config.optimizer, self.params, config.lr, config.weight_decay)
        lengths = self._token_lengths() if config.group_by_length else None
        self.order = BatchOrder(len(self.train_examples), config.batch_size, seed=config.seed, lengths=lengths)
        self.state = TrainerState()
        self.best: dict[str, torch.Tensor] | None = None
        self.best_predictions: pd.DataFrame | None = None  # eval predictions of the best state
        self.last_predictions: pd.DataFrame | None = None  # eval predictions of the latest evaluation
        self.train_time = 0.0
        torch.manual_seed(config.seed)

    def _token_lengths(self, chunk: int = 256) -> list[int]:
        """Tokens per training example as the model sees them (rendered, truncated at ``max_length``)."""
        renderer: PromptRenderer = self.task.template if self.prompts is None else self.prompts
        lengths: list[int] = []
        for start in range(0, len(self.train_examples), chunk):
            rendered = [renderer.render(ex) for ex in self.train_examples[start : start + chunk]]
            encoded = self.guided.base.encode(rendered, max_length=self.config.max_length, scheme=renderer.scheme)
            lengths.extend(encoded.attention_mask.sum(1).tolist())
        return lengths

    # ------------------------------------------------------------------ one step
    def _micro_batch(self) -> tuple[torch.Tensor, int, int]:
        """Forward+backward one micro-batch; (summed loss, correct, size)."""
        idx = self.order.next_batch()
        part = [self.train_examples[i] for i in idx]
        batch = scoring_batch(
            self.guided.base,
            self.task,
            part,
            self.verbalizers,
            example_ids=idx,
            max_length=self.config.max_length,
            prompts=self.prompts,
        ).to(self.device)
        scores = label_scores(self.guided, batch, self.verbalizers)
        loss = classification_loss(scores, batch.labels)
        (loss / self.config.grad_accum).backward()  # mean of micro-batch means
        correct = int((scores.argmax(-1) == batch.labels).sum())
        return loss.detach() * len(idx), correct, len(idx)

    def step(self) -> dict[str, float]:
        """One optimizer step over ``grad_accum`` micro-batches; returns loss and train accuracy."""
        self.optimizer.zero_grad(set_to_none=True)
        total, correct, seen = torch.zeros(()), 0, 0
        for _ in range(self.config.grad_accum):
            loss, c, n = self._micro_batch()
            total, correct, seen = total + loss.cpu(), correct + c, seen + n
        assert_base_has_no_grad(self.guided)
        if self.config.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        self.optimizer.step()
        self.state.step += 1
        return {"loss": float(total) / seen, "train_accuracy": correct / seen}

    # ------------------------------------------------------------------ evaluation / early stopping
    def evaluate(self, progress: bool = False) -> float:
        """Accuracy on the eval examples (NaN without any); the predictions are kept in ``last_predictions``."""
        if not self.eval_examples:
            return float("nan")
        self.guided.eval()
        try:
            preds = predict(
                self.guided,
                self.eval_examples,
                self.task,
                batch_size=self.config.eval_batch_size,
                max_length=self.config.max_length,
                progress=progress,
                prompts=self.prompts,
            )
        finally:
            self.guided.train()
        self.last_predictions = preds
        return float(preds["correct"].astype(bool).mean())

    def _maybe_evaluate(self, final: bool) -> float | None:
        """Evaluate when due; update the best state and early stopping."""
        every = self.config.eval_every
        due = final or (every > 0 and self.state.step % every == 0)
        if not due or not self.eval_examples:
            return None
        acc = self.evaluate(progress=final and self.progress)
        if self.state.history and self.state.history[-1].get("step") == self.state.step:
            self.state.history[-1]["eval_accuracy"] = acc
        if self.state.record_eval(acc, self.config.patience):
            self.best = {k: v.clone() for k, v in self.guided.guidance_state_dict().items()}  # a snapshot, not a view
            self.best_predictions = self.last_predictions
        return acc

    # ------------------------------------------------------------------ checkpoints
    def _state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        """All tensors and JSON facts of the resumable state."""
        opt_t, opt_f = optimizer_state(self.optimizer)
        order_t, order_f = self.order.state()
        tensors = {**opt_t, **order_t, **rng_state()}
        if self.best is not None:
            tensors.update({f"best.{k}": v for k, v in self.best.items()})
        self.state.wall_time = self._wall()
        facts = {
            "state": self.state.to_json(),
            "optimizer": opt_f,
            "order": order_f,
            "config": self.config.to_json(),
            "train_time": self.train_time,
            "method": self.guided.config()["methods"],
            **({"inputs": self.inputs} if self.inputs is not None else {}),
        }
        return tensors, facts

    def save(self) -> Path | None:
        """Write ``OUT/checkpoints/step-N`` (when ``out`` is set) and prune old ones."""
        if self.out is None:
            return None
        tensors, facts = self._state_tensors()
        path = ckpt.write_step(self.out, self.state.step, self.guided, tensors, facts, dict(self.meta))
        ckpt.prune(self.out, self.config.keep_checkpoints)
        return path

    def resume(self) -> bool:
        """Continue from the newest step checkpoint under ``out``; False when there is none."""
        if self.out is None:
            return False
        path = ckpt.latest_checkpoint(self.out)
        if path is None:
            return False
        saved, tensors, facts = ckpt.read_step(path, self.guided.base)
        check_resumable(path, facts, self.config, self.guided.config()["methods"], self.inputs)
        with torch.no_grad():
            self.guided.load_guidance_state_dict(saved.guidance_state_dict())
        load_optimizer_state(self.optimizer, tensors, facts["optimizer"])
        self.order.load_state(tensors, facts["order"])
        set_rng_state(tensors)
        best = {k[len("best.") :]: v for k, v in tensors.items() if k.startswith("best.")}
        self.best = best or None
        self.state = TrainerState.from_json(facts["state"])
        self.train_time = float(facts.get("train_time", 0.0))
        return True

    # ------------------------------------------------------------------ loop
    def _wall(self) -> float:
        """Wall seconds including earlier sessions."""
        return self._wall_before + (time.perf_counter() - self._session_start)

    def fit(self, resume: bool = False, on_step: StepCallback | None = None) -> TrainResult:
        """Train to ``config.steps`` (or early stop); ``resume`` continues from the latest checkpoint in ``out``."""
        from tqdm.auto import tqdm

        if resume:
            self.resume()
        self._session_start, self._wall_before = time.perf_counter(), self.state.wall_time
        steps = self.config.steps
        self.guided.train()
        bar = tqdm(
            total=steps,
            initial=self.state.step,
            disable=not self.progress,
            desc=f"train {self.task.name}",
            unit="step",
            dynamic_ncols=True,
        )
        try:
            while self.state.step < steps and not self.state.stopped:
                t0 = time.perf_counter()
                record = self.step()
                self.train_time += time.perf_counter() - t0
                self.state.history.append({"step": self.state.step, **record, "epoch": self.order.epochs_done})
                final = self.state.step >= steps
                acc = self._maybe_evaluate(final)
                every = self.config.save_every
                if final or self.state.stopped or (every > 0 and self.state.step % every == 0):
                    self.save()
                bar.update(1)
                bar.set_postfix(
                    loss=f"{record['loss']:.3f}",
                    acc=f"{record['train_accuracy']:.2f}",
                    **({"eval": f"{acc:.3f}"} if acc is not None else {}),
                )
                if on_step is not None:
                    on_step(self.state)
        finally:
            bar.close()
        predictions = self.last_predictions
        if self.config.keep_best and self.best is not None:
            with torch.no_grad():
                self.guided.load_guidance_state_dict(self.best)
            predictions = self.best_predictions
        self.guided.eval()
        self.state.wall_time = self._wall()
        return TrainResult(self.guided, self.state, self.summary(), predictions)

    def summary(self) -> dict[str, Any]:
        """Steps, epochs, wall time, time per step, peak memory, best eval accuracy and parameter counts."""
        steps = self.state.step
        return {
            "steps": steps,
            "epochs": round(self.order.epochs_done, 4),
            "stopped_early": self.state.stopped,
            "wall_time_s": round(self.state.wall_time, 3),
            "time_per_step_s": round(self.train_time / steps, 5) if steps else None,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "peak_cuda_mb": peak_cuda_mb(),
            "best_eval_accuracy": None if self.state.best_accuracy < 0 else self.state.best_accuracy,
            "best_step": self.state.best_step if self.state.best_accuracy >= 0 else None,
            "final_loss": self.state.history[-1]["loss"] if self.state.history else None,
            "num_trainable": self.guided.num_trainable(),
            "share_of_base": self.guided.share_of_base(),
            "num_train": len(self.train_examples),
            "num_eval": len(self.eval_examples),
            "config": self.config.to_json(),
        }
