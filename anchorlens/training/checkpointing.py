"""Step checkpoints: ``OUT/checkpoints/step-N`` = guidance checkpoint + ``trainer_state.{safetensors,json}``.

Each step directory is filled under a temporary name and renamed into place, so a crash never
leaves a half-written ``step-N``; ``latest_checkpoint`` only sees complete ones.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from anchorlens.methods.checkpoints import load_checkpoint, save_checkpoint
from anchorlens.tensorfile import load_tensors

STATE_TENSORS = "trainer_state.safetensors"
STATE_JSON = "trainer_state.json"
CHECKPOINTS = "checkpoints"
_STEP = re.compile(r"^step-(\d+)$")


def step_dir(out: Path, step: int) -> Path:
    """``OUT/checkpoints/step-N`` (N zero-padded to 6 digits)."""
    return out / CHECKPOINTS / f"step-{step:06d}"


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to a temp sibling and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def save_guidance_atomic(guided: Any, path: Path, **meta: Any) -> Path:
    """``save_checkpoint`` into a temp sibling, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_checkpoint(guided, tmp / "ckpt", **meta)
        _replace_dir(tmp / "ckpt", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, moving an existing ``dst`` aside first and deleting it after."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old")
        if old.exists():
            shutil.rmtree(old)
        dst.rename(old)
    src.rename(dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_step(
    out: Path, step: int, guided: Any, tensors: dict[str, torch.Tensor], facts: dict, meta: dict[str, Any]
) -> Path:
    """Write ``step-N`` atomically: guidance checkpoint (``meta`` -> save_checkpoint) plus trainer state."""
    final = step_dir(out, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        ckpt = save_checkpoint(guided, tmp / "ckpt", **meta)
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(ckpt / STATE_TENSORS),
                  metadata={"format": "anchorlens-trainer"})
        (ckpt / STATE_JSON).write_text(json.dumps(facts, indent=1) + "\n")
        _replace_dir(ckpt, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
    facts = json.loads((path / STATE_JSON).read_text())
    return guided, tensors, facts


def prune(out: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints."""
    found = step_checkpoints(out)
    for _, path in found[: max(0, len(found) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
