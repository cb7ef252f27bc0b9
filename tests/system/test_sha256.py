"""Stamps of SHA-256 repositories (``git init --object-format=sha256``) beside SHA-1 ones: tag and
branch stamps, OpenPGP and SSH, requested with curl as the hook does, stored as the hook stores
them and checked by git itself; the journal and the log record the 64-hex ids."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.audit import audit
from stampd import cli
from tests.helpers import (
    TEST_FPR,
    TEST_PUBLIC_KEY,
    Server,
    git,
    keyring,
    logged_hashes,
    make_repo,
    require_tools,
    seed_data_dir,
    start_server,
    wait_for,
)

FORMATS = ["sha1", "sha256"]
SIGNERS = ["openpgp", "ssh"]


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    require_tools("git", "curl", "gpg", "ssh-keygen")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("sha256") / "data")
    s = start_server(data, workers=1, extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519"},
                     commit_interval=2)
    s.wait_ready(workers=2)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ssh_key(server: Server) -> dict[str, str]:
    with urllib.request.urlopen(server.url + "v1/keys", timeout=10) as r:
        keys = {k["id"]: k for k in json.loads(r.read())["keys"]}
    return dict(keys["ssh-ed25519"])


@pytest.fixture(scope="module")
def gnupg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return keyring(TEST_PUBLIC_KEY, tmp_path_factory.mktemp("ring") / "gnupg")


def curl(server: Server, *fields: str) -> tuple[int, str]:
    """A form POST the way the hook sends it: ``curl --data name=value ...``."""
    args = [a for f in fields for a in ("--data", f)]
    r = subprocess.run(["curl", "-q", "--silent", "--max-time", "30", "--write-out",
                        "\n%{http_code}", *args, "--url", server.url],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    body, _, code = r.stdout.rpartition("\n")
    return int(code), body


def journal(server: Server, sql: str, *args: object) -> list[tuple[object, ...]]:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return list(db.execute(sql, args).fetchall())


def recorded_object_id(server: Server, commit: str, kind: str) -> str:
    def signed() -> bool:
        return bool(journal(server, "select object_id from stamps where [commit] = ? and kind = ? "
                                    "and object_id is not null", commit, kind))

    wait_for(signed, what="the stamp's object id in the journal")
    rows = journal(server, "select object_id from stamps where [commit] = ? and kind = ?",
                   commit, kind)
    assert len(rows) == 1, rows
    return str(rows[0][0])


@pytest.mark.parametrize("signer", SIGNERS)
@pytest.mark.parametrize("object_format", FORMATS)
def test_tag_and_branch_stamps_verify_with_git(server: Server, ssh_key: dict[str, str],
                                               gnupg: Path, tmp_path: Path,
                                               object_format: str, signer: str) -> None:
    repo = make_repo(tmp_path / "repo", object_format)
    digits = 64 if object_format == "sha256" else 40
    env = None
    choice: tuple[str, ...] = ()
    if signer == "ssh":
        (tmp_path / "allowed_signers").write_text(ssh_key["allowed_signers"])
        git(repo, "config", "gpg.format", "ssh")
        git(repo, "config", "gpg.ssh.allowedSignersFile", str(tmp_path / "allowed_signers"))
        choice = ("format=ssh",)
    else:
        env = {**os.environ, "GNUPGHOME": str(gnupg)}
    head = stamped = git(repo, "rev-parse", "HEAD").strip()
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    assert len(head) == len(tree) == digits

    # A tag stamp, stored with git mktag (which checks the object) and update-ref.
    code, tag = curl(server, "request=stamp-tag-v1", f"commit={head}", "tagname=stamp",
                     *choice)
    assert code == 200, tag
    assert tag.startswith(f"object {head}\ntype commit\ntag stamp\ntagger ")
    begin = "-----BEGIN SSH SIGNATURE-----" if signer == "ssh" else "-----BEGIN PGP SIGNATURE-----"
    assert tag.count(f"\n{begin}\n") == 1
    oid = git(repo, "mktag", input=tag).strip()
    assert len(oid) == digits
    git(repo, "update-ref", "refs/tags/stamp", oid, "")
    out = git(repo, "verify-tag", "--raw", "stamp", env=env)
    assert (ssh_key["fingerprint"] if signer == "ssh" else f"VALIDSIG {TEST_FPR}") in out
    assert recorded_object_id(server, head, "tag") == oid

    # A branch stamp, then a second one chained to it (parent = the branch's head).
    header = "gpgsig-sha256" if object_format == "sha256" else "gpgsig"
    parent = ""
    for n in range(2):
        fields = ["request=stamp-branch-v1", f"commit={head}", f"tree={tree}", *choice]
        if parent:
            fields.append(f"parent={parent}")
        code, stamp = curl(server, *fields)
        assert code == 200, stamp
        assert stamp.startswith(f"tree {tree}\n" + (f"parent {parent}\n" if parent else "")
                                + f"parent {head}\nauthor ")
        assert f"\n{header} {begin}\n" in stamp
        assert stamp.count("\ngpgsig") == 1
        new = git(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=stamp).strip()
        git(repo, "update-ref", "refs/heads/stamps", new, parent or "")
        out = git(repo, "verify-commit", "--raw", new, env=env)
        assert (ssh_key["fingerprint"] if signer == "ssh" else f"VALIDSIG {TEST_FPR}") in out
        if n == 0:
            assert recorded_object_id(server, head, "branch") == new
        parent = new
        (repo / "b.txt").write_text(f"{n}\n")
        git(repo, "add", "b.txt")
        git(repo, "commit", "-q", "-m", f"next {n}")
        head = git(repo, "rev-parse", "HEAD").strip()
        tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    git(repo, "fsck", "--strict", "--no-dangling")

    if signer == "openpgp":
        for target in ("stamp", "stamps"):
            assert cli.main(["verify", target, "--repo", str(repo),
                             "--key", str(TEST_PUBLIC_KEY)]) == 0

    # The log records the ids as they were sent, 40 or 64 hex digits, one per line.
    wait_for(lambda: stamped in logged_hashes(server.data_dir), timeout=60,
             what="the stamped commit in hashes.log")
    if object_format == "sha256":
        report = audit(server.data_dir / "log.git")
        assert report.ok, report.render()


@pytest.mark.parametrize("ids", [("a" * 64, "b" * 40, None), ("a" * 40, "b" * 64, None),
                                 ("a" * 64, "b" * 64, "c" * 40), ("a" * 40, "b" * 40, "c" * 64)])
def test_mixed_lengths_are_refused_and_not_journaled(server: Server,
                                                     ids: tuple[str, str, str | None]) -> None:
    before = journal(server, "select count(*) from stamps")
    commit, tree, parent = ids
    fields = ["request=stamp-branch-v1", f"commit={commit}", f"tree={tree}"]
    if parent:
        fields.append(f"parent={parent}")
    code, body = curl(server, *fields)
    assert code == 406
    assert "must all be SHA-1 (40 hex digits) or all SHA-256 (64)" in body
    for bad in ("a" * 63, "a" * 65, "A" * 64):
        code, body = curl(server, "request=stamp-tag-v1", f"commit={bad}", "tagname=t")
        assert code == 406 and "40 (SHA-1) or 64 (SHA-256)" in body
    assert journal(server, "select count(*) from stamps") == before
