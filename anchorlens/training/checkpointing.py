"""Step checkpoints: ``OUT/checkpoints/step-N`` = guidance checkpoint + ``trainer_state.{safetensors,json}``.

Each step directory is filled in an owner-recorded temp folder and renamed into place
(:func:`anchorlens.atomic.atomic_dir`), so a crash never leaves a half-written ``step-N`` and the
next run removes the killed writer's temp folder; ``latest_checkpoint`` only sees complete ones.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from anchorlens.atomic import atomic_dir, write_json
from anchorlens.methods.checkpoints import load_checkpoint, save_checkpoint
from anchorlens.rundir import CHECKPOINTS
from anchorlens.tensorfile import load_tensors, save_tensors

STATE_TENSORS = "trainer_state.safetensors"
STATE_JSON = "trainer_state.json"
_STEP = re.compile(r"^step-(\d+)$")


def step_dir(out: Path, step: int) -> Path:
    """``OUT/checkpoints/step-N`` (N zero-padded to 6 digits)."""
    return out / CHECKPOINTS / f"step-{step:06d}"


def _checkpoint_into(folder: Path, guided: Any, meta: dict[str, Any]) -> None:
    """``save_checkpoint`` into the existing temp ``folder`` (it writes a new dir, whose files move up)."""
    inner = save_checkpoint(guided, folder / "ckpt", **meta)
    for child in inner.iterdir():
        child.rename(folder / child.name)
    inner.rmdir()


def save_guidance_atomic(guided: Any, path: Path, **meta: Any) -> Path:
    """Write a guidance checkpoint to ``path`` atomically (an existing one there is replaced)."""
    with atomic_dir(path, replace=True) as tmp:
        _checkpoint_into(tmp, guided, meta)
    return path


def write_step(
    out: Path, step: int, guided: Any, tensors: dict[str, torch.Tensor], facts: dict, meta: dict[str, Any]
) -> Path:
    """Write ``step-N`` atomically: guidance checkpoint (``meta`` -> save_checkpoint) plus trainer state."""
    final = step_dir(out, step)
    with atomic_dir(final, replace=True) as tmp:
        _checkpoint_into(tmp, guided, meta)
        save_tensors(
            {k: v.detach().cpu().contiguous() for k, v in tensors.items()},
            tmp / STATE_TENSORS,
            metadata={"format": "anchorlens-trainer"},
        )
        write_json(tmp / STATE_JSON, facts)
    return final


def step_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete step checkpoints under ``out``, oldest first."""
    root = out / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP.match(child.name)
        if m and (child / STATE_JSON).is_file() and (child / STATE_TENSORS).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete ``step-N`` under ``out``, or None."""
    found = step_checkpoints(out)
    return found[-1][1] if found else None


def read_step(path: Path, base: Any) -> tuple[Any, dict[str, torch.Tensor], dict]:
    """(guided model, state tensors, state facts) of a step checkpoint."""
    guided = load_checkpoint(path, base=base)
    tensors = load_tensors(path / STATE_TENSORS, "trainer state")
    facts = read_state_facts(path)
    return guided, tensors, facts


def read_state_facts(path: Path) -> dict:
    """The recorded facts (``trainer_state.json``) of a step checkpoint, without loading its tensors."""
    return json.loads((path / STATE_JSON).read_text())


def prune(out: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints."""
    found = step_checkpoints(out)
    for _, path in found[: max(0, len(found) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
