"""Token roles: what part a position plays in a guided input."""

from __future__ import annotations

from enum import IntEnum


class Role(IntEnum):
    """Role of one position; stored as small integers in role tensors."""

    SPECIAL = 0  # BOS/EOS/SEP/CLS/pad and other tokenizer specials
    STRUCTURAL = 1  # template text and punctuation that frames the input
    CONTENT = 2  # the user's filled fields (field name kept separately)
    SOFT_PROMPT = 3  # learned prompt vectors (prompt tuning, P-tuning v2, prefixes)
    INSTANCE = 4  # training-free instance-aware token(s)
    CAPSULE = 5  # CaPT capsule token

    @property
    def label(self) -> str:
        """Lower-case name used in tables and figures."""
        return self.name.lower()


ROLE_NAMES: tuple[str, ...] = tuple(r.label for r in Role)
NUM_ROLES: int = len(Role)
GUIDANCE_ROLES: tuple[Role, ...] = (Role.SOFT_PROMPT, Role.INSTANCE, Role.CAPSULE)
INPUT_ROLES: tuple[Role, ...] = (Role.SPECIAL, Role.STRUCTURAL, Role.CONTENT)


def parse_role(name: str | int | Role) -> Role:
    """Turn a role name (``"structural"``), index or Role into a Role; raise ValueError naming the choices."""
    if isinstance(name, Role):
        return name
    if isinstance(name, int):
        return Role(name)
    key = name.strip().lower().replace("-", "_")
    for role in Role:
        if role.label == key:
            return role
    raise ValueError(f"unknown role {name!r}; choose one of: {', '.join(ROLE_NAMES)}")
