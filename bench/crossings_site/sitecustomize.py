"""Tracing for `bench.crossings`, loaded by every Python process of the server it starts (this
directory is first on that server's PYTHONPATH, and nowhere else): which of the project's own
source files each process enters, in order of first call, between two signals.

- At start-up (``stampd serve``) it installs one profile function in this thread
  (`sys.setprofile`) and in every thread started later (`threading.setprofile`); forked
  children (the HTTP manager and processes, the worker supervisor, the workers) inherit both.
  While no window is open the function returns at once.
- SIGUSR1 opens a window: the files seen so far are forgotten, and the process writes
  ``on-<pid>`` in ``$STAMPD_CROSSINGS_DIR`` (the bench waits for every process's).
- SIGUSR2 closes it: the process writes ``<label>-<pid>.json`` there (``label``: the text of
  the file ``label`` there when the window opened): each file entered, the first time by each
  thread (and, in a thread that runs an event loop, by each task), with the wall-clock time,
  the thread, the function, and what entered it ("via": the task's coroutine, else the
  outermost project frame of the innermost run of them on the stack): a request, a timer, a
  loop of its own.
- Every process writes ``pid-<pid>`` when it starts (this one) or is forked (an at-fork hook),
  so the bench signals only processes that have the handlers (SIGUSR1 kills one without).

Nothing here changes what the server does but its speed: a profile function runs on every
Python call, so a traced server is slower (the bench measures which files, not how long).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

DIR = Path(os.environ.get("STAMPD_CROSSINGS_DIR", ""))
ROOT = os.environ.get("STAMPD_CROSSINGS_ROOT", "").rstrip("/") + "/"
PACKAGES = tuple(p for p in os.environ.get("STAMPD_CROSSINGS_PACKAGES", "").split(",") if p)

_on = False
_opened = 0.0
_label = ""
# (file, thread, task) -> (time, thread's name, function, via): each file's first entry by each
# thread, and in a thread that runs an event loop by each task
_seen: dict[tuple[str, int, int], tuple[float, str, str, str]] = {}
_project: dict[str, str] = {}  # co_filename -> its path in the repository, "" if not ours
_loops: Any = None  # asyncio's (running loop, current tasks), once asyncio is imported


def _ours(filename: str) -> str:
    rel = _project.get(filename)
    if rel is None:
        rel = ""
        if filename.startswith(ROOT) and filename[len(ROOT):].split("/", 1)[0] in PACKAGES:
            rel = filename[len(ROOT):]
        _project[filename] = rel
    return rel


def _task() -> Any:
    """The asyncio task running in this thread, if any."""
    global _loops
    if _loops is None:
        asyncio = sys.modules.get("asyncio")
        if asyncio is None:
            return None
        _loops = (asyncio.events._get_running_loop, asyncio.tasks._current_tasks)
    loop = _loops[0]()
    return None if loop is None else _loops[1].get(loop)


def _via(frame: FrameType | None, task: Any) -> str:
    """What entered the file: the task (its coroutine), or else the outermost project frame of
    the innermost run of project frames on the stack (``file:function``)."""
    if task is not None:
        coro = task.get_coro()
        return f"task {getattr(coro, '__qualname__', type(coro).__name__)}"
    outer = ""
    while frame is not None:
        rel = _ours(frame.f_code.co_filename)
        if rel:
            outer = f"{rel}:{frame.f_code.co_name}"
        elif outer:
            break
        frame = frame.f_back
    return outer


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if not _on or event != "call":
        return
    rel = _ours(frame.f_code.co_filename)
    if not rel:
        return
    task = _task()
    key = (rel, threading.get_ident(), 0 if task is None else id(task))
    if key not in _seen:
        _seen[key] = (time.time(), threading.current_thread().name, frame.f_code.co_name,
                      _via(frame, task))


def _mark(name: str) -> None:
    with contextlib.suppress(OSError):
        (DIR / name).write_text("")


def _open(signum: int, frame: FrameType | None) -> None:
    global _on, _opened, _label
    _seen.clear()
    try:
        _label = (DIR / "label").read_text().strip()
    except OSError:
        _label = "window"
    _opened = time.time()
    _on = True
    _mark(f"on-{os.getpid()}")


def _close(signum: int, frame: FrameType | None) -> None:
    global _on
    _on = False
    closed = time.time()
    try:
        comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    except OSError:
        comm = "?"
    out = {"pid": os.getpid(), "ppid": os.getppid(), "comm": comm, "opened": _opened,
           "closed": closed, "files": [[t, f, th, fn, via]
                                       for (f, _, _), (t, th, fn, via) in _seen.items()]}
    tmp = DIR / f".{_label}-{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(out))
        tmp.rename(DIR / f"{_label}-{os.getpid()}.json")
    except OSError:
        pass


def _install() -> None:
    if not DIR.is_dir() or not PACKAGES:
        return
    signal.signal(signal.SIGUSR1, _open)
    signal.signal(signal.SIGUSR2, _close)
    os.register_at_fork(after_in_child=lambda: _mark(f"pid-{os.getpid()}"))
    _mark(f"pid-{os.getpid()}")
    threading.setprofile(_profile)
    sys.setprofile(_profile)


_install()
