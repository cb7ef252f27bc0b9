"""Exactly one log writer among several API hosts: a PostgreSQL advisory lock.

The lock is held by a dedicated connection for as long as this process lives; when the process
dies its connection closes and the lock is free, and another host takes it at its next commit
interval (bounded takeover). Only the holder commits the log and talks to peers. A lost
connection loses the lock; the next check connects again and tries to take it (at once, once).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import psycopg

from server.db import is_disconnect

log = logging.getLogger(__name__)

LOG_LOCK = 0x7374616D  # "stam"


class AdvisoryLeader:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.holding = False
        self._mutex = threading.Lock()

    def __call__(self) -> bool:
        """True while this process holds the log lock (tries to take it when free). A
        connection found broken is replaced at once, once: the lock went with it, so this
        process takes it again if no other host was quicker."""
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
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            self.holding = False
        if self.holding:
            self.conn.execute("SELECT 1")  # the lock lives as long as this connection
        else:
            row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", (LOG_LOCK,)).fetchone()
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
