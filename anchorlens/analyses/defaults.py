"""The reducer set every workflow streams by default."""

from __future__ import annotations

from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.reducer import Reducer
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable

DEFAULT_REDUCERS = ("role_flow", "first_token", "entropy", "decomposition")


def default_reducers(anchor_role: str = "capsule", roles: RoleTable = BUILTIN_ROLES) -> list[Reducer]:
    """Fresh ``role_flow``, ``first_token``, ``entropy`` (also of ``anchor_role``'s queries) and ``decomposition``
    reducers counting the run's ``roles``."""
    return [
        make_reducer("role_flow", roles=roles),
        make_reducer("first_token", roles=roles),
        make_reducer("entropy", anchor_role=anchor_role, roles=roles),
        make_reducer("decomposition", roles=roles),
    ]
