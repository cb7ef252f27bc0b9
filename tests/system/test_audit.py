"""`stampd audit` against real logs: stampd servers cross-stamp each other, then copies of their
logs are tampered with. Real git, gpg and servers throughout; nothing is mocked.

The servers of this module (A with the fixed test key, B and C with keys they generate) run
once for the whole module and are stopped by PID at its end: starting them per test would
triple the run time. Tests work on copies of consistent snapshots (``git clone --mirror``) of
the logs, and ask the running servers for signatures when they need signed objects.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pygit2
import pytest
from pygit2.enums import FileMode, ObjectType

from client.audit import (
    FILES_CHECK,
    MAIN_CHECK,
    PEERS_CHECK,
    AuditReport,
    EmptyLog,
    TargetError,
    audit,
)
from stampd import cli
from tests.helpers import (
    TEST_FPR,
    TEST_PUBLIC_KEY,
    Server,
    branch,
    free_port,
    seed_data_dir,
    stamp_tag,
    start_server,
    wait_for,
)

MAIN = "refs/heads/main"
ROUNDS = 3


# -- helpers --------------------------------------------------------------------------------
def stamp_branch(server: Server, commit: str, tree: str, parent: str | None = None) -> bytes:
    """A stamp-branch-v1 answer: a commit object signed by ``server``."""
    fields = {"request": "stamp-branch-v1", "commit": commit, "tree": tree}
    if parent:
        fields["parent"] = parent
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/", body=urllib.parse.urlencode(fields),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert r.status == 200, body
    return body


def stamp_digest(server: Server, algorithm: str, digest: str) -> None:
    """A digest stamp (/v1/stamps), so that the log commit gets a digests.log."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/stamps", body=urllib.parse.urlencode({algorithm: digest}),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert r.status == 200, body


def head(git_dir: Path, ref: str = MAIN) -> str | None:
    repo = pygit2.Repository(str(git_dir))
    try:
        return str(repo.references[ref].target)
    except KeyError:
        return None


def put(git_dir: Path, ref: str, raw: bytes) -> str:
    """Store a raw commit object and point ``ref`` at it."""
    repo = pygit2.Repository(str(git_dir))
    oid = repo.odb.write(ObjectType.COMMIT, raw)
    repo.references.create(ref, oid, force=True)
    return str(oid)


def cross_stamp(stamper: Server, name: str, log_git: Path) -> str:
    """Have ``stamper`` stamp the log's main head onto branch ``<name>-timestamps``."""
    repo = pygit2.Repository(str(log_git))
    main = repo[repo.references[MAIN].target]
    assert isinstance(main, pygit2.Commit)
    ref = f"refs/heads/{name}-timestamps"
    raw = stamp_branch(stamper, str(main.id), str(main.tree_id), head(log_git, ref))
    return put(log_git, ref, raw)


def tree_of(git_dir: Path, files: dict[str, bytes]) -> str:
    """Write a tree (paths may have one directory level) and return its id."""
    repo = pygit2.Repository(str(git_dir))
    top = repo.TreeBuilder()
    subdirs: dict[str, pygit2.TreeBuilder] = {}
    for path, data in files.items():
        blob = repo.create_blob(data)
        if "/" in path:
            d, name = path.split("/", 1)
            subdirs.setdefault(d, repo.TreeBuilder()).insert(name, blob, FileMode.BLOB)
        else:
            top.insert(path, blob, FileMode.BLOB)
    for d, builder in subdirs.items():
        top.insert(d, builder.write(), FileMode.TREE)
    return str(top.write())


def tree_id(git_dir: Path, commit: str) -> str:
    c = pygit2.Repository(str(git_dir))[commit]
    assert isinstance(c, pygit2.Commit)
    return str(c.tree_id)


def blob_at(git_dir: Path, commit: str, path: str) -> bytes:
    repo = pygit2.Repository(str(git_dir))
    c = repo[commit]
    assert isinstance(c, pygit2.Commit)
    obj = repo[c.tree[path].id]
    assert isinstance(obj, pygit2.Blob)
    return obj.data


