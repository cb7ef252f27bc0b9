"""`stampd audit` checks the transparency log of a real `stampd serve` (STAMPD_TLOG=on): a good
server audits clean, with the checkpoints it saw kept between runs; a tile or entry bundle
changed on the server's disk, a checkpoint replaced (another key, another root) and an entry
missing from the git log each fail. One server for the module; the checkpoint is replaced in a
copy of its /tlog directory served by a static web server (what the C2SP layout allows), so
that the live server's own files stay as they are."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pygit2
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from client.audit import audit
from client.audit.report import TLOG_CHECK, AuditReport
from client.audit.tlog import TlogOptions
from formats.note import ed25519_signer, parse_note, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.tiles import tiles_for_size
from stampd import cli
from tests.helpers import Server, log_commits, seed_data_dir, stamp_tag, start_server, wait_for
from tests.system.test_audit import main_chain, rewrite, snapshot, tree_of
from tests.system.test_tlog import get, post_digest, vkey

TAG_COMMIT = hashlib.sha1(b"audit tlog commit").hexdigest()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("audit-tlog"))
    s = start_server(data, workers=1, commit_interval=1, extra_env={"STAMPD_TLOG": "on"})
    try:
        post_digest(s, hashlib.sha256(b"audit tlog 1").hexdigest())
        stamp_tag(s, TAG_COMMIT, "audit-tlog")
        last = post_digest(s, hashlib.sha256(b"audit tlog 2").hexdigest())
        assert get(s, f"/v1/proofs/{last}?wait=20")[0] == 200

        def listed() -> bool:  # every stamp in a log commit that pins a checkpoint of them
            commits = log_commits(s.data_dir)
            return bool(commits) and "tlog-checkpoint" in commits[0].tree and any(
                TAG_COMMIT.encode() in c.tree["hashes.log"].data  # type: ignore[attr-defined]
                for c in commits) and Checkpoint.parse(parse_note(
                    commits[0].tree["tlog-checkpoint"].data).text).size >= 3  # type: ignore[attr-defined]

        # The git log commits every second; a commit made before the transparency log had
        # sequenced the stamps pins an older checkpoint (size 0 was seen on a loaded machine),
        # and with no stamp after it no commit follows. Then one more stamp makes one more
        # commit, which pins the checkpoint of all of them.
        for more in range(3):
            with contextlib.suppress(AssertionError):
                wait_for(listed, timeout=10, what="a log commit listing the stamps")
                break
            post_digest(s, hashlib.sha256(b"audit tlog more %d" % more).hexdigest())
        else:
            wait_for(listed, timeout=10, what="a log commit listing the stamps")
        yield s
    finally:
        s.stop()


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}/"


def audit_copy(server: Server, tmp_path: Path, server_url: str | None = None,
               slack: int = 35) -> AuditReport:
    log = snapshot(server.data_dir / "log.git", tmp_path / "log.git")
    return audit(log, tlog=TlogOptions(server=server_url or base(server), slack=slack))


def tlog_rules(report: AuditReport) -> set[str]:
    return {f.rule for f in report.failures_of(TLOG_CHECK)}


def test_a_good_server_audits_clean_and_its_checkpoints_are_kept(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state" / "seen.json"
    argv = ["audit", base(server) + "log.git", "--state", str(state)]
    assert cli.main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    t = report["tlog"]
    assert report["ok"] and t["status"] == "checked" and t["size"] >= 3
    assert t["origin"] == f"127.0.0.1:{server.port}/tlog" and t["vkey"] == vkey(server)
    assert t["entries"]["digest"] >= 2 and t["entries"]["tag"] >= 1
    assert t["tiles"] >= 1 and t["git_checkpoints"] >= 1 and t["seen"] == 0
    seen = json.loads(state.read_text())["logs"][t["origin"]]
    assert seen["vkey"] == vkey(server) and len(seen["checkpoints"]) == 1
    assert cli.main(argv) == 0  # the text report; the stored checkpoint is checked
    text = capsys.readouterr().out
    assert f"tlog: {t['origin']} at size" in text
    assert "1 seen before and 0 witnesses' consistent: ok" in text
    assert "OK: no problems found" in text


def test_tiles_and_bundles_changed_on_the_server_fail(server: Server, tmp_path: Path) -> None:
    size = Checkpoint.parse(parse_note(get(server, "/tlog/checkpoint")[2]).text).size
    tile = next(t for t in tiles_for_size(size) if t.level == 0 and not t.full)
    root = server.data_dir / "tlog"
    for path, rules in ((tile.path(), {"tile"}), (tile.entries_path(), {"root", "entry"})):
        file = root / path
        good = file.read_bytes()
        try:  # one byte of the first hash, or of the first entry's text
            file.write_bytes(good[:40] + bytes([good[40] ^ 1]) + good[41:])
            report = audit_copy(server, tmp_path / path.replace("/", "_"))
        finally:
            file.write_bytes(good)
        assert rules <= tlog_rules(report), report.render()
    # (a changed entry makes a tree whose hash tiles the server's are not: "tile" failures too)
    assert [f.path for f in report.failures_of(TLOG_CHECK) if f.rule == "tile"] == [
        f"/tlog/{tile.path()}"]


@pytest.fixture
def static_copy(server: Server, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A copy of the server's /tlog directory (and its vkey) behind a static web server."""
    site = tmp_path / "site"
    shutil.copytree(server.data_dir / "tlog", site / "tlog")
    (site / "tlog" / "vkey").write_text(vkey(server) + "\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield site / "tlog", f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def test_a_replaced_checkpoint_fails(server: Server, tmp_path: Path,
                                     static_copy: tuple[Path, str]) -> None:
    root, url = static_copy
    assert audit_copy(server, tmp_path / "same", url).ok  # the copy serves the same log
    note = (root / "checkpoint").read_bytes()
    cp = Checkpoint.parse(parse_note(note).text)
    other = Ed25519PrivateKey.from_private_bytes(bytes(32))
    public = other.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    forged = sign_note(cp.body(), [ed25519_signer(cp.origin, public, other.sign)]).encode()
    (root / "checkpoint").write_bytes(forged)  # the same text, signed by another key
    assert tlog_rules(audit_copy(server, tmp_path / "key", url)) == {"checkpoint"}
    root_line = parse_note(note).text.split("\n")[2].encode()
    (root / "checkpoint").write_bytes(  # another root, with the log key's signature
        note.replace(root_line, b"A" * 43 + b"="))
    assert tlog_rules(audit_copy(server, tmp_path / "root", url)) == {"checkpoint"}
    (root / "vkey").unlink()  # a server without a transparency log: no failure
    report = audit_copy(server, tmp_path / "none", url)
    assert report.ok and report.tlog.status == "no transparency log"


