"""The public log: periodic signed commits of the stamped hashes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.helpers import (
    TEST_FPR,
    Server,
    keyring,
    log_commits,
    logged_hashes,
    stamp_tag,
    start_server,
    wait_for,
)


def test_log_commits_signed_sorted_and_not_empty(seeded_dir: Path, server_factory: list[Server],
                                                 tmp_path: Path) -> None:
    server = start_server(seeded_dir, workers=1, commit_interval=2)
    server_factory.append(server)
    commits = [f"{i:040x}" for i in (5, 3, 9, 3)]
    for c in commits:
        stamp_tag(server, c)
    wait_for(lambda: len(log_commits(seeded_dir)) == 1, what="the first log commit")
    first = log_commits(seeded_dir)[0]
    blob = first.tree["hashes.log"].data.decode()  # type: ignore[attr-defined]
    assert blob == "".join(f"{c}\n" for c in sorted(set(commits)))
    assert first.tree["pubkey.asc"].data == (seeded_dir / "keys/pubkey.asc").read_bytes()  # type: ignore[attr-defined]
    assert not first.parents

    # Nothing stamped: no empty commit in the next intervals.
    time.sleep(5)
    assert len(log_commits(seeded_dir)) == 1

    stamp_tag(server, "f" * 40)
    wait_for(lambda: len(log_commits(seeded_dir)) == 2, what="the second log commit")
    second = log_commits(seeded_dir)[0]
    assert second.parents[0].id == first.id
    assert second.tree["hashes.log"].data == b"f" * 40 + b"\n"  # type: ignore[attr-defined]

    # Every log commit, the first included, verifies with git and the server key.
    home = keyring(seeded_dir / "keys/pubkey.asc", tmp_path / "verify-gnupg")
    env = {**os.environ, "GNUPGHOME": str(home)}
    for c in (first, second):
        r = subprocess.run(["git", "--git-dir", str(seeded_dir / "log.git"), "verify-commit",
                            "--raw", str(c.id)], capture_output=True, text=True, env=env,
                           timeout=60, check=False)
        assert r.returncode == 0, r.stderr
        assert f"VALIDSIG {TEST_FPR}" in r.stderr
    r = subprocess.run(["git", "--git-dir", str(seeded_dir / "log.git"), "fsck", "--strict"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_interrupted_log_commit_is_finished_after_restart(
    seeded_dir: Path, server_factory: list[Server]
) -> None:
    """Stamps assigned to a log commit that was never written (crash) reach the log."""
    import sqlite3

    server = start_server(seeded_dir, workers=1, commit_interval=3600)
    server_factory.append(server)
    stamped = [f"{i:040x}" for i in (11, 12, 13)]
    for c in stamped:
        stamp_tag(server, c)
    server.stop()
    # Simulate a crash after step 1 of a log commit: a pending row owning the stamps.
    with sqlite3.connect(seeded_dir / "stampd.sqlite3") as db:
        cur = db.execute("insert into log_commits (created_at, state, hash_count) "
                         "values (1, 'pending', 0)")
        db.execute("update stamps set log_commit_id = ?", (cur.lastrowid,))
        pending_id = cur.lastrowid
    assert log_commits(seeded_dir) == []

    again = start_server(seeded_dir, workers=1, commit_interval=2)
    server_factory.append(again)
    wait_for(lambda: len(log_commits(seeded_dir)) == 1, what="the recovered log commit")
    head = log_commits(seeded_dir)[0]
    assert head.message.startswith(f"stampd log commit {pending_id}\n")
    assert logged_hashes(seeded_dir) == set(stamped)

    def rows() -> list[tuple[str, str | None, int]]:
        with sqlite3.connect(seeded_dir / "stampd.sqlite3") as db:
            return db.execute("select state, git_commit, hash_count from log_commits").fetchall()

    # main advances first, then the row is marked committed (`LogCommitter._finish`)
    wait_for(lambda: rows()[0][0] == "committed", what="the log commit marked committed")
    assert rows() == [("committed", str(head.id), 3)]
