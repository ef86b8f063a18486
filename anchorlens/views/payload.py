"""The data of an attention view: every checkpoint's maps of one example, within a size budget.

Sent for every checkpoint: the mean over all layers and heads at full resolution (always), thumbnails of every
head of every layer and of the means, then, while the page stays under ``max_bytes``: each layer's mean over
heads, each head's mean over layers, and every head of the detail layers (in the order asked), one layer of all
checkpoints at a time. A map not sent at full resolution is shown from its thumbnail, and the page says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import torch

from anchorlens.capture.maps import StackMaps
from anchorlens.figures._roles import ordered_roles, role_palette
from anchorlens.figures._style import clean_token
from anchorlens.views.align import align
from anchorlens.views.data import THUMB_SIZE, encode_full, encode_thumbs, is_causal, thumbnail

MAX_BYTES = 8_000_000  # default budget of the full-resolution maps beyond the overall means (base64 characters, all
# checkpoints together): every head of a 300-token example; the overall and 12 layer means of a 1,000-token one
TOKEN_CHARS = 24  # token texts are shortened to this many characters


@dataclass
class Prepared:
    """One checkpoint's maps as float64 numpy: heads [L, H, Q, K], layer means [L, Q, K], head means [H, Q, K]."""

    name: str
    maps: StackMaps
    heads: np.ndarray
    causal: bool
    layer_means: np.ndarray = field(init=False)
    head_means: np.ndarray = field(init=False)
    overall: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.layer_means = self.heads.mean(axis=1)
        self.head_means = self.heads.mean(axis=0)
        self.overall = self.layer_means.mean(axis=0)

    def full(self, key: str) -> np.ndarray:
        """[Q, K] map of a key: ``all``, ``L<i>`` (layer i's mean), ``H<j>`` (head j's mean), ``L<i>H<j>``."""
        if key == "all":
            return self.overall
        if key.startswith("H"):
            return self.head_means[int(key[1:])]
        layer, _, head = key[1:].partition("H")
        return self.layer_means[int(layer)] if head == "" else self.heads[int(layer), int(head)]


def prepare(name: str, maps: StackMaps) -> Prepared:
    """Float64 copies of one checkpoint's maps (probs [L, H, Q, K])."""
    probs = maps.probs.detach().to("cpu", torch.float64)
    return Prepared(name, maps, probs.numpy(), is_causal(maps.probs))


def thumbnails(p: Prepared, size: int = THUMB_SIZE) -> np.ndarray:
    """[L+1, H+1, Tq, Tk]: every head's thumbnail, each layer's mean (last head slot), each head's mean over
    layers (last layer slot) and the overall mean (last, last)."""
    n_layers, n_heads = p.heads.shape[:2]
    rows = [[thumbnail(p.heads[i, j], p.causal, size) for j in range(n_heads)] for i in range(n_layers)]
    rows = [[*row, thumbnail(p.layer_means[i], p.causal, size)] for i, row in enumerate(rows)]
    rows.append(
        [*(thumbnail(p.head_means[j], p.causal, size) for j in range(n_heads)), thumbnail(p.overall, p.causal, size)]
    )
    return np.array(rows)


def _tokens(tokens: Sequence[str], roles: torch.Tensor, names: Sequence[str], index: Mapping[str, int]) -> list:
    return [
        [clean_token(t, max_len=TOKEN_CHARS, mathtext=False), index[names[int(r)]]]
        for t, r in zip(tokens, roles.tolist())
    ]


def _role_names(maps: StackMaps, side: str) -> list[str]:
    roles = maps.q_roles if side == "q" else maps.k_roles
    return [maps.role_names[int(r)] for r in roles.tolist()]


