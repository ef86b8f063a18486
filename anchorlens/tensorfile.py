"""Read safetensors files with one-line errors for missing, truncated or corrupted files (never pickle)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from anchorlens.errors import UsageError


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
