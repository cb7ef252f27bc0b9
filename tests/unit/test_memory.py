"""procs.memory: freed memory goes back to the system (glibc; this machine runs glibc)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A thread frees a mapped 20 MiB block (glibc then raises its mmap threshold to 20 MiB and its
# trim threshold to 40 MiB), then 35 MiB of 900 KiB blocks (now below the mmap threshold: in
# its arena); `trim` runs; the growth that stays is printed, in MiB.
PROGRAM = """
import os, sys, threading
from procs import memory
def rss():
    return int(open(f"/proc/{os.getpid()}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
if sys.argv[1] == "fixed":
    assert memory.fix_thresholds()
def work():
    big = bytearray(20 << 20)
    del big
    blocks = [bytearray(900 << 10) for _ in range(40)]
    del blocks
before = rss()
t = threading.Thread(target=work)
t.start()
t.join()
memory.trim()
print((rss() - before) >> 20)
"""


def _kept_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True,
                         check=True, timeout=60, cwd=Path(__file__).parents[2])
    return int(out.stdout)


@pytest.mark.parametrize("mode", ["default", "fixed"])
def test_fixed_thresholds_give_a_threads_freed_blocks_back(mode: str) -> None:
    """glibc does not trim the free top of a thread's arena below its raised trim threshold,
    and `malloc_trim` leaves it too: 35 MiB stayed. With `fix_thresholds` (as every HTTP
    process has it) they go back."""
    kept = _kept_mib(mode)
    if mode == "default":
        assert kept >= 30, kept  # (what the fix is for: if glibc changes, this says so)
    else:
        assert kept <= 4, kept
