"""Resource readings for training summaries: peak memory."""

from __future__ import annotations

import resource
import sys

import torch


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB (``ru_maxrss``; kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def peak_cuda_mb(device: torch.device | str | None = None) -> float | None:
    """Peak allocated CUDA memory in MiB since the last reset, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device) / (1024 * 1024)
