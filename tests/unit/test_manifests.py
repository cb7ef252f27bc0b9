"""Manifest lines (formats/manifests.py): what is taken, what is refused and which
line numbers the refusal names; the header, the splice, the digest buckets; and the OpenAPI
body pattern, which must take exactly what the parser takes."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path

import pytest

from formats.manifests import (
    MAX_LINE,
    MAX_REPORTED,
    Header,
    MalformedManifest,
    buckets,
    check_lines,
    check_structure,
    key_prefix,
    pack,
    packed_contains,
    parse_body,
    parse_header,
    splice,
    unpack,
)
from server.api.manifests import MANIFEST_PATTERN

H256 = hashlib.sha256(b"a").hexdigest()
H512 = hashlib.sha512(b"a").hexdigest()
G256 = hashlib.sha256(b"b").hexdigest()


def refused(body: bytes) -> MalformedManifest:
    with pytest.raises(MalformedManifest) as e:
        parse_body(body)
    return e.value


@pytest.mark.parametrize(("body", "algorithm", "digests"), [
    (f"{H256}  a.txt\n", "sha256", [H256]),                        # text mode
    (f"{H256} *a.bin\n", "sha256", [H256]),                        # binary mode
    (f"{H256}\n", "sha256", [H256]),                               # no name
    (f"SHA256 (a b.txt) = {H256}\n", "sha256", [H256]),            # BSD (--tag)
    (f"SHA256 () = {H256}\n", "sha256", [H256]),                   # BSD, empty name
    (f"\\{H256}  a\\\\b\n", "sha256", [H256]),                      # coreutils' escaped name
    (f"\\SHA256 (a\\nb) = {H256}\n", "sha256", [H256]),
    (f"{H256}  ü ñ/名前 x\n", "sha256", [H256]),                    # UTF-8, inner spaces
    (f"{H512}  a\n{H512} *b\nSHA512 (c) = {H512}\n{H512}\n", "sha512", [H512] * 4),
    (f"{H256}  a\n{G256}  b\n{H256}  a\n", "sha256", [H256, G256, H256]),  # duplicates kept
    (f"{H256}  a\n{G256}  b", "sha256", [H256, G256]),                # no final LF
])
def test_lines_taken(body: str, algorithm: str, digests: list[str]) -> None:
    m = parse_body(body.encode())
    assert (m.algorithm, unpack(m.digests, m.width), m.lines) == (algorithm, digests,
                                                                len(digests))
    assert m.text == body if body.endswith("\n") else body + "\n"
    assert re.fullmatch(MANIFEST_PATTERN, body)  # the OpenAPI description takes it too
    assert check_structure(m.text, algorithm) == m.lines  # and the worker's check


@pytest.mark.parametrize(("body", "bad"), [
    (f"{H256}  a\n{H256.upper()}  b\n", [2]),                      # uppercase hex
    (f"{H256}  a\n# a comment\n{H256}  c\n", [2]),                 # a '#' line (header forgery)
    (f"# stampd manifest v1\n{H256}  a\n", [1]),
    (f"{H256}  a\n{H256}  b \n", [2]),                              # trailing space in a name
    (f"{H256}  a\n{H256}  b\t\n", [2]),                             # trailing tab
    (f"{H256}  a\n{H512}  b\n", [2]),                               # mixed: the first decides
    (f"{H512}  a\n{H256}  b\n{H256}  c\n", [2, 3]),
    (f"{H256}  a\tb\n{H256}  c\x7f\n{H256}  \x1bd\n", [1, 2, 3]),   # control characters
    (f"{H256}  a\r\n", [1]),                                        # CRLF
    (f"{H256}  a\n\n{H256}  b\n", [2]),                             # an empty line
    (f"{H256[:-1]}  a\n{H256}0  b\n", [1, 2]),                      # wrong length
    (f"{H256}a\n{H256} a\n{H256}   a\n", [1, 2]),                   # one space then no mode
    (f"SHA512 (a) = {H256}\n", [1]),                                # tag and length disagree
    (f"sha256 (a) = {H256}\n", [1]),
    (f"{H256}  ok\n-----BEGIN PGP SIGNATURE-----\n", [2]),
])
def test_bad_lines_named(body: str, bad: list[int]) -> None:
    e = refused(body.encode())
    assert (e.bad, e.count) == (bad, len(bad))
    assert f"line {', '.join(map(str, bad))}" in str(e)
    assert not re.fullmatch(MANIFEST_PATTERN, body)
    for algorithm in ("sha256", "sha512"):  # the worker's check refuses it too
        with pytest.raises(MalformedManifest):
            check_structure(body, algorithm)


def test_what_names_no_line() -> None:
    for body in (b"", b"\n", b" \n\t"):
        assert refused(body).count == 0


def test_a_bad_first_line_does_not_make_every_line_bad() -> None:
    # The algorithm is then the first good line's.
    e = refused(f"hello\n{H512}  a\n{H256}  b\n".encode())
    assert e.bad == [1, 3] and "sha512 checksum lines" in str(e)
    e = refused(b"hello\nworld\n")  # no good line: no algorithm to hold them to
    assert e.bad == [1, 2] and "sha256 or sha512" in str(e)


def test_not_utf8_names_its_lines() -> None:
    e = refused(f"{H256}  a\n{H256}  \xff\n{H256}  b\n".encode("latin-1"))
    assert (e.bad, e.count) == ([2], 1) and "UTF-8" in str(e)


def test_at_most_twenty_line_numbers() -> None:
    e = refused(f"{H256}  ok\n".encode() + b"X\n" * 30)
    assert e.bad == list(range(2, 2 + MAX_REPORTED)) and e.count == 30
    assert str(e).endswith(", ...")


def test_a_line_longer_than_max_line() -> None:
    assert parse_body(f"{H256}  {'n' * (MAX_LINE - 66)}\n".encode()).lines == 1
    e = refused(f"{H256}  {'n' * (MAX_LINE - 65)}\n".encode())
    assert e.bad == [1]


def test_check_lines_holds_the_algorithm_given() -> None:
    assert check_lines(f"{H256}  a\n", "sha256").digests == bytes.fromhex(H256)
    with pytest.raises(MalformedManifest):
        check_lines(f"{H256}  a\n", "sha512")
    with pytest.raises(MalformedManifest):
        check_lines(f"{H256}  a\n", "md5")
    with pytest.raises(MalformedManifest):
        check_lines(f"{H256}  a")  # the worker takes only whole lines


def test_header_round_trip_and_splice() -> None:
    h = Header("sha512", 1_700_000_000, "https://stamp.example/", 42, "A" * 40, 3)
    text = h.text()
    assert text.startswith("# stampd manifest v1\n") and "# utc: 2023-11-14T22:13:20Z\n" in text
    assert parse_header(text + "more") == h
    with pytest.raises(MalformedManifest):
        parse_header(text.replace("22:13:20", "22:13:21"))  # utc and time disagree
    with pytest.raises(MalformedManifest):
        parse_header(text.replace("# serial: 42", "# serial: 042"))
    lines = f"{H512}  a\n"
    assert splice(f"BEGIN\n{text}SIG\n", text, lines) == f"BEGIN\n{text}{lines}SIG\n"
    for answer in ("BEGIN\nSIG\n", f"{text}{text}SIG\n"):  # the header none or twice
        with pytest.raises(MalformedManifest):
            splice(answer, text, lines)


def test_buckets_hold_each_digest_once_sorted() -> None:
    digests = [hashlib.sha256(i.to_bytes(4, "big")).hexdigest() for i in range(5000)]
    rows = buckets(pack(digests + digests[:100]), 32)
    # (random digests: about 76 in each 16-bit bucket, none split)
    assert [key_prefix(b) for b, _ in rows] == sorted({bytes.fromhex(d[:4]) for d in digests})
    assert sum(len(p) for _, p in rows) == 32 * len(digests)
    by_prefix = {key_prefix(b): p for b, p in rows}

    def row_of(d: str) -> bytes:
        return by_prefix.get(bytes.fromhex(d[:4]), b"")

    for d in digests[:50]:
        got = unpack(row_of(d), 32)
        assert d in got and got == sorted(got)
        assert packed_contains(row_of(d), d)
    absent = hashlib.sha256(b"absent").hexdigest()
    assert not packed_contains(row_of(absent), absent)
    near = digests[0][:-2] + ("00" if digests[0][-2:] != "00" else "01")  # same bucket
    assert not packed_contains(row_of(digests[0]), near)


def test_worker_check_survives_cpython_possessive_group_bug() -> None:
    """The body schemathesis found: with capturing groups inside the worker's possessive
    repeat, CPython 3.11's re raised SystemError (a 500)."""
    body = ("\\0e4db991bdc882a1dfc78ca04ef77a95e212a0e17f4a0ae8daf10d41468027fd  \U000c322fĝd"
            "\U000bcc327¤\U000a742a\x9b¨\U000996e0ç9^y\n\\db2591b626c0e157424a53d82c60039f464c4"
            "3a273a19b98260c325f2ef43495 *\x84ĊM\x9a/Ã\nSHA256 (\U000fd02eĒA\U000f05f8) = f08dfbf"
            "34b0db30fb2c788daed25285b01b1699208d998178cfe188801aa7d95\n")
    assert check_structure(parse_body(body.encode()).text, "sha256") == 3


