"""Read safetensors files with one-line errors for missing, truncated or corrupted files (never pickle)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from anchorlens.errors import CheckpointError, UsageError


def load_tensors(path: str | Path, what: str = "tensor file") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; UsageError naming the file when it is absent or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{what} {path} is missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UsageError(f"{what} {path} is truncated or corrupted ({reason}); restore or re-create it") from None


def check_float_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """CheckpointError naming the tensor unless every tensor is floating point (never cast) and finite."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise CheckpointError(
                f"{path}: tensor {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}; guidance tensors must be floating point"
            )
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{path}: tensor {name!r} holds {bad} NaN/Inf values; re-create the file from a healthy run"
            )
