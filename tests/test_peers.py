"""Cross-timestamping between stampd servers, the log over HTTP, and peers that go down."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pygit2
import pytest

from server.errors import PeerError
from server.peers import check_branch_stamp
from tests.conftest import Server, free_port, seed_data_dir, start_server
from tests.gpgcheck import keyring
from tests.test_log import stamp_tag, wait_for


def branch(data_dir: Path, name: str) -> list[pygit2.Commit]:
    """The commits of a log branch, newest first: main's history, or a stamp branch's chain of
    stamps (first parents while a commit has two parents; the last stamp may have one)."""
    repo = pygit2.Repository(str(data_dir / "log.git"))
    try:
        head = repo.references[f"refs/heads/{name}"].target
    except KeyError:
        return []
    if name == "main":
        return list(repo.walk(head, pygit2.enums.SortMode.TOPOLOGICAL))
    chain = [repo[head]]
    while len(chain[-1].parents) == 2:
        chain.append(chain[-1].parents[0])
    return chain  # type: ignore[return-value]


def cross_rows(data_dir: Path) -> list[tuple[str, str, int, str | None]]:
    with sqlite3.connect(data_dir / "stampd.sqlite3") as db:
        return db.execute("select peer, state, attempts, last_error from cross_stamps "
                          "order by id").fetchall()


def verify_commits(git_dir: Path, commits: list[pygit2.Commit], pubkey: Path,
                   home: Path) -> None:
    env = {**os.environ, "GNUPGHOME": str(keyring(pubkey, home))}
    for c in commits:
        r = subprocess.run(["git", "--git-dir", str(git_dir), "verify-commit", str(c.id)],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
        assert r.returncode == 0, r.stderr


def cross_stamping_pair(tmp_path: Path, server_factory: list[Server], cycles: int
                        ) -> tuple[Server, Server, Path, Path]:
    """Servers a (test key) and b (its own key) stamping each other's log for ``cycles``
    log commits each; (a, b, a's data dir, b's data dir)."""
    a_dir = tmp_path / "a" / "data"
    b_dir = tmp_path / "b" / "data"  # b generates its own key on first start
    a_port, b_port = free_port(), free_port()
    a = start_server(seed_data_dir(a_dir), workers=1, commit_interval=2, port=a_port,
                     extra_env={"STAMPD_PEERS": f"bee=http://127.0.0.1:{b_port}/"})
    server_factory.append(a)
    b = start_server(b_dir, workers=1, commit_interval=2, port=b_port,
                     extra_env={"STAMPD_PEERS": f"ay=http://127.0.0.1:{a_port}/"})
    server_factory.append(b)
    for cycle in range(cycles):
        stamp_tag(a, f"{cycle + 1:040x}")
        stamp_tag(b, f"{cycle + 101:040x}")
        wait_for(lambda c=cycle: len(branch(a_dir, "bee-timestamps")) > c, timeout=30,  # type: ignore[misc]
                 what=f"b's stamp of a's log, cycle {cycle}")
        wait_for(lambda c=cycle: len(branch(b_dir, "ay-timestamps")) > c, timeout=30,  # type: ignore[misc]
                 what=f"a's stamp of b's log, cycle {cycle}")
    return a, b, a_dir, b_dir


def test_two_stampd_servers_cross_stamp(tmp_path: Path, server_factory: list[Server]) -> None:
    a, _b, a_dir, b_dir = cross_stamping_pair(tmp_path, server_factory, cycles=3)

    stamps = branch(a_dir, "bee-timestamps")
    main = {c.id for c in branch(a_dir, "main")}
    for s in stamps:
        assert s.parents[-1].id in main  # each stamp covers a head of a's main
        assert s.tree_id == s.parents[-1].tree_id
    # A merge chain: every stamp after the first has the previous stamp as first parent.
    assert stamps[0].parents[0].id == stamps[1].id
    verify_commits(a_dir / "log.git", stamps, b_dir / "keys/pubkey.asc", tmp_path / "gb")
    verify_commits(b_dir / "log.git", branch(b_dir, "ay-timestamps"),
                   a_dir / "keys/pubkey.asc", tmp_path / "ga")
    # The pinned key is published in the log.
    wait_for(lambda: "peers" in branch(a_dir, "main")[0].tree, timeout=15,
             what="peer key in a's log")
    published = branch(a_dir, "main")[0].tree["peers"]["bee.asc"].data  # type: ignore[index]
    assert published == (b_dir / "keys/pubkey.asc").read_bytes()

    # Anyone can clone the log, read-only, with peer branches.
    clone = tmp_path / "clone"
    r = subprocess.run(["git", "clone", "--quiet", "--mirror", a.url + "log.git", str(clone)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    cloned = pygit2.Repository(str(clone))
    assert str(cloned.references["refs/heads/main"].target) == str(branch(a_dir, "main")[0].id)
    assert "refs/heads/bee-timestamps" in list(cloned.references)
    r = subprocess.run(["git", "--git-dir", str(clone), "fsck", "--strict"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_peer_down_then_back(tmp_path: Path, server_factory: list[Server]) -> None:
    a_dir = seed_data_dir(tmp_path / "a" / "data")
    b_dir = tmp_path / "b" / "data"
    b_port = free_port()
    a = start_server(a_dir, workers=1, commit_interval=2,
                     extra_env={"STAMPD_PEERS": f"bee=http://127.0.0.1:{b_port}/",
                                "STAMPD_PEER_RETRY_BASE": "1", "STAMPD_PEER_RETRY_MAX": "2"})
    server_factory.append(a)
    stamp_tag(a, "1" * 40)
    wait_for(lambda: any(r[2] >= 2 for r in cross_rows(a_dir)), timeout=30,
             what="recorded failures while the peer is down")
    rows = cross_rows(a_dir)
    assert rows[0][1] == "pending" and "cannot reach" in (rows[0][3] or "")
    # Stamping and log commits go on while the peer is down.
    t0 = time.monotonic()
    stamp_tag(a, "2" * 40)
    assert time.monotonic() - t0 < 2
    wait_for(lambda: len(branch(a_dir, "main")) >= 2, timeout=30, what="a second log commit")

    b = start_server(b_dir, workers=1, commit_interval=3600, port=b_port)
    server_factory.append(b)
    wait_for(lambda: len(branch(a_dir, "bee-timestamps")) >= 1, timeout=30,
             what="the peer's stamp after it came back")
    stamp = branch(a_dir, "bee-timestamps")[0]
    # The stamp covers the newest head, and with it the heads missed while the peer was down.
    assert stamp.parents[-1].id == branch(a_dir, "main")[0].id
    states = [r[1] for r in cross_rows(a_dir)]
    assert states[-1] == "done" and set(states[:-1]) <= {"superseded", "done"}


def test_check_branch_stamp_rejects() -> None:
    tree, commit, uid, now = "a" * 40, "b" * 40, "P <p@x>", 1700000000
    good = (f"tree {tree}\nparent {commit}\nauthor {uid} {now} +0000\n"
            f"committer {uid} {now} +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n"
            " AAAA\n =abcd\n -----END PGP SIGNATURE-----\n\nmsg\n")
    checked = check_branch_stamp(good, tree=tree, commit=commit, parent=None, uid=uid, now=now)
    assert checked.payload == (f"tree {tree}\nparent {commit}\nauthor {uid} {now} +0000\n"
                               f"committer {uid} {now} +0000\n\nmsg\n").encode()
    assert checked.signature == ("-----BEGIN PGP SIGNATURE-----\n\nAAAA\n=abcd\n"
                                 "-----END PGP SIGNATURE-----\n")
    bad = [
        good.replace(f"tree {tree}", f"tree {'c' * 40}"),
        good.replace(uid, "Q <q@x>"),
        good.replace(f"{now} +0000\ncommitter", f"{now - 60} +0000\ncommitter"),
        good.replace("+0000\ngpgsig", "+0100\ngpgsig"),
        good.replace("msg\n", "msg\n-----BEGIN PGP SIGNATURE-----\n"),
        good.replace("msg", "m\u00e9g"),
        good + "x" * 8000,
    ]
    for text in bad:
        with pytest.raises(PeerError):
            check_branch_stamp(text, tree=tree, commit=commit, parent=None, uid=uid, now=now)
    with pytest.raises(PeerError):
        check_branch_stamp(good, tree=tree, commit=commit, parent="d" * 40, uid=uid, now=now)


def test_audit_of_cross_stamped_logs(tmp_path: Path, server_factory: list[Server]) -> None:
    """`stampd audit` passes on both servers' logs, from a URL, with keys from the log."""
    import sys

    a, b, a_dir, b_dir = cross_stamping_pair(tmp_path, server_factory, cycles=2)
    # One more stamp so that the newest log commits carry the pinned peer keys.
    stamp_tag(a, "e" * 40)
    stamp_tag(b, "f" * 40)
    wait_for(lambda: "peers" in branch(a_dir, "main")[0].tree, timeout=15, what="a's pin")
    wait_for(lambda: "peers" in branch(b_dir, "main")[0].tree, timeout=15, what="b's pin")
    for server in (a, b):
        r = subprocess.run([sys.executable, "-m", "server", "audit", server.url + "log.git"],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
