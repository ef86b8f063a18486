"""Which positions of two checkpoints' inputs are the same token: the difference view's common grid.

Two checkpoints of one example see the same input tokens, but a guided one has inserted positions (capsule,
instance, soft prompt) the other lacks. Positions are matched in order by (role, token text); guidance
positions are never matched (an inserted position has no counterpart), so the merged grid holds each matched
pair once and every unmatched position of either side on its own, in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

import numpy as np

from anchorlens.roles.kinds import GUIDANCE_ROLES

GUIDANCE_NAMES = frozenset(r.label for r in GUIDANCE_ROLES)


def _keys(tokens: Sequence[str], roles: Sequence[str], side: str) -> list[tuple]:
    """Matchable keys: (role, token) for input positions, a key of their own for guidance positions."""
    return [(side, i) if role in GUIDANCE_NAMES else (role, tok) for i, (tok, role) in enumerate(zip(tokens, roles))]


def align(
    tokens_a: Sequence[str], roles_a: Sequence[str], tokens_b: Sequence[str], roles_b: Sequence[str]
) -> list[tuple[int, int]]:
    """Merged positions ``(index in a, index in b)``, -1 where one side has no counterpart, in input order.

    ``roles_*`` are role names; guidance positions (capsule, instance, soft prompt) are never matched."""
    ka, kb = _keys(tokens_a, roles_a, "a"), _keys(tokens_b, roles_b, "b")
    merged: list[tuple[int, int]] = []
    for op, a0, a1, b0, b1 in SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes():
        if op == "equal":
            merged += [(a0 + i, b0 + i) for i in range(a1 - a0)]
        else:  # a's unmatched positions, then b's
            merged += [(i, -1) for i in range(a0, a1)] + [(-1, j) for j in range(b0, b1)]
    return merged


def difference(qk_a: np.ndarray, qk_b: np.ndarray, rows: Sequence[tuple[int, int]], cols: Sequence[tuple[int, int]]):
    """[R, C] ``a - b`` on the merged grid (``rows``/``cols`` from :func:`align`); NaN where a cell has no
    counterpart or is masked (NaN) on either side."""
    ra, rb = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    ca, cb = np.array([c[0] for c in cols]), np.array([c[1] for c in cols])
    a = np.where((ra[:, None] >= 0) & (ca[None, :] >= 0), qk_a[np.ix_(np.maximum(ra, 0), np.maximum(ca, 0))], np.nan)
    b = np.where((rb[:, None] >= 0) & (cb[None, :] >= 0), qk_b[np.ix_(np.maximum(rb, 0), np.maximum(cb, 0))], np.nan)
    return a - b
