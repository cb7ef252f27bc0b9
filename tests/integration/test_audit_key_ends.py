"""`stampd audit`'s checks of signatures by a key that has ended since
(client/audit/signatures.py): the log's and the peers' commits (real ``git verify-commit``) and
an email timestamper's clear-signed replies (real gpg), with the test key's signed golden
commit (made 2026-11-24), a message it clear-signed (tests/data/test-key-clearsigned.asc, made
with gpg's clock at 2026-12-01) and its real revocation certificates (tests/data, made
2026-12-03 with gpg --gen-revoke). git and gpg fail them all; the rule of docs/signatures.md
decides instead: a soft revocation after the signature leaves it valid, a hard one never does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from client.audit.signatures import Keyrings, verify_cleartext, verify_commit
from tests.helpers import DATA, TEST_FPR, TEST_PUBLIC_KEY

SIGNED_AT = 1795400000  # the golden commit's signature time (its committer time too)


@pytest.fixture
def golden(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository holding the golden signed commit (its tree and parent absent: git
    verifies a commit's signature from the object alone); its git dir and id."""
    git_dir = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True, timeout=60)
    r = subprocess.run(["git", "--git-dir", str(git_dir), "hash-object", "-t", "commit", "-w",
                        "--stdin"], input=(DATA / "golden-branch.txt").read_bytes(),
                       capture_output=True, check=True, timeout=60)
    return git_dir, r.stdout.decode().strip()


def key_with(*revocations: str) -> bytes:
    return TEST_PUBLIC_KEY.read_bytes() + b"".join(
        (DATA / name).read_bytes() for name in revocations)


def check(golden: tuple[Path, str], *revocations: str) -> tuple[bool, str | None, int | None]:
    with Keyrings() as keyrings:
        found = verify_commit(golden[0], golden[1], keyrings.get(key_with(*revocations)))
    return found.valid, found.problem, found.created


def check_reply(*revocations: str) -> tuple[bool, str | None, int | None]:
    with Keyrings() as keyrings:
        found = verify_cleartext((DATA / "test-key-clearsigned.asc").read_bytes(),
                                 keyrings.get(key_with(*revocations)))
    assert found.text.startswith("stampd test fixture: a message clear-signed")
    return found.valid, found.problem, found.created


CLEARSIGNED_AT = 1796083200  # 2026-12-01T00:00:00Z


def test_an_email_timestampers_reply_signed_before_its_key_was_superseded_stays_valid() -> None:
    assert check_reply() == (True, None, CLEARSIGNED_AT)
    assert check_reply("test-key-revoked-superseded.asc") == (True, None, CLEARSIGNED_AT)
    valid, problem, _ = check_reply("test-key-revoked-compromised.asc")
    assert not valid and problem is not None and "a hard revocation" in problem, problem


def test_a_signature_by_the_key_before_it_was_revoked_as_superseded_stays_valid(
        golden: tuple[Path, str]) -> None:
    assert check(golden) == (True, None, SIGNED_AT)
    # git itself refuses it now (REVKEYSIG: exit 1); the key was not revoked when it signed.
    assert check(golden, "test-key-revoked-superseded.asc") == (True, None, SIGNED_AT)


def test_a_signature_by_a_key_revoked_as_compromised_is_refused_whenever_made(
        golden: tuple[Path, str]) -> None:
    valid, problem, _ = check(golden, "test-key-revoked-compromised.asc")
    assert not valid
    assert problem is not None and f"made by revoked key {TEST_FPR[-16:]}" in problem \
        and "a hard revocation" in problem and "compromised" in problem.lower(), problem
