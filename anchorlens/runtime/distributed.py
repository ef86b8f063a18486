"""Distributed capture under ``torchrun`` or ``accelerate launch``: detection, sharding, reduction.

Both launchers export ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`init_if_needed` starts the default process group from them (gloo on CPU, nccl on CUDA).
Reducer states travel between ranks as raw bytes with a JSON skeleton (:mod:`anchorlens.runtime.codec`),
never pickled: no ``all_gather_object``. Every rank's pid and host are exchanged at start, so when a
collective fails because a rank died the others raise :class:`RankLostError`: one line naming it.
"""

from __future__ import annotations

import copy
import os
import socket
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from anchorlens.atomic import pid_alive
from anchorlens.capture.reducer import Reducer
from anchorlens.errors import UsageError
from anchorlens.runtime.codec import pack_state, unpack_state

T = TypeVar("T")
_LOST_RANK_POLLS = 20  # x 0.1 s: how long a rank waits for a same-host peer that lost the connection to exit
_peers: list[tuple[int, int]] = []  # (pid, host hash) of every rank, exchanged by init_if_needed


class RankLostError(UsageError):
    """Another rank of a distributed run died (killed, crashed or out of memory); rerunning resumes."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: its rank, the world size, its local rank and the launcher."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = "none"

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    """An integer environment variable, or ``default`` when absent or malformed."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _launcher() -> str:
    """``"accelerate"``, ``"torchrun"``, ``"env"`` (bare RANK/WORLD_SIZE) or ``"none"``."""
    if any(k.startswith("ACCELERATE_") for k in os.environ):
        return "accelerate"
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ:
        return "torchrun"
    return "env" if "WORLD_SIZE" in os.environ else "none"


def initialized() -> bool:
    """Whether a default process group is up."""
    return dist.is_available() and dist.is_initialized()


def dist_info() -> DistInfo:
    """Rank and world size from the live process group, else from the launcher's environment."""
    if initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", 0), _launcher())
    world = _env_int("WORLD_SIZE", 1)
    return DistInfo(_env_int("RANK", 0) if world > 1 else 0, world, _env_int("LOCAL_RANK", 0), _launcher())


def default_backend() -> str:
    """``nccl`` when CUDA is usable, ``gloo`` otherwise."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init_if_needed(backend: str | None = None) -> bool:
    """Start the process group when launched with WORLD_SIZE > 1; True if this call started it."""
    info = dist_info()
    if initialized() or not info.distributed or not dist.is_available():
        return False
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend=backend, init_method="env://", rank=info.rank, world_size=info.world_size)
    _exchange_peers()
    return True


def _host_hash() -> int:
    """A 31-bit hash of this host's name (to tell which ranks share it)."""
    return zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF


def _exchange_peers() -> None:
    """Record every rank's (pid, host hash) so a lost rank can be named later."""
    mine = torch.tensor([os.getpid(), _host_hash()], dtype=torch.long, device=device())
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    _peers[:] = [(int(t[0]), int(t[1])) for t in every]


def lost_ranks() -> list[int]:
    """Ranks on this host whose process is gone (empty when unknown or on other hosts)."""
    me, host = dist_info().rank, _host_hash()
    return [r for r, (pid, h) in enumerate(_peers) if r != me and h == host and not pid_alive(pid)]


def rank_lost_message(what: str) -> str:
    """One line for a collective that failed because another rank went away."""
    me = dist_info().rank
    dead = lost_ranks()
    # a killed peer closes its sockets while it is still exiting: give it a moment to show up as dead
    neighbours = sum(h == _host_hash() for h in (host for _, host in _peers)) > 1
    for _ in range(_LOST_RANK_POLLS if neighbours else 0):
        if dead:
            break
        time.sleep(0.1)
        dead = lost_ranks()
    who = f"rank {', '.join(map(str, dead))} died" if dead else "another rank died or became unreachable"
    return f"rank {me}: {who} during {what}; rerun the same command to resume from the saved progress"


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Turn the error of a collective whose peer died (gloo: connection closed; nccl: DistBackendError) into one line."""
    try:
        yield
    except RuntimeError as err:  # DistError, DistBackendError and gloo's errors are RuntimeErrors
        if isinstance(err, UsageError):
            raise
        raise RankLostError(rank_lost_message(what)) from None


def shutdown(started: bool) -> None:
    """Destroy the process group if ``started`` (the value :func:`init_if_needed` returned)."""
    if started and initialized():
        dist.destroy_process_group()


def device() -> torch.device:
    """The device this rank computes on: its CUDA device under nccl, else CPU."""
    if initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard(indices: Sequence[T], rank: int, world: int) -> list[T]:
    """Deterministic strided split: items ``rank, rank + world, ...`` of ``indices``."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return list(indices)[rank::world]


