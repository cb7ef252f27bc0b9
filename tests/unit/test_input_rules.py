"""Input rules, pure: every unparsable or ambiguous body or header is a `BadRequest` (never
another exception), and a tag name is accepted exactly when git accepts ``refs/tags/<name>``."""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import stat
import string
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from server import db
from server.api.body import content_type
from server.api.stamps import JSON, URLENCODED, parse_digest_body
from server.api.zeitgitter import parse_stamp_request
from server.errors import BadRequest, InvalidTagName
from server.stamping.requests import TagRequest

C = "0123456789abcdef0123456789abcdef01234567"
H256 = "ab" * 32
FORM_CT = b"application/x-www-form-urlencoded"

# --- /v1 bodies -------------------------------------------------------------------------------

UNPARSABLE_JSON = {
    "nested arrays": b"[" * 999,
    "nested arrays, closed": b"[" * 999 + b"]" * 999,
    "nested objects": b'{"a":' * 999,
    "nested objects, closed": b'{"a":' * 500 + b"1" + b"}" * 500,
    "nested in a value": b'{"sha256":' + b"[" * 999 + b"]" * 999 + b"}",
    "truncated": b'{"sha256": "',
    "not utf-8": b'{"sha256": "\xff"}',
    "trailing garbage": b'{"sha256": "' + H256.encode() + b'"} x',
}


@pytest.mark.parametrize("name", sorted(UNPARSABLE_JSON))
def test_unparsable_json_is_bad_request(name: str) -> None:
    with pytest.raises(BadRequest):
        parse_digest_body(JSON, UNPARSABLE_JSON[name])


def test_duplicate_json_key_refused() -> None:
    body = b'{"sha256": "' + H256.encode() + b'", "sha256": "' + H256.encode() + b'"}'
    with pytest.raises(BadRequest, match="more than once"):
        parse_digest_body(JSON, body)


