"""The reducer set every workflow streams by default."""
from __future__ import annotations

from anchorlens.capture.reducer import Reducer, make_reducer

DEFAULT_REDUCERS = ("role_flow", "first_token", "entropy")


def default_reducers(anchor_role: str = "capsule") -> list[Reducer]:
    """Fresh ``role_flow``, ``first_token`` and ``entropy`` reducers (entropy also of ``anchor_role``'s queries)."""
    return [make_reducer("role_flow"), make_reducer("first_token"), make_reducer("entropy", anchor_role=anchor_role)]
