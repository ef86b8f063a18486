"""Read and write safetensors files with one-line errors: missing, truncated or corrupted files, a full disk."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

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


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` as a safetensors file; a failed write (full disk, file size limit) raises the OSError it is.

    safetensors reports I/O failures as ``SafetensorError("... I/O error: ... (os error N)")``; as an OSError the
    callers' :func:`~anchorlens.atomic.os_errors` turns it into the one line naming the file.
    """
    path = Path(path)
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as err:
        found = re.search(r"os error (\d+)", str(err))
        if "I/O error" not in str(err) and found is None:
            raise
        code = int(found.group(1)) if found else errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from None
    return path


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
