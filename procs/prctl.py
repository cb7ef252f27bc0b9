"""What a process of stampd asks of Linux's ``prctl(2)`` about itself: its name
(`set_process_name`) and the signal it gets when its parent is gone (`die_with_parent`).
Elsewhere both do nothing.

A forked process is named as its parent, and keeps its parent's command line: the supervisors
name each child they fork (``stampd-api``, ``stampd-http-N``, ``stampd-pool``,
``stampd-worker``). Every child a supervisor starts, and every agent a worker starts, dies with
its parent, so that a process killed with SIGKILL leaves nothing of its own running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_NAME = 15


def _find_prctl() -> Callable[..., int] | None:
    """libc's prctl(2), looked up once, before any fork (a forked child must not load it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has it
        return None


_prctl = _find_prctl()


def set_process_name(name: str) -> None:
    """Name this process as ``ps -o comm``, ``top`` and ``/proc/PID/comm`` show it (Linux
    keeps 15 bytes; elsewhere nothing): a forked process is otherwise named as its parent."""
    if _prctl is not None:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for `subprocess.Popen`: the child gets ``sig`` when the process that
    starts it (this one) is gone. (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing.)

    The signal comes when the *thread* that forked the child ends, so start such children
    from a thread that lives as long as they should: the main thread. The setting survives
    ``exec`` (of anything but set-user-ID programs). A parent that died before the child set
    it is caught too: the child then kills itself at once."""
    parent = os.getpid()

    def preexec() -> None:
        if _prctl is not None and _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0 \
                and os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec
