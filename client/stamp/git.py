"""git as ``stampd stamp`` runs it: plumbing commands in the repository, its config, object
names resolved."""

from __future__ import annotations

import subprocess
from pathlib import Path

from client.stamp.errors import StampFailed


def git(repo: Path, *args: str, input: str | None = None, failure: type[StampFailed] =
        StampFailed) -> str:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                           text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise StampFailed("git is not installed") from None
    if r.returncode != 0:
        detail = r.stderr.strip().splitlines()
        raise failure(f"git {' '.join(args[:2])}: {detail[-1] if detail else r.returncode}")
    return r.stdout.strip()


def git_config(repo: Path, name: str) -> str | None:
    try:
        return git(repo, "config", "--get", name) or None
    except StampFailed:
        return None


def resolve(repo: Path, name: str, kind: str) -> str | None:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{{kind}}}")
    except StampFailed:
        return None