def alignment(a: StackMaps, b: StackMaps) -> dict[str, list[int]]:
    """Merged query and key positions of two checkpoints (see :func:`anchorlens.views.align.align`) as four flat
    index lists ``qa, qb, ka, kb`` (-1: no counterpart)."""
    q = align(a.q_tokens, _role_names(a, "q"), b.q_tokens, _role_names(b, "q"))
    k = align(a.k_tokens, _role_names(a, "k"), b.k_tokens, _role_names(b, "k"))
    return {"qa": [i for i, _ in q], "qb": [j for _, j in q], "ka": [i for i, _ in k], "kb": [j for _, j in k]}


def full_keys(n_layers: int, n_heads: int, detail: Sequence[int]) -> list[list[str]]:
    """Groups of full-map keys in the order they are sent: the overall mean, each layer mean, each head mean,
    then every head of each detail layer (one group per layer)."""
    groups = [["all"], *([f"L{i}"] for i in range(n_layers)), *([f"H{j}"] for j in range(n_heads))]
    return groups + [[f"L{i}H{j}" for j in range(n_heads)] for i in detail]


def view_payload(
    maps: Mapping[str, StackMaps], *, max_bytes: int = MAX_BYTES, layers: Sequence[int] | None = None
) -> dict:
    """The JSON-able data of a view of ``maps`` (checkpoint name -> the same example's maps of one stack).

    ``layers``: model layer indices whose heads are sent at full resolution first (default: every layer, in
    order); ``max_bytes``: budget of the full-resolution maps beyond the overall means (base64 characters)."""
    prepared = [prepare(name, m) for name, m in maps.items()]
    first = prepared[0].maps
    names = ordered_roles(r for p in prepared for side in ("q", "k") for r in _role_names(p.maps, side))
    index = {n: i for i, n in enumerate(names)}
    palette = role_palette(names)
    vmax = max(float(p.heads.max()) for p in prepared)
    vmax = vmax if vmax > 0 else 1.0
    thumbs = [thumbnails(p) for p in prepared]
    tvmax = max(float(np.nanmax(t)) if np.isfinite(t).any() else 0.0 for t in thumbs) or 1.0
    detail = [first.layers.index(layer) for layer in (first.layers if layers is None else layers)]
    groups = full_keys(len(first.layers), len(first.heads), detail)
    fulls: list[dict[str, str]] = [{} for _ in prepared]
    used = 0
    for n, group in enumerate(groups):
        encoded = [{key: encode_full(p.full(key), vmax, p.causal) for key in group if _has(p, key)} for p in prepared]
        size = sum(len(v) for e in encoded for v in e.values())
        if n > 0 and used + size > max_bytes:
            break
        used += size if n > 0 else 0
        for full, e in zip(fulls, encoded):
            full.update(e)
    checkpoints = []
    for p, t, full in zip(prepared, thumbs, fulls):
        m = p.maps
        checkpoints.append(
            {
                "name": p.name,
                "layers": list(m.layers),
                "heads": list(m.heads),
                "q": _tokens(m.q_tokens, m.q_roles, m.role_names, index),
                "k": _tokens(m.k_tokens, m.k_roles, m.role_names, index),
                "causal": p.causal,
                "full": full,
                "thumbs": encode_thumbs(t, tvmax),
                "tq": int(t.shape[2]),
                "tk": int(t.shape[3]),
            }
        )
    pairs = {
        f"{i},{j}": alignment(prepared[i].maps, prepared[j].maps) for i, j in combinations(range(len(prepared)), 2)
    }
    return {
        "checkpoints": checkpoints,
        "roles": names,
        "colors": [palette[n] for n in names],
        "vmax": vmax,
        "tvmax": tvmax,
        "pairs": pairs,
    }


def _has(p: Prepared, key: str) -> bool:
    """Whether a checkpoint has the layer/head a key names (checkpoints may capture fewer)."""
    layer, _, head = key[1:].partition("H") if key.startswith("L") else ("", "", key[1:] if key != "all" else "")
    return (layer == "" or int(layer) < p.heads.shape[0]) and (head == "" or int(head) < p.heads.shape[1])
