"""Giving freed memory back to the system after a large job: glibc's ``malloc_trim``.

glibc keeps the pages of freed small and middle-sized blocks in its arenas, so a process that
held a manifest of 127 MiB in pieces (1 MiB pieces, 64 KiB socket reads, digest batches) stays
hundreds of MiB larger afterwards, though nothing of it is in use (``bench.manifest_flood``).
``malloc_trim(0)`` returns every free page of every arena. Elsewhere (musl, macOS) it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]  # type: ignore[attr-defined]
    trim.restype = ctypes.c_int  # type: ignore[attr-defined]
    return trim


def trim() -> bool:
    """Return the free pages of the C heap to the system (the GIL is released meanwhile: a
    CDLL call); whether anything was returned (False without glibc)."""
    f = _malloc_trim()
    return bool(f(0)) if f is not None else False
