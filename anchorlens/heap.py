"""Hand the process's freed heap back to the operating system between the chunks of a long run.

glibc keeps freed memory in its arenas, and a run that builds and drops tens of MiB of arrays per chunk
ends up holding free pages that count in its resident memory and grow with the number of chunks. Calling
``malloc_trim(0)`` after a chunk returns them (a few milliseconds). A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return freed heap pages to the OS; whether the C library could (glibc)."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
