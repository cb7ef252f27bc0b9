"""The real `git timestamp` client (PyPI git-timestamp 1.2.2) against a live stampd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TEST_FPR, Server

GIT_TIMESTAMP = Path(sys.executable).parent / "git-timestamp"


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60,
                       env=env, check=False)
    assert r.returncode == 0, f"git {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout + r.stderr


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Tester")
    git(path, "config", "user.email", "tester@example.invalid")
    (path / "a.txt").write_text("hello\n")
    git(path, "add", "a.txt")
    git(path, "commit", "-q", "-m", "first")
    return path


def client(repo: Path, gnupg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert GIT_TIMESTAMP.exists(), "git-timestamp (test dependency) is not installed"
    return subprocess.run([str(GIT_TIMESTAMP), "--gnupg-home", str(gnupg), *args], cwd=repo,
                          capture_output=True, text=True, timeout=120, check=False)


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
