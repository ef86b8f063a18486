"""Freed heap pages go back to the OS between chunks (glibc), and nothing breaks elsewhere."""

from __future__ import annotations

import platform

import numpy as np

from anchorlens.heap import release_free_memory


def _rss_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_release_returns_freed_pages_on_glibc():
    released = release_free_memory()
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert released in (True, False)
        return
    assert released
    small = [np.ones(2_000) for _ in range(20_000)]  # ~320 MB in small heap blocks (below the mmap threshold)
    del small[:-1]  # the last block keeps the heap's top in use, so only trimming can hand the rest back
    before = _rss_kib()
    assert release_free_memory()
    assert before - _rss_kib() > 100_000  # more than 100 MB returned
