"""The host-wide queue for SQLite's write lock (server/writelock.py): it excludes the journal
writers of other processes, a failed write or a killed holder never leaves it taken."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from server import db
from server.errors import JournalError
from server.stamping.journal import Journal
from server.stamping.requests import TagRequest
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
    assert lock.try_acquire()  # free: taken without waiting
    assert taken_elsewhere(lock.path)
    lock.release()
    lock.close()


def test_a_failed_journal_write_releases_the_lock(tmp_path: Path) -> None:
    """The journal takes the lock around each group commit; a commit that fails (here: a
    database without the stamps table) answers JournalError and leaves the lock free."""
    path = tmp_path / "journal.sqlite3"
    sqlite3.connect(path).close()
    engine = db.make_engine(f"sqlite:///{path}")

    async def scenario() -> None:
        journal = Journal(engine)
        journal.start()
        with pytest.raises(JournalError):
            await journal.record(TagRequest("a" * 40, "t"), 1)
        assert not taken_elsewhere(path.with_name(path.name + "-writelock"))
        await journal.stop()

    asyncio.run(scenario())
    engine.dispose()


def test_what_arrives_while_another_process_commits_goes_into_one_commit(
        tmp_path: Path) -> None:
    """While another process holds the write lock, requests queue up; once the journal has
    the lock it takes all of them into one commit (one fsync), not one commit each."""
    path = tmp_path / "journal.sqlite3"
    engine = db.make_engine(f"sqlite:///{path}")
    db.upgrade(engine)
    lock_file = path.with_name(path.name + "-writelock")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()",
         str(lock_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    async def scenario() -> tuple[list[int], int]:
        journal = Journal(engine)
        journal.start()
        first = asyncio.ensure_future(journal.record(TagRequest("0" * 40, "t"), 1))
        lock = journal._lock
        assert lock is not None
        for _ in range(3000):  # until the journal's thread waits in flock (at most 30 s)
            if lock._thread.locked():
                break
            await asyncio.sleep(0.01)
        more = [asyncio.ensure_future(journal.record(TagRequest(f"{i:040x}", "t"), 1))
                for i in range(1, 50)]
        await asyncio.sleep(0)
        assert lock._thread.locked() and not first.done()  # it waits for the other process
        assert holder.stdin is not None
        holder.stdin.close()  # the other process lets go
        ids = await asyncio.gather(first, *more)
        commits = journal.commits
        await journal.stop()
        return list(ids), commits

    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        ids, commits = asyncio.run(scenario())
    finally:
        holder.wait(timeout=30)
    assert len(set(ids)) == 50
    assert commits == 1
    engine.dispose()


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
        mine = WriteLock(tmp_path / "journal.sqlite3")
        assert not mine.try_acquire()  # held by the other process: not taken, no wait
        mine.close()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free at once
        os.close(fd)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
