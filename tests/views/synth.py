"""Synthetic maps for the view tests: causal softmax maps with roles, inserted guidance and masked rows."""

from __future__ import annotations

import json
import re

import torch

from anchorlens.capture.maps import StackMaps
from anchorlens.roles.kinds import Role

INSTANCE, CONTENT, SPECIAL, STRUCTURAL = int(Role.INSTANCE), int(Role.CONTENT), int(Role.SPECIAL), int(Role.STRUCTURAL)
WORDS = ["The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", ".", "ĠIt", "Ġwas", "Ġwarm", "Ġand", "Ġsoft"]


def tokens(n: int, inserted: tuple[int, ...] = ()) -> tuple[list[str], list[int]]:
    """``n`` input tokens (the first a special <s>, every fourth structural) with ``<instance>`` positions inserted
    before the input positions named in ``inserted``."""
    toks, roles = [], []
    for i in range(n):
        if i in inserted:
            toks.append("<instance>")
            roles.append(INSTANCE)
        toks.append("<s>" if i == 0 else WORDS[i % len(WORDS)] + str(i))
        roles.append(SPECIAL if i == 0 else STRUCTURAL if i % 4 == 0 else CONTENT)
    return toks, roles


def causal_maps(
    n: int, layers: int = 2, heads: int = 3, inserted: tuple[int, ...] = (), seed: int = 0, empty_row: int | None = None
) -> StackMaps:
    """Causal softmax maps [layers, heads, Q, Q] over ``tokens(n, inserted)``; ``empty_row``: that query row all 0
    (a fully masked row)."""
    toks, roles = tokens(n, inserted)
    q = len(toks)
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(layers, heads, q, q, generator=g)
    logits[..., 0] += 4.0  # a sink on the first token
    logits = logits.masked_fill(torch.triu(torch.ones(q, q, dtype=torch.bool), 1), float("-inf"))
    probs = logits.softmax(-1)
    if empty_row is not None:
        probs[..., empty_row, :] = 0.0
    r = torch.tensor(roles)
    return StackMaps(probs, list(range(layers)), list(range(heads)), r, r.clone(), toks, list(toks))


def embedded_data(html: str) -> dict:
    """The JSON data a view carries, read back from its HTML."""
    found = re.search(r"D=(\{.*?\}),\s*C=D\.checkpoints", html, re.S)
    assert found, "no view data in the HTML"
    return json.loads(found.group(1))


def assert_decoded(got, want, vmax: float, float32: bool = False) -> None:
    """``got`` is ``want`` after the view's sqrt coding: |got - want| <= sqrt(want * vmax) / CODE_MAX (half a code
    step), plus the step at 0 and float32 rounding in the browser."""
    import numpy as np

    from anchorlens.views.data import CODE_MAX

    got, want = np.asarray(got, float), np.asarray(want, float)
    tol = np.sqrt(np.clip(want, 0, None) * vmax) / CODE_MAX + vmax / CODE_MAX**2 + (1e-6 if float32 else 1e-12)
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"{bad.sum()} values off by more than the coding step, e.g. {got[bad][:3]} vs {want[bad][:3]}"