def is_main() -> bool:
    """True on rank 0 (and in a single process)."""
    return dist_info().rank == 0


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if initialized() and dist.get_world_size() > 1:
        with collective("a barrier"):
            if dist.get_backend() == "nccl":
                dist.barrier(device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier()


def agree(fn: Callable[[], T]) -> T:
    """Run ``fn`` on this rank; if it raised on any rank, raise on every rank (no rank hangs)."""
    error: BaseException | None = None
    result = None
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
        error = err
    if initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([1 if error is not None else 0], dtype=torch.long, device=device())
        with collective("a status exchange"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if error is None and int(flag.item()):
            raise UsageError(f"rank {dist_info().rank}: another rank failed (its message is on that rank's stderr)")
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


def all_gather_bytes(buf: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's flat uint8 tensor (sizes may differ: they are exchanged first, then padded)."""
    if not initialized() or dist.get_world_size() == 1:
        return [buf]
    dev, world = device(), dist.get_world_size()
    size = torch.tensor([buf.numel()], dtype=torch.long, device=dev)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    with collective("the exchange of results"):
        dist.all_gather(sizes, size)
        counts = [int(s.item()) for s in sizes]
        padded = torch.zeros(max(counts), dtype=torch.uint8, device=dev)
        padded[: buf.numel()] = buf.to(dev)
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded)
    return [g[:n].cpu() for g, n in zip(gathered, counts)]


def check_same_on_every_rank(value: str, what: str, fix: str) -> None:
    """Raise one UsageError line on every rank when ranks hold different ``value``s (e.g. launched with different
    arguments): the line names ``what`` differs, which ranks hold which value and the ``fix``. A no-op in a single
    process."""
    if not initialized() or dist.get_world_size() == 1:
        return
    mine = torch.frombuffer(bytearray(value.encode()), dtype=torch.uint8)
    every = [bytes(t.numpy().tobytes()).decode() for t in all_gather_bytes(mine)]
    if len(set(every)) > 1:
        groups: dict[str, list[int]] = {}
        for rank, v in enumerate(every):
            groups.setdefault(v, []).append(rank)
        held = "; ".join(f"rank {', '.join(map(str, r))}: {v}" for v, r in groups.items())
        raise UsageError(f"ranks differ in {what} ({held}); {fix}")


def merged_states(reducers: Sequence[Reducer], states: Sequence[Sequence[dict]]) -> list[dict]:
    """Merge per-rank states (rank order) of each reducer into one state per reducer."""
    out = []
    for i, reducer in enumerate(reducers):
        total = copy.deepcopy(reducer)
        total.load_state_dict(states[0][i])
        for rank_states in states[1:]:
            part = copy.deepcopy(reducer)
            part.load_state_dict(rank_states[i])
            total.merge(part)
        out.append(total.state_dict())
    return out


def all_reduce_reducers(reducers: Sequence[Reducer]) -> Sequence[Reducer]:
    """Combine every rank's reducer states so each rank holds the sum of all ranks (in place)."""
    if not initialized() or dist.get_world_size() == 1:
        return reducers
    local = [r.state_dict() for r in reducers]
    gathered = [unpack_state(b) for b in all_gather_bytes(pack_state(local))]
    if any(len(g) != len(reducers) for g in gathered):
        raise RuntimeError(f"ranks hold different numbers of reducers: {[len(g) for g in gathered]}")
    for reducer, state in zip(reducers, merged_states(reducers, gathered)):
        reducer.load_state_dict(state)
    return reducers
