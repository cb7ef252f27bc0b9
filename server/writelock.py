"""SQLite's one write lock, queued for across the processes of a host.

SQLite lets one transaction write at a time. A connection that finds the lock taken does not
queue: its busy handler sleeps and tries again, sleeping longer each time (1, 2, 5, 10, ... up
to 100 ms between tries), and whoever tries at the right moment wins, however long the others
have waited. With several HTTP processes each committing its journal group every few
milliseconds, the losers slept through many of the winners' commits: at 4 HTTP processes on 2
cores, p99 was 8-13 times that of one process at the same throughput.

`WriteLock` puts an ``flock`` on a file beside the database (``<database>-writelock``) in
front of ``BEGIN IMMEDIATE``: a writer that finds it taken blocks in the kernel and is woken
the moment it is released, so the journal writers of all HTTP processes take turns, with no
sleeping. The journal takes the lock before it takes its group of requests
(`server.stamping.journal.Journal`), so that everything that arrived while it waited goes into
its one commit. Inside one process a `threading.Lock` serialises the threads first
(an ``flock`` held through one open file is held by every thread that shares it).

The lock is advisory and only the journal's writers take it: another writer (the log committer,
a migration) still meets SQLite's own lock and busy handler, as before. A process killed while
holding it loses it with its file descriptors: a crash never leaves it taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

SUFFIX = "-writelock"


class WriteLock:
    """The host-wide queue for the write lock of the SQLite database at ``database``."""

    def __init__(self, database: Path | str) -> None:
        self.path = Path(f"{database}{SUFFIX}")
        self._thread = threading.Lock()
        self._fd: int | None = None

    def _file(self) -> int:
        if self._fd is None:
            # 0600 like the database; an existing file (another process's) is opened as it is.
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def acquire(self) -> None:
        """Wait (in the kernel, woken at once) until no other process's or thread's journal
        writer holds the lock, and take it."""
        self._thread.acquire()
        try:
            fcntl.flock(self._file(), fcntl.LOCK_EX)
        except BaseException:
            self._thread.release()
            raise

    def try_acquire(self) -> bool:
        """Take the lock if no one holds it, without waiting; whether it was taken."""
        if not self._thread.acquire(blocking=False):
            return False
        try:
            fcntl.flock(self._file(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._thread.release()
            return False
        except BaseException:
            self._thread.release()
            raise
        return True

    def release(self) -> None:
        assert self._fd is not None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread.release()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the body."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        with self._thread:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
