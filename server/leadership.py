"""Exactly one log writer among several HTTP processes: a PostgreSQL advisory lock where hosts
share a database (`AdvisoryLeader`), a lock on a file of the data directory where the HTTP
processes of one host share it (`FileLeader`).

The advisory lock is held by a dedicated connection for as long as this process lives; when the
process dies its connection closes and the lock is free, and another host takes it at its next
commit interval (bounded takeover). Only the holder commits the log and talks to peers. A lost
connection loses the lock; the next check connects again and tries to take it (at once, once).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from server.db import is_disconnect

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

LOG_LOCK = 0x7374616D  # "stam"


class AdvisoryLeader:
    def __init__(self, dsn: str, lock: int = LOG_LOCK) -> None:
        self.dsn = dsn
        self.lock = lock
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.holding = False
        self._mutex = threading.Lock()

    def __call__(self) -> bool:
        """True while this process holds the log lock (tries to take it when free). A
        connection found broken is replaced at once, once: the lock went with it, so this
        process takes it again if no other host was quicker."""
        import psycopg  # (here: only PostgreSQL hosts pay for importing it)

        with self._mutex:
            for attempt in (1, 2):
                try:
                    return self._hold()
                except psycopg.Error as e:
                    log.warning("log lock: %s", e)
                    self.close()
                    if attempt == 2 or not is_disconnect(e):
                        return False
            return False

    def _hold(self) -> bool:
        import psycopg

        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            self.holding = False
        if self.holding:
            self.conn.execute("SELECT 1")  # the lock lives as long as this connection
        else:
            row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lock,)).fetchone()
            self.holding = bool(row and row[0])
            if self.holding:
                log.info("this process is now the log writer")
        return self.holding

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None
        self.holding = False


class FileLeader:
    """The log lock of the HTTP processes of one host: an exclusive ``flock`` on
    ``<data_dir>/run/log.lock``, taken without waiting and held for as long as this process
    lives. The kernel frees it when the process dies, however it dies; another process takes
    it at its next log interval. They share the log repository, so the new writer finds every
    commit in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self._mutex = threading.Lock()

    @property
    def holding(self) -> bool:
        return self.fd is not None

    def __call__(self) -> bool:
        with self._mutex:
            if self.fd is not None:
                return True
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            log.info("this process (pid %d) is now the log writer", os.getpid())
            return True

    def close(self) -> None:
        with self._mutex:
            if self.fd is not None:
                os.close(self.fd)  # (frees the lock)
                self.fd = None
