"""A cache keyed on tensor identity: work that depends only on tensors every layer of a forward shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def identity_key(keys: tuple) -> tuple:
    """A hashable stand-in for ``keys``: tensors by ``id``, other values as they are."""
    return tuple(id(k) if isinstance(k, torch.Tensor) else k for k in keys)


def same_tensors(kept: tuple, keys: tuple) -> bool:
    """Whether ``keys`` hold the very same tensor objects as ``kept`` (whose identity key they share)."""
    return all(a is b for a, b in zip(kept, keys, strict=True) if isinstance(a, torch.Tensor))


class IdentityCache:
    """Values computed from tuples of tensors, reused while the very same tensors come back.

    The layers of one forward share their mask and role tensors (the same objects, one set per query
    chunk), so work that depends only on them runs once per forward and chunk instead of once per layer.
    Holds up to ``size`` entries (then starts over); an entry keeps its tensors alive, so their ids
    cannot be reused meanwhile. The tensors must not be modified in place while in use (layouts never are).
    """

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._entries: dict[tuple, tuple[tuple, object]] = {}

    def get(self, keys: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()`` unless ``keys`` were seen before (then the cached value).

        Tensors must be the very same objects; other keys (devices, dtypes) compare equal.
        """
        ident = identity_key(keys)
        hit = self._entries.get(ident)
        if hit is not None and same_tensors(hit[0], keys):
            return hit[1]
        if len(self._entries) >= self._size:
            self._entries.clear()
        value = compute()
        self._entries[ident] = (keys, value)
        return value
