"""Giving freed memory back to the system after a large job: glibc's ``malloc_trim``, and
fixed ``mallopt`` thresholds.

glibc keeps the pages of freed small and middle-sized blocks in its arenas, so a process that
held a manifest of 127 MiB in pieces (1 MiB pieces, 64 KiB socket reads, digest batches) stays
hundreds of MiB larger afterwards, though nothing of it is in use (``bench.manifest_flood``).
``malloc_trim(0)`` returns the free pages inside every arena, but not the free top of a
thread's arena: glibc trims that only beyond its trim threshold, which it raises (to 64 MiB at
most) each time a large block it had mapped is freed. A manifest checked in a thread left ~60
MiB there after each of its first checks; `fix_thresholds` sets both at 1 MiB, which also
stops glibc from moving them. Elsewhere (musl, macOS) both do nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


def libc() -> ctypes.CDLL:
    """The C library's functions, as this process has them loaded (``dlopen(NULL)``; not
    ``ctypes.util.find_library``, which runs ldconfig: ~25 ms of CPU in every process)."""
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = libc().malloc_trim
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


M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 20  # bytes: blocks from this size are mapped, and a free top beyond it trimmed


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    try:
        mallopt: Callable[[int, int], int] = libc().mallopt
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]  # type: ignore[attr-defined]
    mallopt.restype = ctypes.c_int  # type: ignore[attr-defined]
    return mallopt


def fix_thresholds(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap and trim thresholds at ``threshold`` for this process (setting them
    turns their raising off): a block of ``threshold`` bytes or more is mapped and unmapped
    on its own, and a free top of an arena larger than it goes back to the system. Whether
    both were set (False without glibc)."""
    f = _mallopt()
    return f is not None and bool(f(M_MMAP_THRESHOLD, threshold)) \
        and bool(f(M_TRIM_THRESHOLD, threshold))
