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

import heapq
import io
import itertools
import re
import time
from collections.abc import Iterator
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


# A text: as ``str``, or as the UTF-8 bytes it is (a large manifest's lines stay the bytes
# received, checked UTF-8: decoding 127 MiB into one string held the GIL for 100-150 ms).
Text = str | bytes | bytearray


@dataclass(frozen=True)
class Manifest:
    """A checked body: its algorithm, its text (LF line ends, a final LF), how many lines it
    has, and the digests of its lines: raw, packed one after the other (`width` bytes each), in
    line order, duplicates kept (one object for all of them: a million digests as ``str`` took
    about 113 MiB, packed they are 32 MiB of sha256)."""

    algorithm: str
    text: Text
    lines: int
    digests: bytes

    @property
    def width(self) -> int:
        """Bytes of one digest in `digests`."""
        return ALGORITHMS[self.algorithm] // 2


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


PIECE = 1 << 20  # characters of a text encoded at a time (`utf8_pieces`)


def utf8_pieces(*texts: Text) -> Iterator[bytes]:
    """The concatenated ``texts`` in UTF-8, `PIECE` characters (or bytes) at a time: a
    manifest is sent and hashed without a copy of it in bytes."""
    for text in texts:
        if isinstance(text, str):
            for i in range(0, len(text), PIECE):
                yield text[i:i + PIECE].encode("utf-8")
        else:
            with memoryview(text) as view:
                for i in range(0, len(view), PIECE):
                    yield bytes(view[i:i + PIECE])


def utf8_size(*texts: Text) -> int:
    """Bytes of the concatenated ``texts`` in UTF-8 (an ASCII text's length; else counted a
    piece at a time, not encoded whole)."""
    return sum(len(t) if not isinstance(t, str) or t.isascii()
               else sum(map(len, utf8_pieces(t))) for t in texts)


def count_lines(text: Text) -> int:
    """The lines of ``text`` (its newlines)."""
    return text.count("\n") if isinstance(text, str) else text.count(b"\n")


