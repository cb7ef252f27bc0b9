"""The real `git timestamp` client (PyPI git-timestamp 1.2.2) against a live stampd."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import TEST_FPR, Server, client, git, make_repo


def test_git_timestamp_client_tag_and_branches(live_server: Server, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    gnupg = tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    url = live_server.url.rstrip("/")

    r = client(repo, gnupg, "--server", url, "--tag", "stamp-1")
    assert r.returncode == 0, r.stdout + r.stderr
    git(repo, "verify-tag", "stamp-1", env=env)
    tag = git(repo, "cat-file", "tag", "stamp-1")
    assert tag.startswith(f"object {git(repo, 'rev-parse', 'HEAD').strip()}\ntype commit\n")
    # The client pinned our key (trust on first use).
    keyid = git(repo, "config", "--global", "--get-regexp", r"timestamper\..*\.keyid")
    assert TEST_FPR[-16:] in keyid.upper()

    r = client(repo, gnupg, "--server", url, "--branch", "ts")
    assert r.returncode == 0, r.stdout + r.stderr
    first = git(repo, "rev-parse", "ts").strip()
    git(repo, "verify-commit", "ts", env=env)

    (repo / "b.txt").write_text("more\n")
    git(repo, "add", "b.txt")
    git(repo, "commit", "-q", "-m", "second")
    r = client(repo, gnupg, "--server", url, "--branch", "ts")
    assert r.returncode == 0, r.stdout + r.stderr
    git(repo, "verify-commit", "ts", env=env)
    parents = git(repo, "log", "-1", "--format=%P", "ts").split()
    assert parents == [first, git(repo, "rev-parse", "main").strip()]
    head = git(repo, "cat-file", "commit", "ts")
    assert head.count("gpgsig -----BEGIN PGP SIGNATURE-----\n \n") == 1
    git(repo, "fsck", "--strict", "--no-dangling", env=env)
