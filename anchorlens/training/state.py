"""The trainer's resumable state: counters, early-stopping record, history and RNG states."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class TrainerState:
    """Everything besides tensors that a resumed run needs to continue exactly.

    step: optimizer steps done; best_accuracy/best_step: best eval so far (-1 / 0 before any);
    bad_evals: evals since the best (early stopping); history: one dict per step or eval;
    wall_time: seconds spent in earlier sessions; stopped: early stopping fired.
    """

    step: int = 0
    best_accuracy: float = -1.0
    best_step: int = 0
    bad_evals: int = 0
    stopped: bool = False
    wall_time: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-able copy."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainerState:
        """Rebuild from ``to_json``."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def record_eval(self, accuracy: float, patience: int | None) -> bool:
        """Update the best accuracy and patience count; True when ``accuracy`` is a new best."""
        if accuracy > self.best_accuracy:
            self.best_accuracy, self.best_step, self.bad_evals = accuracy, self.step, 0
            return True
        self.bad_evals += 1
        if patience is not None and self.bad_evals >= patience:
            self.stopped = True
        return False


def rng_state() -> dict[str, torch.Tensor]:
    """The global torch (and CUDA) RNG states as tensors."""
    out = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["rng.cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return out


def set_rng_state(tensors: dict[str, torch.Tensor]) -> None:
    """Restore states written by ``rng_state`` (CUDA only when saved and available)."""
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["rng.cuda"]))
