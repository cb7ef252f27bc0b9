"""Cross-timestamping between stampd servers, the log over HTTP, and peers that go down."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pygit2
import pytest

from tests.helpers import (
    Server,
    branch,
    cross_rows,
    cross_stamping_pair,
    free_port,
    run_stampd,
    seed_data_dir,
    stamp_tag,
    start_server,
    verify_commits,
    wait_for,
)

Pair = tuple[Server, Server, Path, Path]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Servers a (test key) and b (its own key) that have stamped each other's log for three
    log commits each (`cross_stamping_pair`), shared by the tests that read their logs: each
    only adds stamps. (Two pairs were started before, one of three cycles and one of two.)
    The tests that use it come last, so that the pair, which goes on stamping every 2 s,
    stops right after them."""
    servers: list[Server] = []
    try:
        yield cross_stamping_pair(tmp_path_factory.mktemp("pair"), servers, cycles=3)
    finally:
        for s in servers:
            s.stop()
            shutil.rmtree(s.runtime_dir, ignore_errors=True)


def test_peer_down_then_back(tmp_path: Path, server_factory: list[Server]) -> None:
    a_dir = seed_data_dir(tmp_path / "a" / "data")
    b_dir = tmp_path / "b" / "data"
    b_port = free_port()
    a = start_server(a_dir, workers=1, commit_interval=2, api_processes=2,
                     extra_env={"STAMPD_PEERS": f"bee=http://127.0.0.1:{b_port}/",
                                "STAMPD_PEER_RETRY_BASE": "1", "STAMPD_PEER_RETRY_MAX": "2"})
    server_factory.append(a)
    stamp_tag(a, "1" * 40)
    wait_for(lambda: any(r[2] >= 2 for r in cross_rows(a_dir)), timeout=30,
             what="recorded failures while the peer is down")
    rows = cross_rows(a_dir)
    assert rows[0][1] == "pending" and "cannot reach" in (rows[0][3] or "")
    # Stamping and log commits go on while the peer is down.
    stamp_tag(a, "2" * 40)  # answered 200 and checked (a stamp held up by the peer would 503)
    wait_for(lambda: len(branch(a_dir, "main")) >= 2, timeout=30, what="a second log commit")

    b = start_server(b_dir, workers=1, commit_interval=3600, port=b_port)
    server_factory.append(b)
    wait_for(lambda: len(branch(a_dir, "bee-timestamps")) >= 1, timeout=30,
             what="the peer's stamp after it came back")
    # The branch moves first, then the row is marked done (a moment later).
    wait_for(lambda: cross_rows(a_dir)[-1][1] != "pending", timeout=30,
             what="the cross-stamp row's outcome")
    stamp = branch(a_dir, "bee-timestamps")[0]
    # The stamp covers the newest head, and with it the heads missed while the peer was down.
    assert stamp.parents[-1].id == branch(a_dir, "main")[0].id
    states = [r[1] for r in cross_rows(a_dir)]
    assert states[-1] == "done" and set(states[:-1]) <= {"superseded", "done"}


def test_two_stampd_servers_cross_stamp(pair: Pair, tmp_path: Path) -> None:
    a, _b, a_dir, b_dir = pair

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
    # The clone's main is a's main as served (a may have committed again since: each peer's
    # stamp is a new stamp of the other, so the two logs keep moving while both run).
    assert str(cloned.references["refs/heads/main"].target) in {
        str(c.id) for c in branch(a_dir, "main")}
    assert "refs/heads/bee-timestamps" in list(cloned.references)
    r = subprocess.run(["git", "--git-dir", str(clone), "fsck", "--strict"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_audit_of_cross_stamped_logs(pair: Pair) -> None:
    """`stampd audit` passes on both servers' logs, from a URL, with keys from the log."""
    a, b, a_dir, b_dir = pair
    # One more stamp so that the newest log commits carry the pinned peer keys.
    stamp_tag(a, "e" * 40)
    stamp_tag(b, "f" * 40)
    wait_for(lambda: "peers" in branch(a_dir, "main")[0].tree, timeout=15, what="a's pin")
    wait_for(lambda: "peers" in branch(b_dir, "main")[0].tree, timeout=15, what="b's pin")
    for server in (a, b):
        r = run_stampd(["audit", server.url + "log.git"], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