def test_an_entry_missing_from_the_git_log_fails(server: Server, tmp_path: Path) -> None:
    listing = next(c for c in log_commits(server.data_dir)
                   if TAG_COMMIT.encode() in c.tree["hashes.log"].data)  # type: ignore[attr-defined]
    # a log commit at least 2 s younger than the one listing the tag stamp (see below)
    wait_for(lambda: time.time() >= listing.commit_time + 2, timeout=10, what="2 s")
    post_digest(server, hashlib.sha256(b"audit tlog later").hexdigest())
    wait_for(lambda: log_commits(server.data_dir)[0].commit_time >= listing.commit_time + 2,
             timeout=30, what="a later log commit")
    log = snapshot(server.data_dir / "log.git", tmp_path / "log.git")
    chain = main_chain(log)
    victim = str(listing.id)
    repo = pygit2.Repository(str(log))
    files = {}
    for e in repo[victim].tree:  # type: ignore[attr-defined]
        if e.type_str == "blob":
            files[e.name] = repo[e.id].data  # type: ignore[attr-defined]
    files["hashes.log"] = files["hashes.log"].replace(TAG_COMMIT.encode() + b"\n", b"")
    parent = rewrite(log, victim, tree=tree_of(log, files))
    for later in chain[chain.index(victim) + 1:]:
        parent = rewrite(log, later, parent=parent)
    repo.references.create("refs/heads/main", parent, force=True)
    # slack 1 s: the server answers within a second, so an entry older than the newest log
    # commit is in it (the default, 35 s, allows for the longest request timeout)
    report = audit(log, tlog=TlogOptions(server=base(server), slack=1))
    missing = [f for f in report.failures_of(TLOG_CHECK) if f.rule == "not-in-git-log"]
    assert len(missing) == 1 and TAG_COMMIT in missing[0].message, report.render()


