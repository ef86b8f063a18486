"""Training guidance parameters (base frozen) with resumable, pickle-free checkpoints."""

from __future__ import annotations

from anchorlens.training.checkpointing import latest_checkpoint, step_checkpoints, step_dir
from anchorlens.training.config import DEFAULT_LR, TrainConfig
from anchorlens.training.data import BatchOrder, split_train_eval, steps_for_epochs
from anchorlens.training.losses import classification_loss, dataset_loss
from anchorlens.training.optim import OPTIMIZERS, load_optimizer_state, make_optimizer, optimizer_state
from anchorlens.training.state import TrainerState
from anchorlens.training.trainer import Trainer, TrainResult

__all__ = [
    "DEFAULT_LR",
    "OPTIMIZERS",
    "BatchOrder",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerState",
    "classification_loss",
    "dataset_loss",
    "latest_checkpoint",
    "load_optimizer_state",
    "make_optimizer",
    "optimizer_state",
    "split_train_eval",
    "step_checkpoints",
    "step_dir",
    "steps_for_epochs",
]
