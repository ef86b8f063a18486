"""The identity-keyed cache that per-forward work (visibility, query slices, key columns) shares."""

from __future__ import annotations

import torch

from anchorlens.capture.identity import IdentityCache


def test_the_very_same_tensors_hit_and_equal_copies_miss():
    cache, calls = IdentityCache(), []
    mask = torch.ones(2, 3, dtype=torch.bool)

    def compute():
        calls.append(1)
        return len(calls)

    assert cache.get((mask, 0, 4), compute) == 1
    assert cache.get((mask, 0, 4), compute) == 1  # same object, same other keys: cached
    assert cache.get((mask, 4, 8), compute) == 2  # another chunk
    assert cache.get((mask.clone(), 0, 4), compute) == 3  # equal values, another tensor: recomputed
    assert cache.get((None, 0, 4), compute) == 4  # non-tensor keys compare by equality
    assert cache.get((None, 0, 4), compute) == 4


def test_a_full_cache_starts_over_and_keeps_its_keys_alive():
    cache = IdentityCache(size=2)
    kept = [torch.zeros(1) for _ in range(3)]
    for i, t in enumerate(kept):
        cache.get((t,), lambda i=i: i)
    assert len(cache._entries) == 1  # the third entry cleared the two before it
    assert cache.get((kept[2],), lambda: -1) == 2 and cache.get((kept[0],), lambda: -1) == -1
    # an entry holds its tensors, so a dead tensor's id cannot alias a live entry
    assert all(isinstance(k, torch.Tensor) for keys, _ in cache._entries.values() for k in keys)
