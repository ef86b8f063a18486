"""The open reducer protocol: streaming statistics over attention events.

The registry of reducers by name lives in :mod:`anchorlens.analyses.registry`, next to the
built-in reducers, so that ``make_reducer("role_flow")`` works in a fresh process.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import pandas as pd

from anchorlens.capture.event import AttentionEvent
from anchorlens.engine.quantities import UNDECLARED_READS


@runtime_checkable
class Reducer(Protocol):
    """A streaming statistic over attention events.

    A reducer keeps only small sum/count state (per example, layer, head, role...), never maps,
    so memory does not grow with the size of the maps. ``update`` may receive one attention call as
    several events, each for a slice of the queries (see :class:`AttentionEvent`); a state that is a
    sum over queries is then correct by adding every event. ``merge`` adds another reducer's state
    of the same kind (distributed ranks, resumed shards); ``state_dict``/``load_state_dict``
    round-trip that state as plain tensors; ``frame`` returns tidy rows. A reducer that buffers events may
    also define ``flush()``: a stream calls it once at its end
    (:meth:`~anchorlens.capture.sinks.StreamSink.close`). A reducer that reads probability sums over fixed key
    columns may define ``key_columns(layout, device, dtype)`` returning them ([B, K, C]): when every reducer
    that asks returns the same tensor, fast capture computes the sums with the output
    (:attr:`AttentionEvent.key_sums`). A reducer that reads the residual stream defines
    ``update_hidden(HiddenEvent)``: the capture then hooks the selected blocks and hands it each one's output
    (:mod:`anchorlens.capture.hidden`), in the same forward. A reducer declares the quantities it reads in
    ``reads`` (names from :mod:`anchorlens.engine.quantities`, e.g. ``{"key_sums", "visible"}``): the engine then
    computes only those, with the cheapest plan that gives them all; one that declares none is given everything but
    the value norms (those it must ask for).
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


def reads_of(reducer: Any) -> frozenset[str]:
    """The quantities ``reducer`` reads: its ``reads``, or every quantity but the value norms when it declares none
    (:data:`~anchorlens.engine.quantities.UNDECLARED_READS`)."""
    reads = getattr(reducer, "reads", None)
    return UNDECLARED_READS if reads is None else frozenset(reads)
