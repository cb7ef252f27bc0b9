"""The host-wide queue for SQLite's write lock (server/writelock.py): it excludes the journal
writers of other processes, a failed write or a killed holder never leaves it taken."""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from server.stamping.journal import _SqliteWriter
from server.writelock import WriteLock

# A second process tries the lock without waiting: exit 0 when it got it, 1 when it is taken.
TRY = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(1)
sys.exit(0)
"""


def taken_elsewhere(path: Path) -> bool:
    code = subprocess.run([sys.executable, "-c", TRY, str(path)], timeout=30).returncode
    assert code in (0, 1)
    return code == 1


def test_the_lock_excludes_other_processes_while_held(tmp_path: Path) -> None:
    lock = WriteLock(tmp_path / "journal.sqlite3")
    with lock.held():
        assert lock.path == tmp_path / "journal.sqlite3-writelock"
        assert lock.path.stat().st_mode & 0o777 == 0o600
        assert taken_elsewhere(lock.path)
    assert not taken_elsewhere(lock.path)
    lock.close()


def test_a_failed_journal_write_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    sqlite3.connect(path).close()  # a database without the stamps table: the INSERT fails
    writer = _SqliteWriter(str(path))
    row = {"kind": "tag", "commit": "0" * 40, "tagname": "v1", "tree": None, "parent": None,
           "algorithm": None, "digest": None, "stamped_at": 1, "key_id": None}
    with pytest.raises(sqlite3.OperationalError):
        writer.write([row], [], {})
    assert not taken_elsewhere(writer.lock.path)
    with writer.lock.held():  # and this process can take it again
        assert taken_elsewhere(writer.lock.path)
    writer.close()


def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    lock_file = tmp_path / "journal.sqlite3-writelock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)",
         str(lock_file)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        fd = os.open(lock_file, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free at once
        os.close(fd)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