@pytest.mark.parametrize("body", [
    b'{"format": "openpgp", "format": "ssh", "sha256": "' + H256.encode() + b'"}',
    b'{"key": "x", "sha256": "' + H256.encode() + b'", "key": "y"}',
])
def test_duplicate_json_choice_key_refused(body: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_digest_body(JSON, body)


def test_duplicate_form_field_refused() -> None:
    """The same rule for both body types: a field given twice is refused."""
    with pytest.raises(BadRequest):
        parse_digest_body(URLENCODED, f"sha256={H256}&sha256={H256}".encode())


def test_single_fields_still_accepted() -> None:
    for ctype, body in [(JSON, b'{"sha256": "' + H256.encode() + b'"}'),
                        (URLENCODED, f"sha256={H256}".encode())]:
        req, choice = parse_digest_body(ctype, body)
        assert (req.algorithm, req.digest, choice) == ("sha256", H256, {})


# --- headers ----------------------------------------------------------------------------------


def test_content_type_single_headers() -> None:
    assert content_type([(b"content-type", FORM_CT + b"; charset=x"),
                         (b"content-length", b"12")]) == (FORM_CT.decode(), "12")
    assert content_type([]) == ("", None)


@pytest.mark.parametrize("headers", [
    [(b"content-type", FORM_CT), (b"content-type", b"multipart/form-data; boundary=x")],
    [(b"content-type", FORM_CT), (b"content-type", FORM_CT)],
    [(b"content-type", FORM_CT), (b"content-length", b"3"), (b"content-length", b"3")],
    [(b"content-type", FORM_CT), (b"content-length", b"3"), (b"content-length", b"30")],
], ids=["two types", "same type twice", "same length twice", "two lengths"])
def test_duplicate_headers_refused(headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(BadRequest, match="more than once"):
        content_type(headers)


# --- tag names against git ---------------------------------------------------------------------

ALPHABET_RE = re.compile(r"[_a-zA-Z][-._a-zA-Z0-9]{0,99}")
FIRST = "_" + string.ascii_letters
REST = "-._" + string.ascii_letters + string.digits


def accepts(name: str) -> bool:
    try:
        req = parse_stamp_request({"request": ["stamp-tag-v1"], "commit": [C],
                                   "tagname": [name]})
    except InvalidTagName as e:
        assert e.message.startswith("field 'tagname' must match [_a-zA-Z][-._a-zA-Z0-9]{0,99}")
        return False
    assert req == TagRequest(C, name)
    return True


@pytest.mark.parametrize(("name", "ok"), [
    ("a.lock", False), ("a.", False), ("a..b", False), ("v1.0.", False), ("x.lock.", False),
    ("_.lock", False), ("a" * 95 + ".lock", False), ("a.b.lock", False),
    ("a.LOCK", True), ("a.lockx", True), ("a.lock.b", True), ("lock", True), ("alock", True),
    ("a-lock", True), ("a.lo", True), ("v1.0", True), ("a" * 100, True), ("_", True),
    ("a-", True), ("a_", True), ("a.-", True),
])
def test_tag_name_edge_cases(name: str, ok: bool) -> None:
    assert accepts(name) is ok


def test_tag_name_message_names_the_rules() -> None:
    with pytest.raises(InvalidTagName) as e:
        parse_stamp_request({"request": ["stamp-tag-v1"], "commit": [C], "tagname": ["a.lock"]})
    assert e.value.message == ("field 'tagname' must match [_a-zA-Z][-._a-zA-Z0-9]{0,99}, "
                               "contain no '..' and not end in '.' or '.lock'")


def generated_names() -> list[str]:
    """A deterministic set of a few thousand names: every name up to 4 characters over a
    reduced alphabet with one character of each class (letters of both cases, digit, '_', '-',
    '.'), names around 'lock' and '.lock', names at the length limit, and seeded random names
    over the whole alphabet, dense in dots; plus names outside the alphabet."""
    first, rest = "aZ_", "aZ_0-."
    names = set()
    for n in range(0, 4):
        for head in first:
            names.update(head + "".join(t) for t in itertools.product(rest, repeat=n))
    tails = ["lock", "LOCK", "Lock", "loc", "lockk", ".lock", "..lock", ".lock.", ".lock.lock",
             ".lock-", ".lock_", ".lock0", ".LOCK", ".locK", "lock.", "-lock", "_.lock", "..",
             ".", "...", ".-.", "._."]
    for head, tail in itertools.product(["a", "_", "Z0", "a.", "a-", "a.b", "l"], tails):
        names.add(head + tail)
    for n in (95, 96, 98, 99, 100, 101):
        names.update({"a" * n, "a" * (n - 1) + ".", "a" * (n - 5) + ".lock",
                      "a" * (n - 2) + "..", "a" * (n - 3) + ".b"})
    rng = random.Random(20240611)
    pool = REST + "." * 12 + ".lock" * 2
    for _ in range(500):
        n = rng.choice([1, 2, 3, 5, 8, 13, 40, 99])
        names.add(rng.choice(FIRST) + "".join(rng.choice(pool) for _ in range(n))[:n])
    names.update(["", "-a", ".a", "0a", "a/b", "a b", "a~1", "a^", "a:b", "a?", "a*", "a[",
                  "a\\b", "a@{1}", "@", "a\n", "\u00e9", "a" * 101, "a\x00"])
    return sorted(names)


def git_accepts(names: list[str]) -> dict[str, bool]:
    git = shutil.which("git")
    assert git, "git is required for this test"

    def check(name: str) -> bool:
        r = subprocess.run([git, "check-ref-format", f"refs/tags/{name}"],
                           capture_output=True, check=False)
        return r.returncode == 0

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(names, pool.map(check, names), strict=True))


def test_tag_names_follow_git() -> None:
    """Accepted iff the alphabet matches and `git check-ref-format refs/tags/<name>` agrees."""
    names = generated_names()
    assert len(names) > 1200
    in_alphabet = [n for n in names if ALPHABET_RE.fullmatch(n)]
    git = git_accepts(in_alphabet)
    assert any(git.values()) and not all(git.values())
    wrong = [n for n in names if accepts(n) != (ALPHABET_RE.fullmatch(n) is not None
                                                and git[n])]
    assert not wrong, f"{len(wrong)} names judged unlike git, e.g. {wrong[:10]}"


# --- the SQLite database file ------------------------------------------------------------------


def test_sqlite_database_created_0600(tmp_path: Path) -> None:
    path = tmp_path / "stampd.sqlite3"
    old = os.umask(0o022)
    try:
        engine = db.make_engine(f"sqlite:///{path}")
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("create table t (x integer)")
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            assert all(f.exists() for f in files)
            modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
        finally:
            engine.dispose()
    finally:
        os.umask(old)
    assert modes == {f.name: 0o600 for f in files}


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_sqlite_memory_urls_untouched(url: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    engine = db.make_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("select 1").scalar() == 1
    engine.dispose()
    assert list(tmp_path.iterdir()) == []
