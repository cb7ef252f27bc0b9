"""Golden vectors: with a fixed clock and the fixed ed25519 test key, stamps are byte-exact.

Ed25519 signatures are deterministic, so the whole signed object is fixed. The vectors in
tests/data/golden-*.txt were produced by this code and checked once with gpg and git; this test
re-checks them with gpg every run, so a wrong vector cannot hide here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from formats.frames import FrameBuffer
from formats.jobs import job_frame
from formats.keys import PRIMARY, ServedKey
from server.stamping.requests import BranchRequest, StampContext, TagRequest
from tests.helpers import (
    DATA,
    TEST_FPR,
    TEST_PUBLIC_KEY,
    TEST_UID,
    keyring,
    verify_stamp,
    verify_stamps,
)
from workers.loop import sign_many
from workers.signer import OpenPgpSigner

T = 1795400000  # after the test key was made (gpg rejects older signatures)
URL = "http://127.0.0.1:8080/"
# What a stamp's job is built with: the test key (OpenPGP: its own user id), at time T.
CTX = StampContext(T, 1, ServedKey(PRIMARY, "openpgp", TEST_FPR, "eddsa (ed25519)", "pub",
                                   TEST_UID, primary=True), URL)
C = "0123456789abcdef0123456789abcdef01234567"
TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
P = "fedcba9876543210fedcba9876543210fedcba98"

# SHA-256 repositories: 64-hex ids (the empty tree's SHA-256 id), gpgsig-sha256.
C64 = C + "89abcdef" * 3
TREE64 = "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321"
P64 = P + "76543210" * 3

CASES = {
    "tag": TagRequest(commit=C, tagname="v1.0-stamp"),
    "branch": BranchRequest(commit=C, tree=TREE),
    "branch-parent": BranchRequest(commit=C, tree=TREE, parent=P),
    "sha256-tag": TagRequest(commit=C64, tagname="v1.0-stamp"),
    "sha256-branch-parent": BranchRequest(commit=C64, tree=TREE64, parent=P64),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_vector(openpgp_signer: OpenPgpSigner, name: str, tmp_path: Path) -> None:
    text = openpgp_signer.build(CASES[name].job(CTX))
    golden = DATA / f"golden-{name}.txt"
    if os.environ.get("STAMPD_WRITE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()
    v = verify_stamp(text, keyring(TEST_PUBLIC_KEY, tmp_path / "g"))
    assert v.fingerprint == TEST_FPR
    assert v.created == T


def test_a_batch_is_signed_in_one_round_trip_byte_exactly(
        openpgp_signer: OpenPgpSigner) -> None:
    """A worker signs every job that has arrived with one agent round trip: each answer is
    the golden vector of its job, in order, and a malformed job among them is refused alone."""
    names = sorted(CASES)
    frames = FrameBuffer()  # as a worker reads them (a manifest's lines after its frame)
    frames.feed(b"".join(job_frame(10 + i, CASES[name].job(CTX)) for i, name in enumerate(names)))
    messages = [m for _ in names if (m := frames.next()) is not None]
    messages.insert(2, {"id": 99, "op": "tag", "commit": "not hex", "tagname": "x",
                        "time": T, "message": "m\n"})
    results = sign_many(openpgp_signer, messages)
    assert [r.id for r in results] == [m["id"] for m in messages]
    refused = results.pop(2)
    assert refused.object is None and "malformed job" in str(refused.error)
    assert [r.object for r in results] == [(DATA / f"golden-{name}.txt").read_text()
                                           for name in names]


def test_golden_tag_layout() -> None:
    text = (DATA / "golden-tag.txt").read_text()
    assert text.startswith(
        f"object {C}\ntype commit\ntag v1.0-stamp\ntagger {TEST_UID} {T} +0000\n\n"
    )
    assert "\n-----BEGIN PGP SIGNATURE-----\n\n" in text
    assert text.endswith("-----END PGP SIGNATURE-----\n")


def test_golden_branch_layout() -> None:
    text = (DATA / "golden-branch-parent.txt").read_text()
    ident = f"{TEST_UID} {T} +0000"
    assert text.startswith(
        f"tree {TREE}\nparent {P}\nparent {C}\nauthor {ident}\ncommitter {ident}\n"
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n"
    )
    assert " -----END PGP SIGNATURE-----\n\n" in text


def test_golden_objects_pass_git(tmp_path: Path) -> None:
    """git accepts the golden commit as a well-formed, signed commit object."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True, timeout=30)
    env = {**os.environ, "GNUPGHOME": str(keyring(TEST_PUBLIC_KEY, tmp_path / "g"))}
    blob = (DATA / "golden-branch.txt").read_bytes()
    oid = subprocess.run(["git", "--git-dir", str(repo), "hash-object", "-t", "commit", "-w",
                          "--literally", "--stdin"], input=blob, capture_output=True,
                         check=True, timeout=30).stdout.decode().strip()
    r = subprocess.run(["git", "--git-dir", str(repo), "verify-commit", "--raw", oid],
                       capture_output=True, text=True, env=env, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    assert f"VALIDSIG {TEST_FPR}" in r.stderr


def test_golden_sha256_objects_pass_git(tmp_path: Path) -> None:
    """In a SHA-256 repository git finds the signature of the golden commit in gpgsig-sha256
    and of the golden tag after its message, and names them by their SHA-256."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "--bare", "--object-format=sha256", str(repo)],
                   check=True, timeout=30)
    env = {**os.environ, "GNUPGHOME": str(keyring(TEST_PUBLIC_KEY, tmp_path / "g"))}
    text = (DATA / "golden-sha256-branch-parent.txt").read_text()
    assert f"committer {TEST_UID} {T} +0000\ngpgsig-sha256 -----BEGIN PGP SIGNATURE-----\n \n" \
        in text
    for kind, name in (("commit", "sha256-branch-parent"), ("tag", "sha256-tag")):
        blob = (DATA / f"golden-{name}.txt").read_bytes()
        oid = subprocess.run(["git", "--git-dir", str(repo), "hash-object", "-t", kind, "-w",
                              "--literally", "--stdin"], input=blob, capture_output=True,
                             check=True, timeout=30).stdout.decode().strip()
        job = CASES[name].job(CTX)
        assert oid == job.object_id(blob) and len(oid) == 64
        r = subprocess.run(["git", "--git-dir", str(repo), f"verify-{kind}", "--raw", oid],
                           capture_output=True, text=True, env=env, timeout=30, check=False)
        assert r.returncode == 0, r.stderr
        assert f"VALIDSIG {TEST_FPR}" in r.stderr


def test_batch_verification_agrees_with_gpg_verify(tmp_path: Path) -> None:
    """The tests' batch verifier (`verify_stamps`, one gpg process for many stamps) accepts
    what `gpg --verify` accepts and refuses a stamp whose signed part was changed."""
    gnupg = keyring(TEST_PUBLIC_KEY, tmp_path / "g")
    texts = [(DATA / f"golden-{name}.txt").read_text() for name in sorted(CASES)]
    assert verify_stamps(texts, gnupg) == [verify_stamp(t, gnupg) for t in texts]
    tampered = texts[0].replace("Timestamp of commit", "Timestamp of komit", 1)
    with pytest.raises(AssertionError, match="1 of 2 good"):
        verify_stamps([texts[1], tampered], gnupg)