def test_not_utf8_without_a_final_newline_names_every_bad_line() -> None:
    body = (b"\xff\n" * 25) + f"{H256}  a\n".encode() + b"\xfe"
    e = refused(body)
    assert (e.bad, e.count) == (list(range(1, 21)), 26)
    assert str(e) == "26 line(s) are not UTF-8: line " + ", ".join(map(str, range(1, 21)))
    assert refused(b"\n\xff").bad == [2]  # (an empty first line, a bad last one)


def test_a_body_in_a_buffer_without_its_last_newline() -> None:
    m = parse_body(bytearray(f"{H256}  a\n{H512[:64]} *b".encode()))
    assert (m.text, m.lines, m.width) == (f"{H256}  a\n{H512[:64]} *b\n", 2, 32)
    assert m.digests == bytes.fromhex(H256 + H512[:64])


def test_the_service_takes_the_body_it_checks() -> None:
    """`manifest_request` adds the missing newline to the body itself, empties it once its
    text is read, and keeps each digest once (in the buckets, not in the manifest too)."""
    from server.api.manifests import manifest_request
    from server.errors import BadManifest

    body = bytearray(f"{H256}  a\n{H256}  b".encode())
    req = manifest_request(body)
    assert body == b"" and req.manifest.text == f"{H256}  a\n{H256}  b\n"
    assert req.manifest.lines == 2 and req.manifest.digests == b""
    assert [(key_prefix(k), p) for k, p in req.digest_buckets()] == [
        (bytes.fromhex(H256[:4]), bytes.fromhex(H256))]
    body = bytearray(b"x\n")
    with pytest.raises(BadManifest):
        manifest_request(body)
    assert body == b""