def rewrite(git_dir: Path, commit: str, *, tree: str | None = None,
            parent: str | None = None) -> str:
    """Copy a commit object byte for byte (its signature included) with another tree/parent."""
    repo = pygit2.Repository(str(git_dir))
    c = repo[commit]
    assert isinstance(c, pygit2.Commit)
    raw = c.read_raw()
    if tree:
        raw = raw.replace(f"tree {c.tree_id}\n".encode(), f"tree {tree}\n".encode(), 1)
    if parent:
        old = c.parent_ids[0]
        raw = raw.replace(f"parent {old}\n".encode(), f"parent {parent}\n".encode(), 1)
    return str(repo.odb.write(ObjectType.COMMIT, raw))


def main_chain(git_dir: Path) -> list[str]:
    """Main commits, oldest first."""
    out = subprocess.run(["git", "--git-dir", str(git_dir), "rev-list", "--first-parent",
                          "--reverse", "main"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def run_cmd(target: Path | str, peer_keys: Path | None = None, as_json: bool = False) -> int:
    """`stampd audit` through the command line's one error path (exit codes as documented)."""
    argv = ["audit", str(target)] + (["--json"] if as_json else [])
    argv += ["--peer-keys", str(peer_keys)] if peer_keys is not None else []
    return cli.main(argv)


def messages(report: AuditReport, check: str) -> list[str]:
    return [str(f) for f in report.failures_of(check)]


NAMED_FAILURE = re.compile(r"\[(main|files|peers)/[a-z-]+\] [0-9a-f]{40}[ :]")


def assert_named(report: AuditReport) -> None:
    """Every failure names the commit it concerns and the rule it breaks, in the report's
    text and in its JSON."""
    assert report.failures
    for f in report.failures:
        assert NAMED_FAILURE.match(str(f)), str(f)
        assert f.rule and re.fullmatch(r"[0-9a-f]{40}", f.commit), f
    text = report.render()
    for f in report.failures:
        assert f"  {f}" in text
    for f in report.to_dict()["failures"]:
        assert f["rule"] and f["commit"], f


def snapshot(git_dir: Path, dest: Path) -> Path:
    """A consistent copy of a live log (every ref at one moment)."""
    subprocess.run(["git", "clone", "--mirror", "--quiet", str(git_dir), str(dest)], check=True,
                   timeout=60)
    return dest


# -- the network of servers -------------------------------------------------------------------
@dataclass
class Net:
    a: Server
    b: Server
    c: Server
    snap_a: Path  # mirror of A's log: main + b-timestamps
    snap_b: Path  # mirror of B's log: main + a-timestamps
    keys_for_a: Path  # directory with b.asc
    keys_for_b: Path  # directory with a.asc
    b_key: Path
    c_key: Path
    stamped_a: list[str]  # A's main commits stamped by B, in order

    def copy(self, tmp_path: Path, which: str = "a") -> Path:
        dest = tmp_path / f"{which}-copy.git"
        shutil.copytree(self.snap_a if which == "a" else self.snap_b, dest)
        return dest


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    base = tmp_path_factory.mktemp("audit")
    servers: list[Server] = []
    try:
        a = start_server(seed_data_dir(base / "a"), workers=1, commit_interval=2, wait=False,
                         api_processes=2)
        servers.append(a)
        b = start_server(base / "b", workers=1, commit_interval=2, wait=False,
                         api_processes=2)
        servers.append(b)
        c = start_server(base / "c", workers=1, commit_interval=3600, wait=False)
        servers.append(c)
        for s in servers:
            s.wait_ready()
        a_log, b_log = base / "a/log.git", base / "b/log.git"

        stamped_a = []
        for i in range(ROUNDS):
            before = head(a_log), head(b_log)
            stamp_tag(a, f"{0xa0 + i:040x}")
            stamp_tag(b, f"{0xb0 + i:040x}")
            if i == 0:
                stamp_digest(a, "sha512", "5" * 128)
                stamp_digest(a, "sha256", "2" * 64)
            wait_for(lambda before=before: head(a_log) not in (None, before[0])
                     and head(b_log) not in (None, before[1]),
                     what=f"log commits of round {i}")
            stamp = cross_stamp(b, "b", a_log)
            stamped_a.append(str(pygit2.Repository(str(a_log))[stamp].parent_ids[-1]))
            cross_stamp(a, "a", b_log)
        # One more log commit of A that no peer has stamped yet.
        before_a = head(a_log)
        stamp_tag(a, "c" * 40)
        wait_for(lambda: head(a_log) != before_a, what="A's last log commit")

        snaps = {}
        for name, log in (("a", a_log), ("b", b_log)):
            snaps[name] = base / f"snap-{name}.git"
            subprocess.run(["git", "clone", "--mirror", "--quiet", str(log), str(snaps[name])],
                           check=True, timeout=60)
        keys_for_a, keys_for_b = base / "keys-for-a", base / "keys-for-b"
        keys_for_a.mkdir()
        keys_for_b.mkdir()
        shutil.copy(base / "b/keys/pubkey.asc", keys_for_a / "b.asc")
        shutil.copy(TEST_PUBLIC_KEY, keys_for_b / "a.asc")
        yield Net(a, b, c, snaps["a"], snaps["b"], keys_for_a, keys_for_b,
                  base / "b/keys/pubkey.asc", base / "c/keys/pubkey.asc", stamped_a)
    finally:
        for s in servers:
            s.stop()
            shutil.rmtree(s.runtime_dir, ignore_errors=True)


# -- good logs --------------------------------------------------------------------------------
def test_cross_stamped_logs_pass_and_report_windows(
    net: Net, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = audit(net.snap_a, net.keys_for_a)
    assert report.ok, report.render()
    chain = main_chain(net.snap_a)
    assert [e.commit for e in report.log] == chain
    assert len(chain) >= ROUNDS + 1
    assert report.fingerprint == TEST_FPR
    assert [(p.name, p.ref, p.commits, p.valid) for p in report.peers] == [
        ("b", "refs/heads/b-timestamps", ROUNDS, ROUNDS)]
    assert report.peers[0].key_source == str(net.keys_for_a / "b.asc")
    assert all(e.number is not None for e in report.log)
    # The real server's digests.log is checked: both digests, in one log commit or two (a
    # commit may fall between the two stamps: the interval is 2 s).
    assert sum(e.digests for e in report.log) == 2

    # Each commit is covered by the first stamp of it or of a later commit; the commits
    # after the last stamped one (at least the one made after the rounds) are uncovered.
    last_stamped = chain.index(net.stamped_a[-1])
    assert report.uncovered == chain[last_stamped + 1:]
    assert report.uncovered
    for i, entry in enumerate(report.log[:last_stamped + 1]):
        first = next(s for s in net.stamped_a if chain.index(s) >= i)
        assert entry.stamp is not None and entry.stamp.peer == "b"
        assert entry.stamp.stamped == first
        assert entry.window == entry.stamp.time - entry.time
        assert entry.window is not None and entry.window >= 0

    # B's log, stamped by A, passes too.
    report_b = audit(net.snap_b, net.keys_for_b)
    assert report_b.ok, report_b.render()
    assert [(p.name, p.valid, p.fingerprint) for p in report_b.peers] == [
        ("a", ROUNDS, TEST_FPR)]

    # The command: human table, and JSON.
    assert run_cmd(net.snap_a, net.keys_for_a) == 0
    out = capsys.readouterr().out
    assert "main: " in out and "files: " in out and "peer b (refs/heads/b-timestamps)" in out
    assert "uncovered" in out and chain[0][:12] in out and "OK: no problems found" in out
    assert run_cmd(net.snap_a, net.keys_for_a, as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["failures"] == []
    assert data["uncovered"] == report.uncovered
    assert data["log"][0]["stamp"]["peer"] == "b"
    assert data["log"][0]["window"] == report.log[0].window

    # A non-bare clone: main is local, the peer branch is under refs/remotes/origin/.
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "--quiet", str(net.snap_a), str(work)], check=True,
                   timeout=60)
    report_w = audit(work, net.keys_for_a)
    assert report_w.ok, report_w.render()
    assert [p.ref for p in report_w.peers] == ["refs/remotes/origin/b-timestamps"]


def test_peer_key_pinned_in_the_log(net: Net, tmp_path: Path) -> None:
    """A main commit holding peers/b.asc (signed by the server key) pins B's key."""
    log = net.copy(tmp_path)
    tip = main_chain(log)[-1]
    tree = tree_of(log, {"hashes.log": b"", "pubkey.asc": TEST_PUBLIC_KEY.read_bytes(),
                         "peers/b.asc": net.b_key.read_bytes()})
    put(log, MAIN, stamp_branch(net.a, tip, tree))
    report = audit(log)
    assert report.ok, report.render()
    assert report.peers[0].fingerprint is not None
    assert report.peers[0].key_source == f"peers/b.asc in {main_chain(log)[-1]}"

    # An auditor's key that contradicts the log's pin is a failure.
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(net.c_key, other / "b.asc")
    report = audit(log, other)
    assert not report.ok
    # (and, the auditor's key winning, B's stamps do not verify)
    assert [(f.rule, f.commit, f.path) for f in report.failures] == [
        ("key-mismatch", main_chain(log)[-1], "peers/b.asc")] + [
        ("bad-signature", f.commit, None) for f in report.failures[1:]]
    assert len(report.failures) == 1 + ROUNDS
    assert any("the log pins" in m for m in messages(report, PEERS_CHECK))
    assert_named(report)


# -- tampering --------------------------------------------------------------------------------
def test_modified_hashes_log_fails(net: Net, tmp_path: Path) -> None:
    log = net.copy(tmp_path)
    chain = main_chain(log)
    victim = chain[1]
    hashes = blob_at(log, victim, "hashes.log")
    forged = b"".join(sorted([*hashes.splitlines(keepends=True), b"0" * 40 + b"\n"]))
    tree = tree_of(log, {"hashes.log": forged,
                         "pubkey.asc": blob_at(log, victim, "pubkey.asc")})
    new = rewrite(log, victim, tree=tree)
    parent = new
    for later in chain[2:]:  # re-point the rest of main onto the forged commit
        parent = rewrite(log, later, parent=parent)
    pygit2.Repository(str(log)).references.create(MAIN, parent, force=True)

    report = audit(log, net.keys_for_a)
    assert not report.ok
    main_failures = report.failures_of(MAIN_CHECK)
    assert main_failures[0].commit == new
    assert "BAD signature" in main_failures[0].message
    assert len(main_failures) == len(chain) - 1  # every rewritten commit
    assert not report.failures_of(FILES_CHECK)  # the forged file itself is well-formed
    # B's stamps of the original commits no longer stamp the main branch.
    assert any("not a commit of the main branch" in m for m in messages(report, PEERS_CHECK))
    assert_named(report)
    assert run_cmd(log, net.keys_for_a) == 1


def test_unsigned_commit_fails(net: Net, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    log = net.copy(tmp_path)
    repo = pygit2.Repository(str(log))
    tip = repo[repo.references[MAIN].target]
    assert isinstance(tip, pygit2.Commit)
    sig = pygit2.Signature("stampd Test Key", "test@stampd.invalid", int(time.time()), 0)
    oid = repo.create_commit(MAIN, sig, sig, "stampd log commit 999\n", tip.tree_id, [tip.id])
    report = audit(log, net.keys_for_a)
    assert [(f.check, f.commit) for f in report.failures] == [(MAIN_CHECK, str(oid))]
    assert "not signed" in report.failures[0].message
    assert report.failures[0].rule == "unsigned"
    assert_named(report)
    assert report.log[-1].commit == str(oid) and report.log[-1].stamp is None
    assert run_cmd(log, net.keys_for_a) == 1
    out = capsys.readouterr().out
    assert f"{oid}: is not signed (no gpgsig header)" in out and "FAILED" in out


def test_malformed_files_in_a_signed_commit_fail(net: Net, tmp_path: Path) -> None:
    """The server key signs a commit (a branch stamp) whose tree has an unsorted hashes.log
    and a bad digests.log: the signature holds, the file checks fail."""
    log = net.copy(tmp_path)
    tip = main_chain(log)[-1]
    tree = tree_of(log, {
        "hashes.log": ("b" * 40 + "\n" + "a" * 40 + "\n" + "a" * 40 + "\n").encode(),
        "digests.log": ("sha256 " + "0" * 64 + "\nmd5 " + "0" * 32 + "\n").encode(),
        "pubkey.asc": TEST_PUBLIC_KEY.read_bytes(),
    })
    signed = put(log, MAIN, stamp_branch(net.a, tip, tree))
    report = audit(log, net.keys_for_a)
    assert not report.failures_of(MAIN_CHECK), report.render()
    files = report.failures_of(FILES_CHECK)
    assert {(f.commit, f.path) for f in files} == {(signed, "hashes.log"),
                                                   (signed, "digests.log")}
    text = messages(report, FILES_CHECK)
    assert any("hashes.log: line 2 is not sorted" in m for m in text)
    assert any("hashes.log: line 3 repeats line 2" in m for m in text)
    assert any("digests.log: line 2 is not 'sha1|sha256|sha384|sha512" in m for m in text)
    assert_named(report)
    assert run_cmd(log, net.keys_for_a) == 1


def test_server_key_change_fails(net: Net, tmp_path: Path) -> None:
    """A commit correctly signed by the key of its own pubkey.asc, but another server's."""
    log = net.copy(tmp_path)
    tip = main_chain(log)[-1]
    tree = tree_of(log, {"hashes.log": b"", "pubkey.asc": net.c_key.read_bytes()})
    changed = put(log, MAIN, stamp_branch(net.c, tip, tree))
    report = audit(log, net.keys_for_a)
    assert [f.commit for f in report.failures] == [changed]
    assert f"server key changed at {changed}" in report.failures[0].message
    assert report.failures[0].rule == "key-changed"
    assert_named(report)
    assert report.fingerprint == TEST_FPR


def test_peer_stamp_by_wrong_key_fails(net: Net, tmp_path: Path) -> None:
    """C (not B) stamps A's head; the stamp lands on branch b-timestamps."""
    log = net.copy(tmp_path)
    ref = "refs/heads/b-timestamps"
    chain = main_chain(log)
    repo = pygit2.Repository(str(log))
    tip = repo[chain[-1]]
    assert isinstance(tip, pygit2.Commit)
    wrong = put(log, ref, stamp_branch(net.c, chain[-1], str(tip.tree_id), head(log, ref)))
    report = audit(log, net.keys_for_a)
    assert [(f.check, f.ref, f.commit) for f in report.failures] == [(PEERS_CHECK, ref, wrong)]
    assert "does not verify with peer b's key" in report.failures[0].message
    assert "made by key" in report.failures[0].message
    assert_named(report)
    assert report.peers[0].commits == ROUNDS + 1 and report.peers[0].valid == ROUNDS
    assert report.log[-1].stamp is None  # the forged stamp covers nothing
    assert run_cmd(log, net.keys_for_a) == 1


def test_malformed_peer_stamp_fails(net: Net, tmp_path: Path) -> None:
    """A stamp by B's key of a commit that is not on main (and with a foreign tree)."""
    log = net.copy(tmp_path)
    ref = "refs/heads/b-timestamps"
    stranger = tree_of(log, {"hashes.log": b""})
    odd = put(log, ref, stamp_branch(net.b, "e" * 40, stranger, head(log, ref)))
    report = audit(log, net.keys_for_a)
    assert [(f.check, f.commit) for f in report.failures] == [(PEERS_CHECK, odd)]
    assert f"stamps {'e' * 40}, which is not a commit of the main branch" in str(
        report.failures[0])
    assert_named(report)


def test_peer_without_key_fails(net: Net, tmp_path: Path) -> None:
    """A's log never publishes B's key (A has no STAMPD_PEERS): B's stamps of main commits
    that have later main commits cannot be verified, a failure naming the newest of them."""
    ref = "refs/heads/b-timestamps"
    report = audit(net.snap_a)
    assert [(f.check, f.rule, f.ref, f.commit) for f in report.failures] == [
        (PEERS_CHECK, "key-missing", ref, head(net.snap_a, ref))]
    assert "no pinned key for peer b" in report.failures[0].message
    assert report.peers[0].valid == 0 and len(report.uncovered) == len(report.log)
    assert_named(report)
    empty = tmp_path / "none"
    empty.mkdir()
    assert run_cmd(net.snap_a, empty) == 1

    # A stamp of the head (which could not publish a key pinned after it) does not excuse
    # the earlier stamps: only a branch that stamps nothing but the head awaits the key.
    log = net.copy(tmp_path)
    newest_of_older = head(log, ref)
    cross_stamp(net.b, "b", log)
    report = audit(log)
    assert [(f.rule, f.commit) for f in report.failures] == [("key-missing", newest_of_older)]
    assert report.peers[0].pending == 1 and report.peers[0].valid == 0


# -- a fresh log with a TOFU-pinned peer (issue: audit fails on healthy logs) --------------------
def test_fresh_log_with_a_tofu_pinned_peer(net: Net, tmp_path: Path,
                                          server_factory: list[Server]) -> None:
    """D pins B's key on first contact (no fingerprint in STAMPD_PEERS), after its first log
    commit was made: the first stamp stamps a main commit whose tree has no peers/b.asc, and the
    log publishes the key from its next commit on. Audited right after the first cross-stamp,
    the log is healthy; once published, the key must verify every stamp, the first included."""
    d_dir = seed_data_dir(tmp_path / "d")  # the test key, as A's: A signs forged commits below
    d = start_server(d_dir, workers=1, commit_interval=2,
                     extra_env={"STAMPD_PEERS": f"b={net.b.url}"})
    server_factory.append(d)
    d_log, ref = d_dir / "log.git", "refs/heads/b-timestamps"
    stamp_tag(d, "d" * 40)
    wait_for(lambda: head(d_log, ref) is not None, what="B's first stamp of D's log")
    fresh = snapshot(d_log, tmp_path / "fresh.git")
    l1 = main_chain(fresh)
    assert len(l1) == 1 and "peers" not in pygit2.Repository(str(fresh))[l1[0]].tree

    report = audit(fresh)
    assert report.ok, report.render()
    assert [(p.commits, p.valid, p.pending, p.fingerprint) for p in report.peers] == [
        (1, 0, 1, None)]
    assert report.uncovered == l1  # a stamp that was not verified covers nothing
    assert "awaiting" in report.render()
    assert run_cmd(d.url + "log.git") == 0  # the case: the served log, by URL
    # With the auditor's own copy of B's key the stamp is verified already.
    report = audit(fresh, net.keys_for_a)
    assert report.ok, report.render()
    assert (report.peers[0].valid, report.peers[0].pending, report.uncovered) == (1, 0, [])

    # The next log commit publishes the key; it verifies the stamp of the commit before it.
    stamp_tag(d, "e" * 40)
    wait_for(lambda: len(branch(d_dir, "b-timestamps")) >= 2, what="B's second stamp")
    later = snapshot(d_log, tmp_path / "later.git")
    chain = main_chain(later)
    assert len(chain) == 2
    report = audit(later)
    assert report.ok, report.render()
    b_fpr = report.peers[0].fingerprint
    assert b_fpr is not None and b_fpr == audit(later, net.keys_for_a).peers[0].fingerprint
    assert [(p.commits, p.valid, p.pending, p.key_source) for p in report.peers] == [
        (2, 2, 0, f"peers/b.asc in {chain[1]}")]
    assert report.log[0].stamp is not None and report.log[0].stamp.stamped == chain[0]
    assert report.uncovered == []
    d.stop()

    pubkey = blob_at(later, chain[0], "pubkey.asc")
    # A key that appears later must be the one that made the earlier stamps: C stamps L1.
    log = tmp_path / "wrong-first.git"
    shutil.copytree(later, log)
    first = put(log, ref, stamp_branch(net.c, chain[0], tree_id(log, chain[0])))
    put(log, ref, stamp_branch(net.b, chain[1], tree_id(log, chain[1]), first))
    report = audit(log)
    assert [(f.rule, f.commit) for f in report.failures] == [("bad-signature", first)]
    assert f"with peer b's key {b_fpr}" in report.failures[0].message
    assert_named(report)

    # The log publishing another key for the peer later is a failure at that commit.
    log = tmp_path / "changed.git"
    shutil.copytree(later, log)
    tree = tree_of(log, {"hashes.log": b"", "pubkey.asc": pubkey,
                         "peers/b.asc": net.c_key.read_bytes()})
    changed = put(log, MAIN, stamp_branch(net.a, chain[1], tree))
    report = audit(log)
    assert [(f.check, f.rule, f.commit, f.path) for f in report.failures] == [
        (PEERS_CHECK, "key-changed", changed, "peers/b.asc")]
    assert b_fpr in report.failures[0].message
    assert_named(report)

    # Without a key: a stamp of a main commit that has a later one fails (a commit made after
    # the pin publishes the key), even in an otherwise fresh log.
    log = tmp_path / "unpublished.git"
    shutil.copytree(fresh, log)
    tree = tree_of(log, {"hashes.log": b"", "pubkey.asc": pubkey})
    put(log, MAIN, stamp_branch(net.a, l1[0], tree))
    report = audit(log)
    assert [(f.rule, f.commit) for f in report.failures] == [("key-missing", head(log, ref))]
    assert_named(report)


# -- clones and fetches ------------------------------------------------------------------------
def test_fetched_clone_audits_what_the_remote_published(net: Net, tmp_path: Path) -> None:
    """`git fetch` moves refs/remotes/origin/*, not the local main: the audit must check what
    the remote published (origin's main and peer branches), not a stale local main against
    origin's newer peer branch."""
    a_log = net.a.data_dir / "log.git"
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "--quiet", net.a.url + "log.git", str(work)], check=True,
                   timeout=60)
    cloned = head(work / ".git")
    assert cloned is not None
    stamp_tag(net.a, "f" * 40)
    wait_for(lambda: head(a_log) != cloned, what="a log commit of A after the clone")
    cross_stamp(net.b, "b", a_log)
    subprocess.run(["git", "-C", str(work), "fetch", "--quiet"], check=True, timeout=60)
    fetched = head(work / ".git", "refs/remotes/origin/main")
    assert head(work / ".git") == cloned != fetched  # fetched, not pulled

    stamp = pygit2.Repository(str(work))[head(work / ".git", "refs/remotes/origin/b-timestamps")]
    assert isinstance(stamp, pygit2.Commit)
    stamped = str(stamp.parent_ids[-1])
    assert stamped not in main_chain(work / ".git")  # local main is stale

    report = audit(work, net.keys_for_a)
    assert report.ok, report.render()
    assert (report.main_ref, report.head) == ("refs/remotes/origin/main", fetched)
    assert [(p.ref, p.commits, p.valid) for p in report.peers] == [
        ("refs/remotes/origin/b-timestamps", ROUNDS + 1, ROUNDS + 1)]
    entry = next(e for e in report.log if e.commit == stamped)
    assert entry.stamp is not None and entry.stamp.commit == str(stamp.id)
    assert run_cmd(work, net.keys_for_a) == 0

    # Several remotes: the remote of main's upstream, else origin.
    subprocess.run(["git", "-C", str(work), "remote", "add", "old", str(net.snap_a)],
                   check=True)
    subprocess.run(["git", "-C", str(work), "fetch", "--quiet", "old"], check=True, timeout=60)
    assert audit(work, net.keys_for_a).main_ref == "refs/remotes/origin/main"
    subprocess.run(["git", "-C", str(work), "branch", "--quiet", "--set-upstream-to=old/main",
                    "main"], check=True)
    report = audit(work, net.keys_for_a)
    assert report.ok, report.render()
    assert (report.main_ref, report.head) == ("refs/remotes/old/main", head(net.snap_a))
    assert [p.ref for p in report.peers] == ["refs/remotes/old/b-timestamps"]


# -- targets --------------------------------------------------------------------------------
def test_unreadable_targets_exit_2(net: Net, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert run_cmd(plain) == 2
    assert run_cmd(tmp_path / "missing") == 2
    # A directory inside a repository is not that repository.
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "--quiet", str(net.snap_a), str(work)], check=True,
                   timeout=60)
    (work / "sub").mkdir()
    assert run_cmd(work / "sub") == 2
    # A repository without any branch is a log before its first commit: nothing to check yet.
    empty = tmp_path / "empty.git"
    pygit2.init_repository(str(empty), bare=True, initial_head="main")
    assert run_cmd(empty) == 3
    with pytest.raises(EmptyLog, match="the log has no commit yet"):
        audit(empty)
    # One with branches but no main is no log.
    no_main = tmp_path / "no-main.git"
    repo = pygit2.init_repository(str(no_main), bare=True, initial_head="main")
    who = pygit2.Signature("t", "t@example.invalid", 1, 0)
    repo.create_commit("refs/heads/other", who, who, "x", repo.TreeBuilder().write(), [])
    assert run_cmd(no_main) == 2
    with pytest.raises(TargetError, match="no 'main' branch"):
        audit(no_main)
    err = capsys.readouterr().err
    assert "is not a readable git repository" in err and "has no 'main' branch" in err
    assert f"stampd audit: {empty}: the log has no commit yet" in err
    assert run_cmd(f"http://127.0.0.1:{free_port()}/log.git") == 2


def test_audit_by_url_over_loopback_http(net: Net, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The URL form clones first (git's dumb HTTP protocol from a static server here)."""
    root = tmp_path / "www"
    root.mkdir()
    served = root / "log.git"
    shutil.copytree(net.snap_a, served)
    subprocess.run(["git", "--git-dir", str(served), "update-server-info"], check=True)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                             str(port), "--directory", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, timeout=20, what="the static HTTP server")
        url = f"http://127.0.0.1:{port}/log.git"
        assert run_cmd(url, net.keys_for_a, as_json=True) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == url and data["ok"] is True
    assert data["peers"][0]["valid"] == ROUNDS
