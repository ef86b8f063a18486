"""The open reducer protocol: streaming statistics that plug into capture by name."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import pandas as pd

from anchorlens.capture.event import AttentionEvent


@runtime_checkable
class Reducer(Protocol):
    """A streaming statistic over attention events.

    A reducer keeps only small sum/count state (per example, layer, head, role...), never maps,
    so memory does not grow with the size of the maps. ``merge`` adds another reducer's state
    of the same kind (distributed ranks, resumed shards); ``state_dict``/``load_state_dict``
    round-trip that state as plain tensors; ``frame`` returns tidy rows.
    """

    name: str

    def update(self, event: AttentionEvent) -> None:
        """Fold one batch's attention at one site into the state."""
        ...

    def merge(self, other: Reducer) -> None:
        """Add the state of another reducer of the same kind and options."""
        ...

    def state_dict(self) -> dict:
        """The state as a dict of tensors and plain values."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Replace the state with one produced by ``state_dict``."""
        ...

    def frame(self) -> pd.DataFrame:
        """Tidy long-format rows: example, stack, layer, head, metric[, query_role, key_role], value."""
        ...


_REGISTRY: dict[str, Callable[..., Reducer]] = {}


def register_reducer(name: str) -> Callable[[Callable[..., Reducer]], Callable[..., Reducer]]:
    """Class decorator that makes a reducer constructible by ``make_reducer(name, **options)``."""

    def wrap(factory: Callable[..., Reducer]) -> Callable[..., Reducer]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"reducer {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return wrap


def make_reducer(name: str, **options) -> Reducer:
    """Build a registered reducer by name; ValueError lists the known names."""
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "(none registered)"
        raise ValueError(f"unknown reducer {name!r}; known reducers: {known}")
    return _REGISTRY[name](**options)


def reducer_names() -> list[str]:
    """Names of all registered reducers."""
    return sorted(_REGISTRY)
