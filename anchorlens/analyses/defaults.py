"""The reducer set every workflow streams by default."""

from __future__ import annotations

from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.reducer import Reducer

DEFAULT_REDUCERS = ("role_flow", "first_token", "entropy", "decomposition")


def default_reducers(anchor_role: str = "capsule") -> list[Reducer]:
    """Fresh ``role_flow``, ``first_token``, ``entropy`` (also of ``anchor_role``'s queries) and ``decomposition`` reducers."""
    return [
        make_reducer("role_flow"),
        make_reducer("first_token"),
        make_reducer("entropy", anchor_role=anchor_role),
        make_reducer("decomposition"),
    ]
