"""Manifests: a whole ``sha256sum``/``sha512sum`` output stamped with one signature.

The body a client sends is checksum lines, one algorithm for all of them:

    <hex>  <name>          (text mode, what ``sha256sum FILE`` prints)
    <hex> *<name>          (binary mode, ``sha256sum -b``)
    <hex>                  (a digest without a name)
    SHA256 (<name>) = <hex>   (BSD style, ``sha256sum --tag``)

Any of these may start with ``\\`` (coreutils' mark for a name with an escaped ``\\`` or
newline). Hex digits are lowercase; a name is UTF-8 without control characters and does not
end in a space (an OpenPGP cleartext signature does not cover trailing white space). A line
starting with ``#`` is refused: the server's header lines are ``#`` lines, which
``sha256sum -c`` skips as comments.

The signed text is the header, then the lines exactly as sent::

    # stampd manifest v1
    # algorithm: sha256
    # time: <Unix seconds>
    # utc: <the same second as YYYY-MM-DDTHH:MM:SSZ>
    # server: <the server's URL>
    # serial: <decimal journal serial number>
    # key: <fingerprint of the signing key>
    # lines: <number of lines that follow>
    <the lines>

Pure: nothing of stampd is imported; the service checks a body with `parse_body`, the worker
checks the lines again with `check_structure` before it signs anything.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

ALGORITHMS = {"sha256": 64, "sha512": 128}
BSD_TAGS = {"sha256": "SHA256", "sha512": "SHA512"}
MAGIC = "# stampd manifest v1\n"
MAX_REPORTED = 20  # bad line numbers named in one refusal
MAX_LINE = 8192  # characters in one line (a name of PATH_MAX bytes fits)

_NAME = r"[^\x00-\x1f\x7f]*[^\x00-\x20\x7f]"
_BSD_NAME = r"[^\x00-\x1f\x7f]*"


def line_regex(algorithm: str, capture: bool = True) -> str:
    """One checksum line of ``algorithm`` (no anchors, no line end), with two groups (unless
    not ``capture``): the digest of a coreutils line, the digest of a BSD line. Written in the
    syntax that Python and ECMA-262 (JSON Schema's ``pattern``) share: the OpenAPI
    description uses it too."""
    n = ALGORITHMS[algorithm]
    tag = BSD_TAGS[algorithm]
    g = "(" if capture else "(?:"
    return (rf"\\?(?:{g}[0-9a-f]{{{n}}})(?: [ *]{_NAME})?"
            rf"|{tag} \({_BSD_NAME}\) = {g}[0-9a-f]{{{n}}}))")


def _line_pattern(algorithm: str) -> re.Pattern[str]:
    return re.compile(rf"^{line_regex(algorithm)}$", re.M)


_PATTERNS = {alg: _line_pattern(alg) for alg in ALGORITHMS}
# Whole texts of one algorithm's lines, for the worker's check (`check_structure`): one match
# over the text, possessive, so no per-line objects and no backtracking state.
# No capturing groups in it: CPython 3.11's re raises SystemError ("The span of capturing
# group is wrong") for some texts when a possessive repeat holds them.
_TEXTS = {alg: re.compile(rf"(?:{line_regex(alg, capture=False)}\n)++") for alg in ALGORITHMS}
_FIRST_HEX = re.compile(r"\\?(?:[0-9a-f]+|SHA(256|512) \(.*\) = ([0-9a-f]+))")


class MalformedManifest(ValueError):
    """Lines that are not checksum lines: ``bad`` holds the first `MAX_REPORTED` of their line
    numbers (1-based), ``count`` how many there are."""

    def __init__(self, message: str, bad: list[int] | None = None, count: int = 0) -> None:
        super().__init__(message)
        self.bad = bad or []
        self.count = count


@dataclass(frozen=True)
class Manifest:
    """A checked body: its algorithm, its text (LF line ends, a final LF), how many lines it
    has, and the digests of its lines (lowercase hex, in line order, duplicates kept)."""

    algorithm: str
    text: str
    lines: int
    digests: list[str]


def _algorithm_of(first: str) -> str | None:
    m = _FIRST_HEX.match(first)
    if not m:
        return None
    if m.group(1):
        return "sha" + m.group(1)
    width = len(first.lstrip("\\").split(" ", 1)[0])
    for alg, n in ALGORITHMS.items():
        if width == n:
            return alg
    return None


def _diagnose(lines: list[str], algorithm: str | None) -> MalformedManifest:
    if algorithm is None:  # the first line is bad: hold the rest to the first good line's
        algorithm = next((alg for line in lines for alg, p in _PATTERNS.items()
                          if len(line) <= MAX_LINE and p.fullmatch(line)), None)
    pattern = _PATTERNS[algorithm] if algorithm else None
    bad = [i for i, line in enumerate(lines, 1)
           if pattern is None or len(line) > MAX_LINE or not pattern.fullmatch(line)]
    what = algorithm or "sha256 or sha512"
    shown = ", ".join(map(str, bad[:MAX_REPORTED])) + (", ..." if len(bad) > MAX_REPORTED else "")
    return MalformedManifest(
        f"{len(bad)} line(s) are not {what} checksum lines: line {shown}", bad[:MAX_REPORTED],
        len(bad))


def check_lines(text: str, algorithm: str | None = None) -> Manifest:
    """Check ``text`` (LF line ends, ending in LF): every line a checksum line of one
    algorithm (``algorithm``, or the first line's). Raises `MalformedManifest`."""
    if not text or not text.endswith("\n"):
        raise MalformedManifest("a manifest is one or more lines, each ending in a newline")
    if algorithm is None:
        algorithm = _algorithm_of(text[:text.find("\n")])
    elif algorithm not in ALGORITHMS:
        raise MalformedManifest(f"unknown algorithm {algorithm!r}")
    count = text.count("\n")
    if algorithm is not None:
        found = _PATTERNS[algorithm].findall(text)
        # A line that does not match is skipped by findall: all lines matched iff as many
        # matched as there are lines (no match spans a newline).
        if len(found) == count and (len(text) - count) <= count * MAX_LINE:
            return Manifest(algorithm, text, count, [a or b for a, b in found])
    raise _diagnose(text[:-1].split("\n"), algorithm)


def check_structure(text: str, algorithm: str) -> int:
    """The worker's check of a job's lines: every line a checksum line of ``algorithm``, as
    `check_lines` holds them, without collecting the digests (the service did); the number
    of lines. Raises `MalformedManifest` (naming the bad lines)."""
    if algorithm not in ALGORITHMS:
        raise MalformedManifest(f"unknown algorithm {algorithm!r}")
    count = text.count("\n")
    if (_TEXTS[algorithm].fullmatch(text) is None
            or (len(text) - count) > count * MAX_LINE):
        check_lines(text, algorithm)  # raises, naming the bad lines
        raise MalformedManifest("lines longer than allowed")
    return count


def parse_body(body: bytes) -> Manifest:
    """A manifest from a request body (a last line without its newline is taken as if it had
    one). Raises `MalformedManifest` naming the bad lines."""
    if not body.strip():
        raise MalformedManifest("empty manifest: send sha256sum or sha512sum output")
    if not body.endswith(b"\n"):
        body += b"\n"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        lines = body[:-1].split(b"\n")
        bad = []
        for i, raw in enumerate(lines, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(i)
        raise MalformedManifest(
            f"{len(bad)} line(s) are not UTF-8: line "
            + ", ".join(map(str, bad[:MAX_REPORTED])), bad[:MAX_REPORTED], len(bad)) from None
    return check_lines(text)


@dataclass(frozen=True)
class Header:
    """The header lines the server puts before a manifest's lines."""

    algorithm: str
    time: int
    server: str
    serial: int
    key: str
    lines: int

    @property
    def utc(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time))

    def text(self) -> str:
        return (f"{MAGIC}# algorithm: {self.algorithm}\n# time: {self.time}\n"
                f"# utc: {self.utc}\n# server: {self.server}\n# serial: {self.serial}\n"
                f"# key: {self.key}\n# lines: {self.lines}\n")

    def as_json(self) -> dict[str, object]:
        return {"algorithm": self.algorithm, "time": self.time, "utc": self.utc,
                "server": self.server, "serial": self.serial, "key": self.key,
                "lines": self.lines}


_HEADER = re.compile(
    r"# stampd manifest v1\n# algorithm: (sha256|sha512)\n# time: (0|[1-9][0-9]{0,11})\n"
    r"# utc: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\n# server: ([!-~]{1,500})\n"
    r"# serial: ([1-9][0-9]{0,18})\n# key: ([0-9A-F]{40}|SHA256:[A-Za-z0-9+/]{43})\n"
    r"# lines: ([1-9][0-9]{0,9})\n")


def parse_header(text: str) -> Header:
    """The header at the start of a signed manifest's text; `MalformedManifest` if none."""
    m = _HEADER.match(text)
    if not m:
        raise MalformedManifest("no stampd manifest header")
    h = Header(m.group(1), int(m.group(2)), m.group(4), int(m.group(5)), m.group(6),
               int(m.group(7)))
    if h.utc != m.group(3):
        raise MalformedManifest("'utc' and 'time' disagree")
    return h


def splice(signed_without_lines: str, header: str, lines: str) -> str:
    """The signed manifest from a worker's answer, which leaves the lines out (they are long
    and the service has them): the lines go right after the header."""
    at = signed_without_lines.find(header)
    if at < 0 or signed_without_lines.find(header, at + 1) >= 0:
        raise MalformedManifest("the signed answer does not hold the header once")
    at += len(header)
    return signed_without_lines[:at] + lines + signed_without_lines[at:]


# -- the index of a manifest's digests ------------------------------------------------------
# A manifest's distinct digests are stored in buckets by their leading bytes: one row per
# (manifest, prefix) with the digests that start with the prefix, sorted and packed (raw
# bytes). A bucket's prefix is the digests' first 2 bytes; a bucket that would hold more than
# `BUCKET_DIGESTS` digests is not stored but split by one more byte, again and again, so that
# no row holds more than `BUCKET_DIGESTS` digests (a row on the longest prefix, the whole
# digest, holds one). A million random digests make about 65,536 rows of about 15 digests
# instead of a million index entries; a million digests that share their first bytes (made to
# poison a bucket) make as many rows, each of at most `BUCKET_DIGESTS`. A look-up reads, for
# each manifest, the one row whose prefix the digest starts with (`lookup_prefixes`: a
# digest's prefixes from 2 bytes to all of it; a manifest has a row on at most one of them).
BUCKET_HEX = 4  # the shortest prefix: 16 bits
BUCKET_DIGESTS = 256  # the most digests in one row (8 KiB of sha256, 16 KiB of sha512)


def bucket_key(prefix: bytes) -> int:
    """A prefix as one integer (a manifest's index rows cross the journal host's wire as
    (int, bytes) pairs): the prefix's bytes after a 0x01 byte, so that its length is kept."""
    return int.from_bytes(b"\x01" + prefix, "big")


def key_prefix(key: int) -> bytes:
    """The prefix of a `bucket_key`."""
    raw = key.to_bytes((key.bit_length() + 7) // 8, "big")
    if not raw or raw[0] != 1:
        raise ValueError(f"not a bucket key: {key}")
    return raw[1:]


def _split(prefix: str, group: list[str], rows: list[tuple[int, bytes]]) -> None:
    """Append the rows of the sorted distinct hex digests ``group`` that start with
    ``prefix``: one row if they are few enough (or ``prefix`` is whole digests), else the rows
    of each one-byte-longer prefix."""
    if len(group) <= BUCKET_DIGESTS or len(prefix) >= len(group[0]):
        rows.append((bucket_key(bytes.fromhex(prefix)), bytes.fromhex("".join(group))))
        return
    n = len(prefix) + 2
    sub: dict[str, list[str]] = {}
    for d in group:  # (sorted: each sub-group stays sorted, and in order)
        sub.setdefault(d[:n], []).append(d)
    for p, g in sub.items():
        _split(p, g, rows)


def buckets(digests: list[str]) -> list[tuple[int, bytes]]:
    """The index rows of hex ``digests``: (`bucket_key` of the prefix, packed sorted distinct
    digests that start with it), by prefix."""
    grouped: dict[str, list[str]] = {}
    for d in digests:
        grouped.setdefault(d[:BUCKET_HEX], []).append(d)
    # Duplicates are rare: one set of all tells whether 65,536 small ones are needed.
    distinct = len(set(digests)) == len(digests)
    rows: list[tuple[int, bytes]] = []
    for prefix, group in sorted(grouped.items()):
        _split(prefix, sorted(group) if distinct else sorted(set(group)), rows)
    return rows


def lookup_prefixes(digest: str) -> list[bytes]:
    """The prefixes whose rows may hold hex ``digest``: its first 2, 3, ... bytes, all of it."""
    raw = bytes.fromhex(digest)
    return [raw[:n] for n in range(BUCKET_HEX // 2, len(raw) + 1)]


def packed_contains(packed: bytes, digest: str) -> bool:
    """Is hex ``digest`` among the sorted digests ``packed`` (each as long as it)?"""
    want = bytes.fromhex(digest)
    width = len(want)
    lo, hi = 0, len(packed) // width
    while lo < hi:
        mid = (lo + hi) // 2
        item = packed[mid * width:(mid + 1) * width]
        if item == want:
            return True
        if item < want:
            lo = mid + 1
        else:
            hi = mid
    return False


def unpack(packed: bytes, width: int) -> list[str]:
    """The hex digests of ``packed`` (``width`` bytes each)."""
    h = packed.hex()
    step = 2 * width
    return [h[i:i + step] for i in range(0, len(h), step)]
