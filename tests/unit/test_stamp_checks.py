"""The checks `stampd stamp` applies to an answer before it verifies the signature, on the golden
stamps (tests/data) and tampered copies of them: pure, no server, no gpg."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.stamp import AnswerRefused, check_branch_answer, check_tag_answer, pin_name

DATA = Path(__file__).resolve().parents[1] / "data"
UID = "stampd Test Key <test@stampd.invalid>"
T = 1795400000
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PARENT = "fedcba9876543210fedcba9876543210fedcba98"
COMMIT256 = "0123456789abcdef0123456789abcdef0123456789abcdef89abcdef89abcdef"
PARENT256 = "fedcba9876543210fedcba9876543210fedcba98765432107654321076543210"


def tag(text: str, now: int = T, commit: str = COMMIT, fmt: str = "openpgp") -> None:
    check_tag_answer(text, commit=commit, tagname="v1.0-stamp", uid=UID, fmt=fmt, now=now)


def branch(text: str, header: str = "gpgsig", now: int = T, sha256: bool | None = None) -> None:
    tree, _ = text.split("\n", 1)
    sha256 = header == "gpgsig-sha256" if sha256 is None else sha256
    check_branch_answer(text, tree=tree[5:], commit=COMMIT256 if sha256 else COMMIT,
                        parent=PARENT256 if sha256 else PARENT, uid=UID, fmt="openpgp",
                        header=header, now=now)


def test_golden_stamps_pass() -> None:
    text = (DATA / "golden-tag.txt").read_text()
    checked = check_tag_answer(text, commit=COMMIT, tagname="v1.0-stamp", uid=UID,
                               fmt="openpgp", now=T + 29)
    assert checked.time == T
    assert checked.payload + checked.signature.encode() == text.encode()
    assert checked.signature.startswith("-----BEGIN PGP SIGNATURE-----\n\n")
    branch((DATA / "golden-branch-parent.txt").read_text())
    b = (DATA / "golden-sha256-branch-parent.txt").read_text()
    branch(b, "gpgsig-sha256")
    checked = check_branch_answer(b, tree=b.split("\n", 1)[0][5:], commit=COMMIT256,
                                  parent=PARENT256, uid=UID, fmt="openpgp",
                                  header="gpgsig-sha256", now=T)
    assert b"gpgsig" not in checked.payload and checked.payload.endswith(b" UTC\n")


@pytest.mark.parametrize(("change", "says"), [
    (lambda t: t, r"is \+30 s off"),  # now = T - 30 below
    (lambda t: t.replace(COMMIT, "1" * 40, 1), "does not start with"),
    (lambda t: t.replace("tag v1.0-stamp", "tag other"), "does not start with"),
    (lambda t: t.replace(" +0000", " +0100"), "expected 'tagger"),
    (lambda t: t.replace("UTC\n", "UTC\n-----BEGIN SSH SIGNATURE-----\nAA==\n"), "more than one"),
    (lambda t: t.replace("-----\n\n", "-----\nVersion: x\n\n", 1), "armor has headers"),
    (lambda t: t.replace("UTC", "UTC\u00e9"), "printable ASCII"),
    (lambda t: t + "x" * 8000, "longer than 8000"),
])
def test_tampered_tags_are_refused(change, says) -> None:  # type: ignore[no-untyped-def]
    text = change((DATA / "golden-tag.txt").read_text())
    with pytest.raises(AnswerRefused, match=says):
        tag(text, now=T - 30 if "+30" in says else T)


def test_ssh_asked_for_pgp_given() -> None:
    with pytest.raises(AnswerRefused, match="carries pgp signature"):
        tag((DATA / "golden-tag.txt").read_text(), fmt="ssh")


@pytest.mark.parametrize(("change", "header", "says"), [
    (lambda t: t, "gpgsig-sha256", "expected 'gpgsig-sha256 -----BEGIN"),  # SHA-1 header
    (lambda t: t.replace(f"parent {PARENT}\n", ""), "gpgsig", "does not start with"),
    (lambda t: t.replace("committer stampd", "committer other"), "gpgsig", "expected 'committer"),
    (lambda t: t.replace("\n\nTimestamp", "\nextra x\n\nTimestamp"), "gpgsig", "more headers"),
    (lambda t: t.replace("\n\nTimestamp", "\ngpgsig x\n\nTimestamp"), "gpgsig", "more headers"),
    (lambda t: t.replace(" \n ", " \n\n ", 1), "gpgsig", "not folded"),
])
def test_tampered_branch_stamps_are_refused(change, header, says) -> None:  # type: ignore[no-untyped-def]
    text = change((DATA / "golden-branch-parent.txt").read_text())
    with pytest.raises(AnswerRefused, match=says):
        branch(text, header, sha256=False)


def test_pin_name_is_git_timestamps() -> None:
    assert pin_name("http://127.0.0.1:8080/") == "127-0-0-1-8080"
    assert pin_name("https://gitta.zeitgitter.net") == "gitta-zeitgitter-net"


def test_the_server_url_of_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare host gets https:// (as `git timestamp` does); a bare host:port is refused in one
    line naming the URL meant (it would become https and fail on TLS); a URL is taken as is."""
    from client.stamp.errors import UsageError
    from client.stamp.remote import server_url

    monkeypatch.delenv("STAMPD_SERVER", raising=False)
    assert server_url(tmp_path, "stamp.example") == "https://stamp.example"
    assert server_url(tmp_path, "http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    with pytest.raises(UsageError, match=r"give http://localhost:8080 \(or https://"):
        server_url(tmp_path, "localhost:8080")
