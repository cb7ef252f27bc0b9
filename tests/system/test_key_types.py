"""Each family of key GnuPG 2.2 signs with, end to end: a server whose primary key is of that
type, stamped by the real `git timestamp` client (tag, then a branch stamp; a second, merging
one for two types), and the results checked by git verify-tag / verify-commit. Every type of
`KEY_TYPES` is checked at the packet level with gpg --verify, leading-zero values included, in
tests/integration/test_agents.py; here one type of each family (EdDSA, RSA, ECDSA on a NIST
curve and on a Brainpool curve, DSA), since what git and the client add does not depend on
the curve or the size (a server per type cost the suite ~60 s of CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import (
    KeyMaker,
    Server,
    client,
    git,
    make_repo,
    seed_data_dir,
    start_server,
)

# The branch commit of a second stamp merges the first: its signing differs in nothing but the
# parents, so two types make it (test_interop makes merge chains with the default key too).
MERGE_TYPES = ("ed25519", "rsa2048")


# ECDSA at 521 bits: the one size that is not a whole number of bytes.
FAMILIES = ("ed25519", "rsa2048", "nistp521", "brainpoolP256r1", "dsa2048")


@pytest.mark.parametrize("key_type", FAMILIES)
def test_real_client_and_git_accept(key_type: str, keys: KeyMaker,
                                    tmp_path: Path, server_factory: list[Server]) -> None:
    key = keys.get(key_type)
    data = seed_data_dir(tmp_path / "data", key.secret_file, key.public_file)
    server = start_server(data, workers=1)
    server_factory.append(server)

    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    url = server.url.rstrip("/")
    r = client(repo, home, "--server", url, "--tag", "stamp")
    assert r.returncode == 0, r.stdout + r.stderr
    git(repo, "verify-tag", "stamp", env=env)
    r = client(repo, home, "--server", url, "--branch", "ts")
    assert r.returncode == 0, r.stdout + r.stderr
    if key_type in MERGE_TYPES:  # a second branch stamp: a merge of the first and the new
        (repo / "b.txt").write_text("b\n")
        git(repo, "add", "b.txt")
        git(repo, "commit", "-q", "-m", "two")
        r = client(repo, home, "--server", url, "--branch", "ts")
        assert r.returncode == 0, r.stdout + r.stderr
    out = git(repo, "verify-commit", "--raw", "ts", env=env)
    assert f"VALIDSIG {key.fingerprint}" in out
    parents = 2 if key_type in MERGE_TYPES else 1
    assert len(git(repo, "log", "-1", "--format=%P", "ts").split()) == parents