def _large(lines: int, algorithm: str = "sha256", bad: tuple[int, ...] = ()) -> bytearray:
    """A manifest of ``lines`` lines (more than `IN_PROCESS_MAX` bytes for ~14,000 and more),
    the lines numbered in ``bad`` not checksum lines."""
    body = bytearray()
    for i in range(1, lines + 1):
        digest = hashlib.new(algorithm, b"%d" % i).hexdigest()
        body += b"no checksum %d\n" % i if i in bad else f"{digest} *file-{i}\n".encode()
    return body


@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
def test_a_large_manifest_is_checked_in_a_process_of_its_own(algorithm: str) -> None:
    """Above `IN_PROCESS_MAX` bytes the manifest is checked, and its index built, by
    ``python -m workers.manifest_check``: the same manifest and rows as in this process."""
    from server.api.manifests import manifest_request
    from workers.manifest_check import IN_PROCESS_MAX, check_elsewhere

    body = _large(20_000, algorithm)
    del body[-1:]  # (no last newline: the service adds it)
    assert len(body) > IN_PROCESS_MAX
    here = parse_body(body)
    checked = check_elsewhere(body + b"\n")
    assert (checked.algorithm, checked.lines) == (algorithm, 20_000)
    assert checked.rows == buckets(here.digests, here.width)
    req = manifest_request(body)
    # Its lines are the body itself (a newline added), not a string made of it.
    assert req.manifest.text is body and body.decode() == here.text
    assert req.manifest == replace(here, text=body, digests=b"")
    assert req.digest_buckets() == checked.rows


def test_a_large_malformed_manifest_names_its_lines_from_the_other_process() -> None:
    from server.api.manifests import manifest_request
    from server.errors import BadManifest

    body = _large(20_000, bad=(3, 19_999))
    with pytest.raises(BadManifest) as e:
        manifest_request(body)
    assert (e.value.lines, e.value.count) == ([3, 19_999], 2)
    assert body == b""


def test_a_check_that_ends_without_an_answer_is_unavailable(tmp_path: Path) -> None:
    """The checking process killed (here: a "python" that exits at once): a 503 to try
    again, not a 500."""
    from workers.manifest_check import CheckFailed, check_elsewhere

    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 137\n")
    python.chmod(0o755)
    with pytest.raises(CheckFailed, match="ended before its answer"):
        check_elsewhere(_large(20_000), str(python))