def test_the_servers_url_is_audited_as_its_log(server: Server, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`stampd audit URL`, URL as `stampd stamp --server` takes it: its log.git and its
    transparency log are audited."""
    for i, url in enumerate((base(server), base(server).rstrip("/"))):
        state = tmp_path / str(i) / "seen.json"
        assert cli.main(["audit", url, "--json", "--state", str(state)]) == 0, \
            capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert report["target"] == base(server) + "log.git"
        assert report["ok"] and report["log"] and report["tlog"]["status"] == "checked"


def test_a_log_url_without_git_is_cloned_as_it_is(server: Server, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A log served at a URL that does not end in .git (a mirror) is still audited: only a
    URL that is no log is taken as a server's."""
    site = tmp_path / "site"
    site.mkdir()
    snapshot(server.data_dir / "log.git", site / "mirror")
    subprocess.run(["git", "--git-dir", str(site / "mirror"), "update-server-info"],
                   check=True, timeout=60)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/mirror"
        assert cli.main(["audit", url, "--json", "--no-tlog"]) == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert report["target"] == url and report["ok"] and report["log"]
        # Neither a log nor a server's: one line naming both URLs tried.
        assert cli.main(["audit", f"{url}-gone", "--no-tlog"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{url}-gone/log.git" in err, err
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_before_the_first_log_commit_the_transparency_log_is_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new server's git log waits an hour for its first commit, its transparency log has
    entries from the first second: the audit checks the transparency log, prints its report,
    and exits 3 (the git log: nothing to check yet) when it passes, 1 when it fails."""
    from tests.helpers import RoutesServer

    s = start_server(seed_data_dir(tmp_path / "data"), workers=1,
                     extra_env={"STAMPD_TLOG": "on"})
    bad = RoutesServer({"/tlog/vkey": (200, b"not a key\n", {})})
    try:
        serial = post_digest(s, hashlib.sha256(b"before the first log commit").hexdigest())
        assert get(s, f"/v1/proofs/{serial}?wait=20")[0] == 200
        assert log_commits(s.data_dir) == []
        state = ["--state", str(tmp_path / "seen.json")]
        assert cli.main(["audit", base(s), *state]) == 3
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and "nothing to check yet" in err, err
        assert "the transparency log (size 1) was checked meanwhile: ok" in err, err
        assert f"tlog: 127.0.0.1:{s.port}/tlog at size 1: signed checkpoint" in out, out
        assert "no log commit yet" in out and "OK" in out, out
        assert cli.main(["audit", base(s), "--json", *state]) == 3
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] and report["head"] is None and report["log"] == []
        assert report["tlog"]["status"] == "checked" and report["tlog"]["seen"] == 1
        # A transparency log that fails fails the audit, log commit or none.
        assert cli.main(["audit", base(s), "--server", bad.url, *state]) == 1
        out, err = capsys.readouterr()
        assert "[tlog/vkey]" in out and "FAILED" in out, out
        # --no-tlog: nothing is checked, as before.
        assert cli.main(["audit", base(s), "--no-tlog"]) == 3
        out, err = capsys.readouterr()
        assert out == "" and "nothing to check yet" in err, err
    finally:
        bad.close()
        s.stop()
