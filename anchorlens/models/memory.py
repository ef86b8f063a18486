"""Memory a base needs (sized from its config on empty weights) against what the target device has free."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from anchorlens.errors import UsageError

GIB = 1024**3
HEADROOM = 1.1  # loading and the first forward need a little beyond the weights themselves

Availability = Callable[[str | None], int | None]


def _int_file(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cpu_available_bytes() -> int:
    """RAM this process can still use: MemAvailable, bounded by a cgroup v2 limit when there is one."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        available = None
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit, used = _int_file("/sys/fs/cgroup/memory.max"), _int_file("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        available = min(available, max(limit - used, 0))
    return available


def available_bytes(device: str | None) -> int | None:
    """Free memory of ``device`` (None/cpu: RAM; cuda[:N]: that GPU; auto: all GPUs plus RAM); None if unknown."""
    if device is None or device == "cpu":
        return cpu_available_bytes()
    if device == "auto":
        gpus = (
            sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
            if torch.cuda.is_available()
            else 0
        )
        return gpus + cpu_available_bytes()
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(dev.index if dev.index is not None else torch.cuda.current_device())[0])
    return None


def estimate_bytes(config, dtype: torch.dtype, auto_cls) -> int:
    """Bytes of parameters and buffers of ``auto_cls.from_config(config)`` in ``dtype``, built on empty weights."""
    from accelerate import init_empty_weights
    from transformers import AutoModel

    with init_empty_weights(include_buffers=True):
        try:
            model = auto_cls.from_config(config, trust_remote_code=False)
        except ValueError:  # no head class for this config: the bare model, as loading falls back to
            model = AutoModel.from_config(config, trust_remote_code=False)
    size = torch.empty((), dtype=dtype).element_size()
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += tensor.numel() * (size if tensor.is_floating_point() else tensor.element_size())
    return total


def human_size(n: float) -> str:
    """Bytes as GiB (from 100 MiB up) or MiB, one decimal."""
    return f"{n / GIB:.1f} GiB" if n >= 100 * 2**20 else f"{n / 2**20:.1f} MiB"


def _where(device: str | None) -> str:
    if device is None or device == "cpu":
        return "the CPU has"
    if device == "auto":
        return "the GPUs and CPU together have"
    return f"{device} has"


def check_fits(
    label: str, config, dtype: torch.dtype, device: str | None, auto_cls, available: Availability = available_bytes
) -> int:
    """UsageError (one line) when the base cannot fit ``device``; returns the estimate in bytes."""
    free = available(device)
    need = int(estimate_bytes(config, dtype, auto_cls) * HEADROOM)
    if free is None or need <= free:
        return need
    fixes = []
    if dtype == torch.float32:
        fixes.append("--dtype bfloat16")
    if device != "auto":
        fixes.append("--device auto")
    fixes.append("a smaller base")
    dtype_name = str(dtype).removeprefix("torch.")
    fix = f"{', '.join(fixes[:-1])} or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
    raise UsageError(
        f"{label} needs about {human_size(need)} in {dtype_name}, {_where(device)} {human_size(free)} available; use {fix}"
    )
