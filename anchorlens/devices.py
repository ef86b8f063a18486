"""Check a ``--device`` / ``device=`` before anything is loaded: one line naming the device and the fix.

Without this, ``--device cuda:0`` on a CPU-only torch ends deep inside ``model.to`` with torch's
"Torch not compiled with CUDA enabled", and ``mps`` on a machine without Metal in a RuntimeError.
torch is imported only when a device other than the CPU is asked for.
"""

from __future__ import annotations

from anchorlens.errors import UsageError

FORMS = "cpu, cuda, cuda:N, mps or auto"


def _torch_build() -> str:
    """``torch 2.13.0+cpu``: which torch is installed (the build tag says CPU-only)."""
    import torch

    return f"torch {torch.__version__}"


def _check_cuda(device: str, index: int | None) -> None:
    """Refuse a CUDA device this torch cannot reach: no CUDA build, no visible GPU, or an index past the last."""
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise UsageError(
                f"device {device!r} is not available: this {_torch_build()} is built without CUDA; "
                "use --device cpu, or install a CUDA build of torch"
            )
        raise UsageError(
            f"device {device!r} is not available: no CUDA GPU is visible (check the driver and "
            "CUDA_VISIBLE_DEVICES); use --device cpu"
        )
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        visible = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise UsageError(f"device {device!r} does not exist: {count} CUDA GPU(s) are visible ({visible})")


def _check_mps(device: str) -> None:
    """Refuse MPS where this torch or this machine has none."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return
    if mps is None or not mps.is_built():
        why = f"this {_torch_build()} is built without MPS (Apple's Metal backend)"
    else:
        why = "this machine has no MPS device (it needs Apple silicon and macOS 12.3 or later)"
    raise UsageError(f"device {device!r} is not available: {why}; use --device cpu")


def check_device(device: object) -> str | None:
    """``device`` (None, ``cpu``, ``cuda[:N]``, ``mps``, ``auto`` ...) if this machine can use it; UsageError otherwise."""
    if device is None:
        return None
    if not isinstance(device, str):
        device = str(device)  # a torch.device
    text = device.strip()
    if text in ("cpu", "auto"):
        return text
    import torch

    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"unknown device {device!r}; use {FORMS}") from None
    if parsed.type == "cpu":
        return text
    if parsed.type == "cuda":
        _check_cuda(text, parsed.index)
    elif parsed.type == "mps":
        _check_mps(text)
    elif parsed.type == "meta":
        raise UsageError(f"device {device!r} holds no data, so nothing can be measured on it; use {FORMS}")
    else:
        backend = getattr(torch, parsed.type, None)  # torch.xpu ... (an accelerator torch runs models on)
        available = getattr(backend, "is_available", None)
        if not callable(available):  # xla, vulkan, ...: torch names the type but runs no model on it here
            raise UsageError(
                f"device {device!r} is not supported (this torch has no {parsed.type} backend); use {FORMS}"
            )
        if not available():
            raise UsageError(f"device {device!r} is not available on this machine; use --device cpu")
    return text
