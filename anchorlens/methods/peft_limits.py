"""An adapter's sizes and patterns checked against the base before PEFT allocates or compiles anything.

PEFT builds every LoRA-family layer from ``adapter_config.json`` before it reads the saved tensors: a rank ``r``
(or a ``rank_pattern`` entry) far above the base's layer sizes allocates its matrices first (gigabytes for
``r = 10**6``), and a string ``target_modules`` is a regular expression PEFT matches against every module name, where
a pattern with nested repetition can run for hours. Both are refused here in one line naming the file, the key and
the limit.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from anchorlens.errors import CheckpointError

PATTERN_SECONDS = 2.0  # the time a target_modules pattern may take over all of the base's module names


def largest_rank(model: torch.nn.Module) -> int:
    """The largest rank a low-rank update of one of ``model``'s linear (or embedding, conv) layers can have: the
    largest min(in, out) over their weights."""
    ranks = [min(p.shape[0], p.shape[1]) for name, p in model.named_parameters() if p.dim() >= 2]
    return max(ranks, default=1)


def check_adapter_limits(cfg: dict[str, Any], path: Path, model: torch.nn.Module) -> None:
    """CheckpointError (one line) when ``cfg`` (an ``adapter_config.json``) asks for a rank above any the base's
    layers can have or holds a ``target_modules`` pattern that does not compile or takes more than
    :data:`PATTERN_SECONDS` over the base's module names."""
    where = path / "adapter_config.json"
    most = largest_rank(model)
    ranks: list[tuple[str, Any]] = [("r", cfg.get("r"))] if "r" in cfg else []
    pattern = cfg.get("rank_pattern")
    if isinstance(pattern, dict):
        ranks += [(f"rank_pattern[{key!r}]", value) for key, value in pattern.items()]
    for key, value in ranks:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise CheckpointError(
                f"{where}: {key} = {value!r} is not a rank this base's layers can have (1..{most}, the largest "
                "min(in, out) of its weights); fix the adapter's config"
            )
    target = cfg.get("target_modules")
    if isinstance(target, str):
        _check_pattern(target, where, [name for name, _ in model.named_modules()])


def _check_pattern(text: str, where: Path, names: list[str]) -> None:
    """Compile ``text`` and match it against every module name as PEFT does (``re.fullmatch``), within the time
    limit where this thread can be interrupted (the main thread)."""
    shown = text if len(text) <= 60 else text[:57] + "..."
    try:
        compiled = re.compile(text)
    except (re.error, RecursionError, OverflowError) as err:
        raise CheckpointError(f"{where}: target_modules {shown!r} is not a regular expression ({err})") from None
    try:
        with _time_limit(PATTERN_SECONDS):
            for name in names:
                compiled.fullmatch(name)
    except _PatternTooSlow:
        raise CheckpointError(
            f"{where}: target_modules {shown!r} takes more than {PATTERN_SECONDS:g} s to match this base's "
            f"{len(names)} module names (nested repetition backtracks); write it without nested quantifiers"
        ) from None


class _PatternTooSlow(Exception):
    """The time limit of :func:`_time_limit` ran out."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _PatternTooSlow in the block after ``seconds`` (SIGALRM: the main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _PatternTooSlow

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
