"""Runtime helpers: distributed capture (torchrun / accelerate) and resumable chunked streaming."""

from __future__ import annotations

from anchorlens.runtime.codec import pack_state, state_from_tensors, state_to_tensors, unpack_state
from anchorlens.runtime.distributed import (
    DistInfo,
    agree,
    all_reduce_reducers,
    barrier,
    dist_info,
    init_if_needed,
    initialized,
    is_main,
    shard,
    shutdown,
)
from anchorlens.runtime.shards import Progress, chunk_indices, run_chunks

__all__ = [
    "DistInfo",
    "Progress",
    "agree",
    "all_reduce_reducers",
    "barrier",
    "chunk_indices",
    "dist_info",
    "init_if_needed",
    "initialized",
    "is_main",
    "shutdown",
    "pack_state",
    "run_chunks",
    "shard",
    "state_from_tensors",
    "state_to_tensors",
    "unpack_state",
]
