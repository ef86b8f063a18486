"""Pickle-free codec for reducer states: a JSON skeleton plus raw tensors.

A state is a nested structure of dicts (str keys), lists, tuples, tensors and JSON scalars
(``Reducer.state_dict()`` output). ``state_to_tensors`` splits it into a JSON-able skeleton and
named tensors (for safetensors files); ``pack_state`` puts both into one uint8 tensor (for
``all_gather`` between ranks). Decoding never runs code: JSON and raw little-endian bytes only.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

_TENSOR, _TUPLE = "__tensor__", "__tuple__"
_HEADER = struct.Struct("<Q")


def _dtype(name: str) -> torch.dtype:
    """``"torch.float64"`` -> torch.float64 (only real dtypes accepted)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a packed state")
    return dtype


def state_to_tensors(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``state`` into a JSON-able skeleton and ``{"t0": tensor, ...}`` (CPU, contiguous)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = node.detach().cpu().contiguous().clone()
            return {_TENSOR: name}
        if isinstance(node, dict):
            bad = [k for k in node if not isinstance(k, str)]
            if bad:
                raise TypeError(f"state dict keys must be str, got {bad[:3]}")
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, tuple):
            return {_TUPLE: [walk(v) for v in node]}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise TypeError(f"cannot encode {type(node).__name__} in a reducer state (tensors and JSON values only)")

    return walk(state), tensors


def state_from_tensors(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`state_to_tensors`."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {_TENSOR}:
                return tensors[node[_TENSOR]]
            if set(node) == {_TUPLE}:
                return tuple(walk(v) for v in node[_TUPLE])
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(skeleton)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a contiguous CPU tensor as a flat uint8 tensor."""
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8)


def pack_state(state: Any) -> torch.Tensor:
    """One flat uint8 tensor: 8-byte JSON length, JSON skeleton with tensor specs, raw tensor bytes."""
    skeleton, tensors = state_to_tensors(state)
    specs, offset, parts = {}, 0, []
    for name, t in tensors.items():
        raw = _as_bytes(t)
        specs[name] = {"dtype": str(t.dtype), "shape": list(t.shape), "offset": offset, "nbytes": int(raw.numel())}
        parts.append(raw)
        offset += raw.numel()
    blob = json.dumps({"skeleton": skeleton, "tensors": specs}, separators=(",", ":")).encode()
    header = torch.frombuffer(bytearray(_HEADER.pack(len(blob)) + blob), dtype=torch.uint8)
    return torch.cat([header, *parts]) if parts else header


def unpack_state(buf: torch.Tensor) -> Any:
    """Inverse of :func:`pack_state` (trailing padding bytes are ignored)."""
    buf = buf.detach().cpu().to(torch.uint8).reshape(-1)
    (length,) = _HEADER.unpack(buf[: _HEADER.size].numpy().tobytes())
    start = _HEADER.size + length
    meta = json.loads(buf[_HEADER.size : start].numpy().tobytes().decode())
    tensors = {}
    for name, spec in meta["tensors"].items():
        dtype = _dtype(spec["dtype"])
        raw = buf[start + spec["offset"] : start + spec["offset"] + spec["nbytes"]].clone()
        flat = raw.view(dtype) if raw.numel() else torch.zeros(0, dtype=dtype)
        tensors[name] = flat.reshape(spec["shape"])
    return state_from_tensors(meta["skeleton"], tensors)
