"""Training hyper-parameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from anchorlens.evaluation.batches import DEFAULT_MAX_LENGTH

# the one default learning rate (the README's reproduction used it); the CLI and workflows import it
DEFAULT_LR = 3e-3

# the settings a resumed run must share with the run it continues
RESUME_KEYS = (
    "lr",
    "batch_size",
    "grad_accum",
    "optimizer",
    "weight_decay",
    "seed",
    "max_length",
    "max_grad_norm",
    "group_by_length",
)


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer steps and settings of one training run.

    steps: optimizer steps (each ``grad_accum`` micro-batches of ``batch_size``); eval_every /
    save_every: steps between evaluations / checkpoints (0 = only at the end); patience: evals
    without a new best accuracy before stopping (None = never); keep_checkpoints: step
    checkpoints kept on disk; group_by_length: batch examples of similar token length (less padding).
    """

    steps: int
    lr: float = DEFAULT_LR
    batch_size: int = 8
    grad_accum: int = 1
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    seed: int = 0
    eval_every: int = 50
    patience: int | None = 5
    save_every: int = 50
    keep_checkpoints: int = 2
    max_length: int | None = DEFAULT_MAX_LENGTH
    eval_batch_size: int = 16
    max_grad_norm: float | None = 1.0
    keep_best: bool = True
    group_by_length: bool = False

    def __post_init__(self) -> None:
        """Reject impossible values early."""
        if self.steps < 1 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError(
                f"steps, batch_size and grad_accum must be >= 1; got {self.steps}, {self.batch_size}, {self.grad_accum}"
            )
        if self.lr <= 0:
            raise ValueError(f"lr must be positive; got {self.lr}")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be >= 1 or None; got {self.patience}")

    def to_json(self) -> dict:
        """JSON-able copy."""
        return asdict(self)

    def resume_mismatch(self, saved: dict) -> list[str]:
        """Settings that differ from a saved run's (``name: saved -> now``)."""
        now = self.to_json()
        defaults = {f.name: f.default for f in fields(self)}  # a key a run saved before it existed had its default
        return [
            f"{k}: {saved.get(k, defaults[k])!r} -> {now[k]!r}"
            for k in RESUME_KEYS
            if saved.get(k, defaults[k]) != now[k]
        ]
