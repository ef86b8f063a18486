"""Trained checkpoints shipped inside the package, addressed as ``NAME@TASK`` (``capsule@sst2``).

Each is an ordinary checkpoint directory (``anchorlens.json`` + ``guidance.safetensors``) under
``anchorlens/methods/trained/<task>/<name>/``; a spec names it wherever a checkpoint directory is accepted
(``--ckpt capsule@sst2``, ``--ckpt capsule@sst2+instance``, ``load_guided("prompt@sst2")``). Its
``anchorlens.json`` ``training`` block records what a reader needs to trust it: the command that trained it,
the anchorlens commit, the digest of the training examples, steps, seed, time per step and the accuracy on
the task's validation set (``training.validation``). ``anchorlens checkpoints`` lists them.

A directory that exists under the same text wins (a path is never shadowed), as for every spec part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from anchorlens.errors import UsageError
from anchorlens.methods.checkpoints import META_FILE, read_meta

SHIPPED_NAME = re.compile(r"(?P<name>[a-z][a-z0-9-]*)@(?P<task>[a-z][a-z0-9_-]*)")  # NAME@TASK, no slash
_FOLDER = "trained"


@dataclass(frozen=True)
class ShippedCheckpoint:
    """One shipped checkpoint: its address ``name@task``, directory and validated ``anchorlens.json``."""

    name: str
    task: str
    path: Path
    meta: dict[str, Any]

    @property
    def address(self) -> str:
        """``name@task``, as a spec writes it."""
        return f"{self.name}@{self.task}"

    @property
    def training(self) -> dict[str, Any]:
        """The ``training`` block (command, commit, data digest, steps, seed, validation ...)."""
        return dict(self.meta.get("training") or {})


def shipped_root() -> Path:
    """The folder holding ``<task>/<name>/`` checkpoint directories (inside the installed package)."""
    root = resources.files("anchorlens.methods").joinpath(_FOLDER)
    return Path(str(root))


def list_checkpoints() -> list[ShippedCheckpoint]:
    """Every shipped checkpoint, sorted by task then name."""
    root = shipped_root()
    if not root.is_dir():
        return []
    found = []
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for ckpt_dir in sorted(p for p in task_dir.iterdir() if (p / META_FILE).is_file()):
            found.append(ShippedCheckpoint(ckpt_dir.name, task_dir.name, ckpt_dir, read_meta(ckpt_dir)))
    return found


def is_shipped_name(text: str) -> bool:
    """True when ``text`` has the ``NAME@TASK`` shape (whether or not such a checkpoint ships)."""
    return SHIPPED_NAME.fullmatch(text.strip()) is not None


def shipped_checkpoint(text: str) -> ShippedCheckpoint:
    """The shipped checkpoint ``text`` (``NAME@TASK``) names; UsageError listing the shipped ones otherwise."""
    match = SHIPPED_NAME.fullmatch(text.strip().lower())
    found = list_checkpoints()
    if match is not None:
        for ckpt in found:
            if (ckpt.name, ckpt.task) == (match["name"], match["task"]):
                return ckpt
    names = ", ".join(c.address for c in found) or "none"
    raise UsageError(
        f"no shipped checkpoint {text.strip()!r} (NAME@TASK); shipped: {names} (`anchorlens checkpoints` lists them)"
    )
