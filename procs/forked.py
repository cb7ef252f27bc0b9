"""A child process this one forked, handled as a `subprocess.Popen` is (`Forked`,
`fork_child`), and what both have in common (`Child`, `stop_child`).

Forking spares a child the interpreter's start and its imports (0.15-1 s of CPU each): the HTTP
manager forks the HTTP processes (`server.http_processes`), the worker supervisor its workers
(`workers.pool`). Fork only from a single-threaded process: a lock another thread held at the
fork stays locked in the child for ever.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any, Protocol


class Child(Protocol):
    """What is used of a child process: `subprocess.Popen`'s interface, or `Forked`'s."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


class Forked:
    """A child this process forked, with the part of `subprocess.Popen`'s interface that is
    used here (``returncode`` as Popen gives it: negative for a signal; ``args``, what a
    timeout names)."""

    POLL = 0.05  # seconds between looks in `wait`, at most (the first after 0.5 ms)

    def __init__(self, pid: int, args: Any = None) -> None:
        self.pid = pid
        self.args = f"pid {pid}" if args is None else args
        self.returncode: int | None = None
        self._reaping = threading.Lock()  # (one thread may wait while another polls)

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                got, status = os.waitpid(self.pid, os.WNOHANG)
                if got:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (not yet reaped: the PID is still this child's)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, self.POLL)
        return code


def fork_child(run: Any) -> Forked:
    """Fork; the child runs ``run()`` (its exit status) and ends there, never returning into
    the caller's stack: through ``os._exit``, after its output is flushed. An exception in it
    is printed, as an interpreter would print it, and exits 1."""
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        code = int(run() or 0)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def start_fresh(env: Mapping[str, str], keep: int | None = None) -> None:
    """In a forked child (the worker supervisor, a worker): start as a child started anew
    would. What it inherited is frozen (the collector never walks, and so never copies, its
    parent's objects); ``env`` is its environment; stdin is ``/dev/null``; every descriptor
    beyond stderr is closed but ``keep`` (a pipe it reports on); `random` is reseeded (not
    its parent's sequence, nor every sibling's)."""
    gc.freeze()
    os.environ.clear()
    os.environ.update(env)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    top = os.sysconf("SC_OPEN_MAX")
    if keep is None or keep < 3:
        os.closerange(3, top)
    else:
        os.closerange(3, keep)
        os.closerange(keep + 1, top)
    random.seed()


def stop_child(proc: Child, timeout: float) -> None:
    """SIGTERM, then SIGKILL when it has not exited within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
