"""The open reducer protocol: streaming statistics over attention events.

The registry of reducers by name lives in :mod:`anchorlens.analyses.registry`, next to the
built-in reducers, so that ``make_reducer("role_flow")`` works in a fresh process.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import pandas as pd

from anchorlens.capture.event import AttentionEvent
from anchorlens.errors import UsageError


@runtime_checkable
class Reducer(Protocol):
    """A streaming statistic over attention events.

    A reducer keeps only small sum/count state (per example, layer, head, role...), never maps,
    so memory does not grow with the size of the maps. ``update`` may receive one attention call as
    several events, each for a slice of the queries (see :class:`AttentionEvent`); a state that is a
    sum over queries is then correct by adding every event. ``merge`` adds another reducer's state
    of the same kind (distributed ranks, resumed shards); ``state_dict``/``load_state_dict``
    round-trip that state as plain tensors; ``frame`` returns tidy rows.
    """

    name: str

    def update(self, event: AttentionEvent) -> None:
        """Fold one batch's attention at one site (or one query slice of it) into the state."""
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


# --- Transitional aliases (issue 10): remove once every caller imports register_reducer, make_reducer
# and reducer_names from anchorlens.analyses.registry. They forward to that registry once it is loaded
# (capture may not import analyses) and otherwise say where the registry moved.
_REGISTRY_FUNCTIONS: dict[str, Callable] = {}


def _attach_registry(register: Callable, make: Callable, names: Callable) -> None:
    """Called by anchorlens.analyses.registry when it loads."""
    _REGISTRY_FUNCTIONS.update(register_reducer=register, make_reducer=make, reducer_names=names)


def _forward(name: str) -> Callable:
    if name not in _REGISTRY_FUNCTIONS:
        raise UsageError(f"{name} moved to anchorlens.analyses.registry: import it from there")
    return _REGISTRY_FUNCTIONS[name]


def register_reducer(name: str) -> Callable:
    """Deprecated alias of :func:`anchorlens.analyses.registry.register_reducer`."""
    return _forward("register_reducer")(name)


def make_reducer(name: str, **options) -> Reducer:
    """Deprecated alias of :func:`anchorlens.analyses.registry.make_reducer`."""
    return _forward("make_reducer")(name, **options)


def reducer_names() -> list[str]:
    """Deprecated alias of :func:`anchorlens.analyses.registry.reducer_names`."""
    return _forward("reducer_names")()