def as_str(text: Text) -> str:
    """``text`` as a string."""
    return text if isinstance(text, str) else text.decode("utf-8")


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text`` (which ends in LF), one at a time (not a list of them all)."""
    start, end = 0, len(text) - 1
    while (stop := text.find("\n", start, end)) >= 0:
        yield text[start:stop]
        start = stop + 1
    yield text[start:end]


def _count_lines(text: str) -> int:
    """``text.count("\n")`` a `PIECE` at a time: the service checks a manifest in a thread,
    and one count of 127 MiB holds the GIL (and stalls the event loop) for 70-130 ms."""
    return sum(text.count("\n", i, i + PIECE) for i in range(0, len(text), PIECE))


def _diagnose(text: str, algorithm: str | None) -> MalformedManifest:
    if algorithm is None:  # the first line is bad: hold the rest to the first good line's
        algorithm = next((alg for line in _lines(text) for alg, p in _PATTERNS.items()
                          if len(line) <= MAX_LINE and p.fullmatch(line)), None)
    pattern = _PATTERNS[algorithm] if algorithm else None
    bad: list[int] = []  # the first MAX_REPORTED
    count = 0
    for i, line in enumerate(_lines(text), 1):
        if pattern is None or len(line) > MAX_LINE or not pattern.fullmatch(line):
            count += 1
            if len(bad) < MAX_REPORTED:
                bad.append(i)
    what = algorithm or "sha256 or sha512"
    shown = ", ".join(map(str, bad)) + (", ..." if count > MAX_REPORTED else "")
    return MalformedManifest(
        f"{count} line(s) are not {what} checksum lines: line {shown}", bad, count)


_BATCH = 4096  # digests turned from hex to bytes at once


def _packed_digests(text: str, algorithm: str, count: int) -> bytes | None:
    """The digests of ``text``'s ``count`` lines, packed in line order; None if not every
    line is a checksum line of ``algorithm``. A line that does not match is skipped by
    ``finditer`` (and no match spans a newline): all lines matched iff as many matched as
    there are lines. One match object at a time, a batch of hex digests at a time."""
    matches = _PATTERNS[algorithm].finditer(text)
    # (a BytesIO's getvalue() hands over its buffer when it is full: no copy of the digests)
    out = io.BytesIO()
    found = 0
    while batch := [m[1] or m[2] for m in itertools.islice(matches, _BATCH)]:
        found += len(batch)
        if found > count:
            return None
        out.write(bytes.fromhex("".join(batch)))
    return out.getvalue() if found == count else None


def check_lines(text: str, algorithm: str | None = None) -> Manifest:
    """Check ``text`` (LF line ends, ending in LF): every line a checksum line of one
    algorithm (``algorithm``, or the first line's). Raises `MalformedManifest`."""
    if not text or not text.endswith("\n"):
        raise MalformedManifest("a manifest is one or more lines, each ending in a newline")
    if algorithm is None:
        algorithm = _algorithm_of(text[:text.find("\n")])
    elif algorithm not in ALGORITHMS:
        raise MalformedManifest(f"unknown algorithm {algorithm!r}")
    count = _count_lines(text)
    if algorithm is not None and (len(text) - count) <= count * MAX_LINE:
        digests = _packed_digests(text, algorithm, count)
        if digests is not None:
            return Manifest(algorithm, text, count, digests)
    raise _diagnose(text, algorithm)


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


def _not_utf8(body: bytes | bytearray) -> MalformedManifest:
    """The refusal of a body that is not UTF-8, naming its bad lines (read one at a time)."""
    bad: list[int] = []  # the first MAX_REPORTED
    count = 0
    start, end = 0, len(body) - 1 if body.endswith(b"\n") else len(body)
    line = 0
    while start <= end:
        stop = body.find(b"\n", start, end)
        stop = end if stop < 0 else stop
        line += 1
        try:
            body[start:stop].decode("utf-8")
        except UnicodeDecodeError:
            count += 1
            if len(bad) < MAX_REPORTED:
                bad.append(line)
        start = stop + 1
    return MalformedManifest(f"{count} line(s) are not UTF-8: line " + ", ".join(map(str, bad)),
                             bad, count)


def parse_body(body: bytes | bytearray) -> Manifest:
    """A manifest from a request body (a last line without its newline is taken as if it had
    one; a caller that owns the body saves a copy of its text by adding that newline to the
    body). Raises `MalformedManifest` naming the bad lines."""
    if not body or body.isspace():  # (``strip()`` would copy the body)
        raise MalformedManifest("empty manifest: send sha256sum or sha512sum output")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_utf8(body) from None
    if not text.endswith("\n"):
        text += "\n"
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


def signed_parts(signed_without_lines: str, header: str, lines: Text
                 ) -> tuple[str, Text, str]:
    """The signed manifest from a worker's answer, which leaves the lines out (they are long
    and the service has them), as the three parts whose concatenation it is: the answer up to
    the end of the header, the lines, the rest of the answer. The service keeps it in parts:
    joined, it would be a whole copy of the lines."""
    at = signed_without_lines.find(header)
    if at < 0 or signed_without_lines.find(header, at + 1) >= 0:
        raise MalformedManifest("the signed answer does not hold the header once")
    at += len(header)
    return signed_without_lines[:at], lines, signed_without_lines[at:]


def splice(signed_without_lines: str, header: str, lines: str) -> str:
    """The signed manifest (`signed_parts`) as one text."""
    # One join: ``a + lines + b`` would make a whole copy of the lines twice.
    a, text, b = signed_parts(signed_without_lines, header, lines)
    return "".join((a, as_str(text), b))


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
# A manifest's index rows: (`bucket_key` of a prefix, the packed sorted digests under it).
Buckets = list[tuple[int, bytes]]
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


SORT_DIGESTS = 1 << 14  # the most digests sorted as objects at once


def _sorted_run(raw: bytes, width: int) -> bytes:
    """The distinct digests of ``raw`` (packed), sorted and packed."""
    return b"".join(sorted({raw[i:i + width] for i in range(0, len(raw), width)}))


def _each(packed: bytes, width: int) -> Iterator[bytes]:
    return (packed[i:i + width] for i in range(0, len(packed), width))


def _sorted_distinct(group: bytes | bytearray, width: int) -> bytes:
    """The distinct digests of ``group`` (packed, ``width`` bytes each), sorted and packed,
    with at most `SORT_DIGESTS` of them as objects at once: a larger group (a bucket
    poisoned with digests chosen to share their first bytes) is sorted in runs of that many,
    which are then merged. (A radix split by one more byte at a time would take one pass over
    the group per byte the digests share: 30 passes for copies of one digest.)"""
    step = SORT_DIGESTS * width
    view = memoryview(group)
    runs = [_sorted_run(bytes(view[i:i + step]), width) for i in range(0, len(group), step)]
    if len(runs) == 1:
        return runs[0]
    out = io.BytesIO()
    last = b""
    for d in heapq.merge(*(_each(r, width) for r in runs)):
        if d != last:
            out.write(d)
            last = d
    return out.getvalue()


def _split(prefix: int, packed: bytes, width: int, rows: Buckets) -> None:
    """Append the rows of the sorted distinct digests ``packed`` that share their first
    ``prefix`` bytes: one row if they are few enough (or ``prefix`` is whole digests), else
    the rows of each one-byte-longer prefix."""
    if len(packed) <= BUCKET_DIGESTS * width or prefix >= width:
        rows.append((bucket_key(packed[:prefix]), packed))
        return
    start = 0
    for end in range(width, len(packed) + 1, width):  # (sorted: each sub-group in one run)
        if end == len(packed) or packed[end + prefix] != packed[start + prefix]:
            _split(prefix + 1, packed[start:end], width, rows)
            start = end


def buckets(digests: bytes, width: int) -> Buckets:
    """The index rows of the packed digests ``digests`` (``width`` bytes each, as
    `Manifest.digests`): (`bucket_key` of the prefix, packed sorted distinct digests that
    start with it), by prefix. No object per digest is kept: the digests are grouped by their
    first `BUCKET_HEX` // 2 bytes into one buffer per group, and each group is sorted (at most
    `SORT_DIGESTS` digests as objects at a time) and released in turn."""
    head = BUCKET_HEX // 2
    groups: dict[bytes, bytearray] = {}
    for i in range(0, len(digests), width):
        d = digests[i:i + width]
        g = groups.get(d[:head])
        if g is None:
            groups[d[:head]] = bytearray(d)
        else:
            g += d
    rows: Buckets = []
    for prefix in sorted(groups):
        _split(head, _sorted_distinct(groups.pop(prefix), width), width, rows)
    return rows


def pack(digests: list[str]) -> bytes:
    """Hex ``digests`` packed as `Manifest.digests` holds them."""
    return bytes.fromhex("".join(digests))


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
