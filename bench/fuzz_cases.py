"""The raw generators of the fuzzer: requests built byte by byte from a seeded `random.Random`,
so that a seed gives the same requests every time.

- ``form``: Zeitgitter ``POST /`` (stamp-tag-v1, stamp-branch-v1), urlencoded or multipart,
  valid or with one field mutated (missing, twice, malformed, unknown request, key choice...);
- ``digest``: ``POST /v1/stamps`` as a form, JSON or multipart, valid or mutated (nested JSON,
  invalid UTF-8, duplicate keys, wrong types, two digests...);
- ``framing``: a form request whose framing lies: Content-Length shorter or longer than the
  body, missing, twice, not a number; chunked bodies with good and bad chunk sizes; Content-Type
  twice; duplicate, huge and malformed headers; odd request lines, HTTP/1.0 and HTTP/0.9;
- ``methods``: every endpoint with every method (and some that are no methods at all);
- ``paths``: odd paths, on ``/log.git`` above all (``..``, ``%2e%2e``, NULs, very long);
- ``pipeline``: several requests in one write, in order, sometimes ending in garbage;
- ``slow``: headers that never end, bodies that never come, bytes sent in slow pieces;
- ``tlog``: the transparency log's reads (``GET /v1/proofs/<serial>``, ``/v1/proofs/git/<id>``
  with and without ``?wait=``, ``/tlog/checkpoint``, ``/tlog/vkey``, hash tiles and entry
  bundles), valid and malformed; a wait is at most 1 s or malformed, so that no request may
  legitimately outlast the hang bound;
- ``witness``: ``POST /add-checkpoint`` to the server as a witness of `WITNESSED`: requests of
  the log (200 or 409, as the state stands), and refused ones: unknown logs, other keys,
  malformed bodies, bad proofs, forks, bodies over the limit (nothing of them may be stored).

Every stamp request carries markers: commit/tree/parent ids and digests that no other request
of the run uses, so that the journal and the log can be searched for what was refused. A
request also says what the protocol rules make of it (`EXPECT_OK`, `EXPECT_REJECT`, or nothing
where the rules leave it open) and whether its HTTP framing is valid.
"""

from __future__ import annotations

import json
import random
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from bench.fuzz_http import EXPECT_OK, EXPECT_REJECT, Case, Req
from tests.helpers import WitnessedLog

# The log the server under test witnesses (a fixed key: the same requests for a seed).
WITNESSED = WitnessedLog("fuzz.example/witnessed", leaves=256, seed=b"\x07" * 32)

KEEP = "keep"  # a body variant that leaves the fields' verdict as it is

URLENCODED = "application/x-www-form-urlencoded"
JSON = "application/json"
MULTIPART = "multipart/form-data"

Fields = list[tuple[str, str]]


@dataclass
class Target:
    """What the generators know of the server under test."""

    host: str
    port: int
    primary_fpr: str  # OpenPGP, 40 uppercase hex
    ssh_fprs: tuple[str, ...] = ()  # SHA256:... of the SSH keys it serves
    # The transparency log, when it keeps one: serials and git object ids of stamps whose
    # proofs are ready, and the size of the tree when the cases were made (the tiles and
    # entry bundles up to it exist).
    serials: tuple[int, ...] = ()
    git_ids: tuple[str, ...] = ()
    tree_size: int = 0

    @property
    def hostport(self) -> bytes:
        return f"{self.host}:{self.port}".encode()


class Markers:
    """Hex values unique within a run: an 8-digit prefix from the seed, then a counter."""

    def __init__(self, rng: random.Random) -> None:
        self.prefix = f"{rng.getrandbits(32):08x}"
        self.n = 0

    def hex(self, digits: int) -> str:
        self.n += 1
        return self.prefix + f"{self.n:0{digits - 8}x}"


def request_bytes(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                  body: bytes = b"", *, version: bytes = b"HTTP/1.1",
                  length: bytes | bool | None = True, eol: bytes = b"\r\n") -> bytes:
    """One request. ``length``: True adds the right Content-Length (for a body or a POST),
    bytes adds that value, None/False adds none."""
    lines = [method + b" " + target + b" " + version]
    lines += [k + b": " + v for k, v in headers]
    if length is True:
        if body or method == b"POST":
            lines.append(b"Content-Length: " + str(len(body)).encode())
    elif isinstance(length, bytes):
        lines.append(b"Content-Length: " + length)
    return eol.join(lines) + eol + eol + body


def urlencode(fields: Fields) -> bytes:
    return urllib.parse.urlencode(fields).encode("ascii")


def multipart(fields: Fields, boundary: str) -> bytes:
    out = []
    for name, value in fields:
        out.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                   f"{value}\r\n".encode())
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out)


# Values that are no valid 40-digit object id, each with a word for the report.
def _bad_ids(rng: random.Random, good: str) -> list[tuple[str, str]]:
    return [
        ("upper", good.upper() if good.upper() != good else "A" + good[1:]),
        ("39", good[:-1]), ("41", good + "0"), ("nonhex", good[:-1] + "g"),
        ("nl", good + "\n"), ("space", " " + good), ("nul", good[:-1] + "\x00"),
        ("empty", ""), ("fullwidth", good[:-1] + "\uff10"), ("sha256", good + "0" * 24),
        ("crlf", good[:20] + "\r\n" + good[20:38]), ("long", good * 30),
        ("dash", good[:-1] + "-"), ("x", "0x" + good[2:]),
    ]


BAD_TAGNAMES = [
    "", "..", "a..b", "x.", "v1.lock", "-x", "1x", ".x", "a/b", "a b", "a~b", "a^b", "a:b",
    "a?b", "a*b", "a[b", "a\\b", "@", "a@{b", "é", "a\nb", "a\x00", "x" * 101, "a" * 1000,
    "refs/tags/x", "tag\t", "a.lock", "ab.", "a\x7f",
]


def combine(expect: str | None, verdict: str | None) -> str | None:
    """The verdict on a request from the one on its fields and the one on its body."""
    if verdict == EXPECT_REJECT or expect == EXPECT_REJECT:
        return EXPECT_REJECT
    return expect if verdict == KEEP else None


def good_tagname(rng: random.Random) -> str:
    first = rng.choice("_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    rest = "".join(rng.choice("-._abcxyzABCXYZ0123456789") for _ in range(rng.randrange(0, 12)))
    name = (first + rest)[:100]
    while ".." in name:
        name = name.replace("..", "._")
    if name.endswith("."):
        name += "x"
    if name.endswith(".lock"):
        name += "x"
    return name


def _tile_index(n: int) -> str:
    """A tile index as tlog-tiles writes it: groups of 3 digits, each but the last with x."""
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.insert(0, f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(groups)


class RawGenerator:
    """Raw cases for one server. `cases(n)` returns cases holding exactly ``n`` requests."""

    def __init__(self, rng: random.Random, target: Target, markers: Markers) -> None:
        self.rng = rng
        self.t = target
        self.m = markers
        self.weights: list[tuple[str, float, Callable[[], Case]]] = [
            ("form", 28, self.form),
            ("digest", 20, self.digest),
            ("framing", 22, self.framing),
            ("methods", 14, self.methods),
            ("paths", 8, self.paths),
            ("pipeline", 6, self.pipeline),
            ("slow", 2, self.slow),
        ]
        if target.tree_size:
            self.weights.append(("tlog", 10, self.tlog))
        self.weights.append(("witness", 6, self.witness))
        # The size the last chain request grew the witnessed log to: half of the witness
        # requests start from it, so that some are cosigned (and forks and bad proofs meet a
        # stored tree: 422) rather than nearly all answered 409.
        self.witness_size = 0

    # -- plumbing ---------------------------------------------------------------------------
    def cases(self, n: int) -> list[Case]:
        out: list[Case] = []
        left = n
        names = [w[0] for w in self.weights]
        weights = [w[1] for w in self.weights]
        makers = {w[0]: w[2] for w in self.weights}
        while left > 0:
            case = makers[self.rng.choices(names, weights)[0]]()
            if len(case.reqs) > left:
                continue
            out.append(case)
            left -= len(case.reqs)
        return out

    def headers(self, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        hs = [(b"Host", self.t.hostport), *extra]
        if self.rng.random() < 0.2:
            hs.append((b"User-Agent", b"stampd-fuzz/1"))
        if self.rng.random() < 0.1:
            hs.append((b"Connection", self.rng.choice([b"keep-alive", b"close"])))
        return hs

    def key_choice(self) -> tuple[Fields, bool]:
        """Optional format/key fields and whether they are a valid choice."""
        r = self.rng.random()
        fpr = self.t.primary_fpr
        ssh = self.t.ssh_fprs
        if r < 0.7:
            return [], True
        options: list[tuple[Fields, bool]] = [
            ([("format", "openpgp")], True),
            ([("key", fpr)], True),
            ([("key", fpr.lower())], True),  # OpenPGP fingerprints in any case
            ([("format", "openpgp"), ("key", fpr)], True),
            ([("format", "gpg")], False), ([("format", "OPENPGP")], False),
            ([("format", "")], False), ([("key", "0" * 40)], False),
            ([("key", fpr[:-1])], False), ([("key", "SHA256:" + "A" * 43)], False),
            ([("format", "openpgp"), ("format", "openpgp")], False),
            ([("key", fpr), ("key", fpr)], False),
        ]
        if ssh:
            options += [([("format", "ssh")], True), ([("key", ssh[0])], True),
                        ([("format", "ssh"), ("key", ssh[0])], True),
                        ([("format", "openpgp"), ("key", ssh[0])], False),
                        ([("format", "ssh"), ("key", fpr)], False),
                        ([("key", ssh[0].lower())], False)]
        else:
            options += [([("format", "ssh")], False)]
        return self.rng.choice(options)

    # -- Zeitgitter forms -------------------------------------------------------------------
    def zg_fields(self) -> tuple[Fields, tuple[str, ...], str | None, str]:
        """(fields, markers, expectation, label) of a Zeitgitter stamp request, perhaps with
        one field mutated."""
        rng = self.rng
        commit = self.m.hex(40)
        markers = [commit]
        if rng.random() < 0.5:
            fields: Fields = [("request", "stamp-tag-v1"), ("commit", commit),
                              ("tagname", good_tagname(rng))]
            kind = "tag"
        else:
            tree = self.m.hex(40)
            fields = [("request", "stamp-branch-v1"), ("commit", commit), ("tree", tree)]
            markers.append(tree)
            if rng.random() < 0.5:
                parent = self.m.hex(40)
                fields.append(("parent", parent))
                markers.append(parent)
            kind = "branch"
        choice, choice_ok = self.key_choice()
        fields += choice
        if rng.random() < 0.3:
            rng.shuffle(fields)
        expect: str | None = EXPECT_OK if choice_ok else EXPECT_REJECT
        label = f"{kind} valid" if choice_ok else f"{kind} bad key choice"
        if rng.random() < 0.55:
            fields, mexpect, mlabel = self.mutate_zg(fields, kind)
            label = f"{kind} {mlabel}"
            if mexpect == EXPECT_REJECT or expect == EXPECT_REJECT:
                expect = EXPECT_REJECT
            else:
                expect = mexpect
        return fields, tuple(markers), expect, label

    def mutate_zg(self, fields: Fields, kind: str) -> tuple[Fields, str | None, str]:
        rng = self.rng
        names = [n for n, _ in fields]
        required = ["request", "commit", "tagname"] if kind == "tag" else [
            "request", "commit", "tree"]
        ids = [n for n in names if n in ("commit", "tree", "parent")]
        what = rng.choice(["drop", "twice", "twice-other", "bad-id", "bad-id", "bad-tagname",
                           "bad-request", "unknown-field", "other-kind-field", "empty",
                           "parent-is-commit", "too-many", "sixteen", "case-name"])
        f = list(fields)
        if what == "drop":
            name = rng.choice(required)
            return [p for p in f if p[0] != name], EXPECT_REJECT, f"without {name}"
        if what in ("twice", "twice-other"):
            name, value = rng.choice(f)
            if what == "twice-other":
                value = self.m.hex(40) if name in ("commit", "tree", "parent") else value + "x"
            f.insert(rng.randrange(len(f) + 1), (name, value))
            return f, EXPECT_REJECT, f"{name} twice"
        if what == "bad-id":
            name = rng.choice(ids)
            good = dict(f)[name]
            # A tag stamp's lone commit id of 64 digits is a SHA-256 repository's: valid
            # (docs/protocol.md); beside 40-digit ids (a branch stamp) it is not.
            word, bad = rng.choice([b for b in _bad_ids(rng, good)
                                    if kind != "tag" or b[0] != "sha256"])
            return [(n, bad if n == name else v) for n, v in f], EXPECT_REJECT, \
                f"{name} {word}"
        if what == "bad-tagname":
            if kind != "tag":
                f.append(("tagname", rng.choice(BAD_TAGNAMES)))
                return f, EXPECT_OK, "branch with a bad tagname (ignored)"
            bad = rng.choice(BAD_TAGNAMES)
            return [(n, bad if n == "tagname" else v) for n, v in f], EXPECT_REJECT, \
                f"tagname {bad[:12]!r}"
        if what == "bad-request":
            bad = rng.choice(["stamp-tag-v2", "STAMP-TAG-V1", "stamp-tag-v1 ", "get-public-key-v1",
                              "", "stamp-branch", "stamp-tag-v1\n", "stamp\x00tag"])
            return [(n, bad if n == "request" else v) for n, v in f], EXPECT_REJECT, \
                f"request {bad!r}"
        if what == "unknown-field":
            f.insert(rng.randrange(len(f) + 1), (rng.choice(["foo", "Commit", "x" * 200, "é"]),
                                                 "bar"))
            return f, EXPECT_OK, "an unknown field (ignored)"
        if what == "other-kind-field":
            if kind == "tag":
                f.append(("tree", self.m.hex(40)))
            else:
                f.append(("tagname", "t"))
            return f, EXPECT_OK, "a field of the other kind (ignored)"
        if what == "empty":
            name = rng.choice(required)
            return [(n, "" if n == name else v) for n, v in f], EXPECT_REJECT, f"empty {name}"
        if what == "parent-is-commit":
            if kind != "branch":
                return f, EXPECT_OK, "unchanged"
            commit = dict(f)["commit"]
            f = [p for p in f if p[0] != "parent"] + [("parent", commit)]
            return f, EXPECT_REJECT, "parent = commit"
        if what == "too-many":
            while len(f) < 17:
                f.append((f"x{len(f)}", "y"))
            return f, EXPECT_REJECT, "17 fields"
        if what == "sixteen":
            while len(f) < 16:
                f.append((f"x{len(f)}", "y"))
            return f, EXPECT_OK, "16 fields"
        # case-name: field names are case-sensitive
        name = rng.choice(required)
        return [(n.upper() if n == name else n, v) for n, v in f], EXPECT_REJECT, \
            f"{name.upper()} for {name}"

    def zg_body(self, fields: Fields) -> tuple[bytes, bytes, str | None, str]:
        """(content type, body, expectation change, label) for Zeitgitter fields."""
        rng = self.rng
        r = rng.random()
        if r < 0.65:
            body = urlencode(fields)
            r2 = rng.random()
            if r2 < 0.04:
                return URLENCODED.encode(), body + b"&%ff=1", EXPECT_REJECT, "%ff (not UTF-8)"
            if r2 < 0.08:
                return URLENCODED.encode(), body + b"&x=\xe9", EXPECT_REJECT, "raw non-ASCII"
            if r2 < 0.11:
                return URLENCODED.encode(), body + b"&x=%zz", None, "bad % escape"
            if r2 < 0.14:
                return URLENCODED.encode(), body.replace(b"&", b";"), EXPECT_REJECT, \
                    "; separators"
            if r2 < 0.17:
                return URLENCODED.encode(), b"&&" + body + b"&", None, "empty pairs"
            if r2 < 0.2:
                return URLENCODED.encode(), body + b"&novalue", None, "a name without ="
            if r2 < 0.23:
                return URLENCODED.encode(), body + b"&x=%C3%A9%00", None, "UTF-8 and NUL"
            if r2 < 0.26:
                return URLENCODED.encode(), b"\xef\xbb\xbf" + body, EXPECT_REJECT, "UTF-8 BOM"
            ctype = rng.choice([URLENCODED, URLENCODED, URLENCODED + "; charset=utf-8",
                                "Application/X-WWW-Form-Urlencoded", URLENCODED + ";"])
            return ctype.encode(), body, KEEP, ""
        if r < 0.9:
            boundary = rng.choice(["b0undary", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "x",
                                   "a" * 70, "with space", "q'uote"])
            ctype = f"{MULTIPART}; boundary={boundary}"
            if " " in boundary or "'" in boundary:
                ctype = f'{MULTIPART}; boundary="{boundary}"'
            body = multipart(fields, boundary)
            r2 = rng.random()
            if r2 < 0.08:
                file_part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"f\"; "
                             f"filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhi\r\n")
                return ctype.encode(), file_part.encode() + body, EXPECT_REJECT, "a file part"
            if r2 < 0.14:
                return MULTIPART.encode(), body, EXPECT_REJECT, "multipart without boundary"
            if r2 < 0.2:
                return f"{MULTIPART}; boundary=other".encode(), body, EXPECT_REJECT, \
                    "wrong boundary"
            if r2 < 0.26:
                return ctype.encode(), body[: rng.randrange(len(body))], None, \
                    "truncated multipart"
            if r2 < 0.3:
                bad = body.replace(b"Content-Disposition: form-data; ", b"Content-Disposition: ",
                                   1)
                return ctype.encode(), bad, None, "part without form-data"
            if r2 < 0.34:
                return ctype.encode(), body.replace(b"\r\n", b"\n"), None, "LF-only multipart"
            if r2 < 0.38:
                extra = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"x\"\r\n"
                         f"Content-Transfer-Encoding: base64\r\n\r\n\xff\xfe\r\n")
                return ctype.encode(), extra.encode("latin-1") + body, None, \
                    "base64 part, invalid UTF-8"
            return ctype.encode(), body, KEEP, "multipart"
        # Neither form type: 415 whatever the fields.
        ctype = rng.choice([JSON, "text/plain", "", "application/x-www-form-urlencodedx",
                            "multipart/mixed; boundary=x", "*/*", "application/octet-stream"])
        if ctype == JSON:
            return ctype.encode(), json.dumps(dict(fields)).encode(), EXPECT_REJECT, "JSON"
        return ctype.encode(), urlencode(fields), EXPECT_REJECT, f"type {ctype!r}"

    def form(self) -> Case:
        fields, markers, expect, label = self.zg_fields()
        ctype, body, bexpect, blabel = self.zg_body(fields)
        expect = combine(expect, bexpect)
        if len(body) > 1000:
            expect = EXPECT_REJECT  # STAMPD_MAX_BODY
        headers = self.headers()
        if ctype:
            headers.append((b"Content-Type", ctype))
        wire = request_bytes(b"POST", b"/", headers, body)
        label = f"{label}; {blabel}" if blabel else label
        # A body over STAMPD_MAX_BODY may be answered (413) before it is read, and closed.
        may_close = "answered 413 before the body was read" if len(body) > 1000 else None
        return Case("form", label, [wire], [Req("POST", "/", markers, expect)],
                    may_close=may_close)

    # -- /v1/stamps -------------------------------------------------------------------------
    def digest(self) -> Case:
        rng = self.rng
        algorithm = rng.choice(["sha256", "sha512"])
        value = self.m.hex(64 if algorithm == "sha256" else 128)
        markers = (value,)
        fields: Fields = [(algorithm, value)]
        choice, choice_ok = self.key_choice()
        fields += choice
        expect: str | None = EXPECT_OK if choice_ok else EXPECT_REJECT
        label = "valid" if choice_ok else "bad key choice"
        r = rng.random()
        if r < 0.45:
            fields, mexpect, mlabel = self.mutate_digest(fields, algorithm, value)
            label = mlabel
            expect = EXPECT_REJECT if EXPECT_REJECT in (mexpect, expect) else mexpect
        as_json = rng.random() < 0.45
        if as_json:
            ctype, body, jexpect, jlabel = self.json_body(fields)
        else:
            ctype, body, jexpect, jlabel = self.digest_form_body(fields)
        expect = combine(expect, jexpect)
        if len(body) > 1000:
            expect = EXPECT_REJECT
        headers = self.headers()
        if ctype is not None:
            headers.append((b"Content-Type", ctype))
        if rng.random() < 0.4:
            headers.append((b"Accept", rng.choice([b"application/json", b"text/plain", b"*/*",
                                                   b"application/json;q=0.1, text/html"])))
        wire = request_bytes(b"POST", b"/v1/stamps", headers, body)
        label = f"{'JSON' if as_json else 'form'} {label}" + (f"; {jlabel}" if jlabel else "")
        may_close = "answered 413 before the body was read" if len(body) > 1000 else None
        return Case("digest", label, [wire], [Req("POST", "/v1/stamps", markers, expect)],
                    may_close=may_close)

    def mutate_digest(self, fields: Fields, algorithm: str, value: str
                      ) -> tuple[Fields, str | None, str]:
        rng = self.rng
        what = rng.choice(["upper", "short", "long", "nonhex", "ws", "bad-ws", "two", "twice",
                           "unknown", "sha1", "algo-case", "wrong-length-algo", "empty", "none",
                           "twice-blank", "other-blank"])
        rest = fields[1:]
        if what == "upper":
            return [(algorithm, value.upper()), *rest], EXPECT_REJECT, "uppercase digest"
        if what == "short":
            return [(algorithm, value[:-1]), *rest], EXPECT_REJECT, "digest one short"
        if what == "long":
            return [(algorithm, value + "0"), *rest], EXPECT_REJECT, "digest one long"
        if what == "nonhex":
            return [(algorithm, value[:-1] + "g"), *rest], EXPECT_REJECT, "non-hex digest"
        if what == "ws":
            ws = "".join(rng.choice(" \t\r\n") for _ in range(rng.randrange(1, 4)))
            return [(algorithm, ws + value + ws), *rest], EXPECT_OK, "digest in whitespace"
        if what == "bad-ws":
            ws = rng.choice(["\v", "\f", "\u00a0", "\u2003", "\x00"])
            return [(algorithm, value + ws), *rest], EXPECT_REJECT, \
                f"digest then {ws!r}"
        if what == "two":
            other = "sha512" if algorithm == "sha256" else "sha256"
            return [*fields, (other, self.m.hex(64 if other == "sha256" else 128))], \
                EXPECT_REJECT, "two digests"
        if what == "twice":
            return [*fields, (algorithm, value)], EXPECT_REJECT, "digest twice"
        if what == "twice-blank":
            return [*fields, (algorithm, "")], EXPECT_REJECT, "digest twice, once blank"
        if what == "other-blank":
            other = "sha512" if algorithm == "sha256" else "sha256"
            return [(other, ""), *fields], EXPECT_REJECT, "a blank digest of the other kind"
        if what == "unknown":
            return [*fields, ("comment", "hi")], EXPECT_REJECT, "an unknown field"
        if what == "sha1":
            return [("sha1", value[:40]), *rest], EXPECT_REJECT, "sha1"
        if what == "algo-case":
            return [(algorithm.upper(), value), *rest], EXPECT_REJECT, "SHA256 as name"
        if what == "wrong-length-algo":
            other = "sha512" if algorithm == "sha256" else "sha256"
            return [(other, value), *rest], EXPECT_REJECT, "digest of the other length"
        if what == "empty":
            return [(algorithm, ""), *rest], EXPECT_REJECT, "empty digest"
        return list(rest), EXPECT_REJECT, "no digest"

    def digest_form_body(self, fields: Fields) -> tuple[bytes | None, bytes, str | None, str]:
        rng = self.rng
        body = urlencode(fields)
        r = rng.random()
        if r < 0.06:
            return URLENCODED.encode(), body + b"&", EXPECT_REJECT, "trailing &"
        if r < 0.1:
            return URLENCODED.encode(), body + b"&x", EXPECT_REJECT, "a name without ="
        if r < 0.14:
            return URLENCODED.encode(), body + b"%ff", EXPECT_REJECT, "%ff"
        if r < 0.18:
            return URLENCODED.encode(), b"\xff" + body, EXPECT_REJECT, "raw byte 0xff"
        if r < 0.22:
            return URLENCODED.encode(), b"", EXPECT_REJECT, "empty body"
        if r < 0.25:
            return URLENCODED.encode(), b" \r\n\t", EXPECT_REJECT, "whitespace body"
        if r < 0.3:
            boundary = "xyz"
            return f"{MULTIPART}; boundary={boundary}".encode(), multipart(fields, boundary), \
                EXPECT_REJECT, "multipart"
        if r < 0.35:
            return None, body, EXPECT_REJECT, "no Content-Type"
        if r < 0.4:
            return b"text/plain", body, EXPECT_REJECT, "text/plain"
        ctype = rng.choice([URLENCODED, URLENCODED, URLENCODED + "; charset=latin-1",
                            "APPLICATION/X-WWW-FORM-URLENCODED"])
        return ctype.encode(), body, KEEP, ""

    def json_body(self, fields: Fields) -> tuple[bytes | None, bytes, str | None, str]:
        rng = self.rng
        obj = dict(fields)
        dup = len(obj) != len(fields)
        text = json.dumps(obj)
        if dup:  # a duplicate name: write the pairs by hand
            text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fields) + "}"
        r = rng.random()
        ctype = rng.choice([JSON, JSON, JSON + "; charset=utf-8", "Application/JSON"]).encode()
        if r < 0.55:
            return ctype, text.encode(), EXPECT_REJECT if dup else KEEP, ""
        depth = rng.choice([10, 1000, 100_000])
        many = "{" + ", ".join(f'"k{i}": "v"' for i in range(100)) + "}"
        variants: list[tuple[bytes, str | None, str]] = [
            (b"[" * 100 + b"]" * 100, EXPECT_REJECT, "nested lists"),
            (b'{"a":' * 300 + b"1" + b"}" * 300, EXPECT_REJECT, "nested objects"),
            (b"[" * depth, EXPECT_REJECT, f"{depth} unclosed ["),
            (('{"sha256": ' + "[" * depth).encode(), EXPECT_REJECT, "deep value"),
            (b"[" + text.encode() + b"]", EXPECT_REJECT, "a list"),
            (json.dumps(text).encode(), EXPECT_REJECT, "a JSON string"),
            (b"1e999", EXPECT_REJECT, "a huge number"), (b"null", EXPECT_REJECT, "null"),
            (b"NaN", EXPECT_REJECT, "NaN"), (b"", EXPECT_REJECT, "empty"),
            (text.encode()[:-1], EXPECT_REJECT, "truncated"),
            (text.encode() + b" x", EXPECT_REJECT, "trailing garbage"),
            (text.encode() + b"\n", KEEP, "trailing newline"),
            (b"\xef\xbb\xbf" + text.encode(), None, "UTF-8 BOM"),  # RFC 8259 8.1: MAY ignore
            (text.encode("utf-16"), None, "UTF-16"),
            (text.replace('"}', '\\ud800"}').encode(), EXPECT_REJECT, "lone surrogate"),
            (text.replace("}", ', "key": "SHA256:\\ud800"}').encode(), EXPECT_REJECT,
             "a lone surrogate in key"),
            (text.replace("}", ', "format": "\\udfff\\ud800"}').encode(), EXPECT_REJECT,
             "lone surrogates in format"),
            (b'{"\\ud800": "a", "\\ud800": "b"}', EXPECT_REJECT, "a surrogate name twice"),
            (text.replace("}", ', "x": "\xff"}').encode("latin-1"), EXPECT_REJECT,
             "invalid UTF-8"),
            (text.replace("}", ', "n": 1}').encode(), EXPECT_REJECT, "a number value"),
            (text.replace("}", ', "o": {"sha256": "x"}}').encode(), EXPECT_REJECT,
             "an object value"),
            (text.replace("}", ', "l": ["a"]}').encode(), EXPECT_REJECT, "a list value"),
            (text.replace("}", ', "b": true}').encode(), EXPECT_REJECT, "a boolean value"),
            (text.replace(":", ": null,", 1).encode(), EXPECT_REJECT, "broken"),
            (text.replace('"', "'").encode(), EXPECT_REJECT, "single quotes"),
            (many.encode(), EXPECT_REJECT, "100 keys"),
        ]
        body, verdict, label = rng.choice(variants)
        return ctype, body, verdict, label

    # -- framing ----------------------------------------------------------------------------
    def framing(self) -> Case:
        rng = self.rng
        fields, markers, expect, label = self.zg_fields()
        body = urlencode(fields)
        if len(body) > 1000:
            body = body[:1000]
            expect = None
        ctype = (b"Content-Type", URLENCODED.encode())
        host = (b"Host", self.t.hostport)
        what = rng.choice([
            "cl-short", "cl-long-half", "no-cl", "cl-invalid", "cl-twice-same", "cl-twice-diff",
            "chunked", "chunked-bad", "te-and-cl", "te-other", "expect-100", "ct-twice",
            "huge-header", "many-headers", "bad-header", "request-line", "http10", "http09",
            "host", "utf8-target", "upgrade", "cl-long-slow"])

        def case(wire: bytes | list[bytes], lbl: str, exp: str | None, *,
                 well_formed: bool = True, may_close: str | None = None,
                 half_close: bool = False, method: str = "POST", target: str = "/",
                 mk: tuple[str, ...] = markers, junk: bool = False) -> Case:
            pieces = wire if isinstance(wire, list) else [wire]
            return Case("framing", f"{lbl} ({label})", pieces,
                        [Req(method, target, mk, exp, well_formed)],
                        half_close=half_close, may_close=may_close, trailing_junk=junk)

        if what == "cl-short":
            k = rng.randrange(1, max(2, len(body)))
            wire = request_bytes(b"POST", b"/", [host, ctype], body,
                                 length=str(len(body) - k).encode())
            # The first len-k bytes are the request; the rest is garbage that follows it. A
            # marker cut off by the length was never part of the request (a branch stamp's
            # parent, say): only those inside it may be stamped.
            inside = body[: len(body) - k]
            return case(wire, f"Content-Length {k} short", None, junk=True,
                        mk=tuple(m for m in markers if m.encode() in inside))
        if what in ("cl-long-half", "cl-long-slow"):
            k = rng.randrange(1, 50)
            wire = request_bytes(b"POST", b"/", [host, ctype], body,
                                 length=str(len(body) + k).encode())
            if what == "cl-long-slow":
                # The rest never comes: 408 once STAMPD_BODY_TIMEOUT is over.
                return case(wire, f"Content-Length {k} long, kept open", EXPECT_REJECT)
            return case(wire, f"Content-Length {k} long, then half-closed", EXPECT_REJECT,
                        may_close="the client closed its side before the body was complete",
                        half_close=True)
        if what == "no-cl":
            wire = request_bytes(b"POST", b"/", [host, ctype], body, length=None)
            return case(wire, "no Content-Length, body follows", EXPECT_REJECT, junk=True)
        if what == "cl-invalid":
            bad = rng.choice([b"abc", b"-1", b"1e3", b"+10", b"0x10", b"10 10", b"",
                              b"99999999999999999999999", b"\xff", b"\xb2", b"1.0",
                              str(len(body)).encode() + b","])
            wire = request_bytes(b"POST", b"/", [host, ctype], body, length=bad)
            return case(wire, f"Content-Length {bad!r}", EXPECT_REJECT, well_formed=False,
                        may_close="invalid Content-Length (RFC 9112 6.3: unrecoverable)")
        if what in ("cl-twice-same", "cl-twice-diff"):
            n = str(len(body)).encode()
            other = n if what == "cl-twice-same" else str(len(body) + 1).encode()
            wire = request_bytes(b"POST", b"/", [host, ctype, (b"Content-Length", n),
                                                 (b"Content-Length", other)], body, length=None)
            if what == "cl-twice-same":
                return case(wire, "Content-Length twice, same", EXPECT_REJECT)
            return case(wire, "Content-Length twice, different", EXPECT_REJECT,
                        well_formed=False,
                        may_close="conflicting Content-Length (RFC 9112 6.3: unrecoverable)")
        if what in ("chunked", "chunked-bad"):
            chunks = b""
            rest = body
            while rest:
                n = rng.randrange(1, len(rest) + 1)
                chunks += f"{n:x}\r\n".encode() + rest[:n] + b"\r\n"
                rest = rest[n:]
            chunks += b"0\r\n\r\n"
            te = (b"Transfer-Encoding", b"chunked")
            if what == "chunked":
                wire = request_bytes(b"POST", b"/", [host, ctype, te], chunks, length=None)
                return case(wire, "chunked body", EXPECT_REJECT)  # 411: lengths only
            bad = rng.choice([
                b"zz\r\nabc\r\n0\r\n\r\n", b"-1\r\nabc\r\n0\r\n\r\n",
                b"ffffffffffffffffffff\r\nabc\r\n", b"3\r\nabcdef\r\n0\r\n\r\n",
                b"3;ext=1\r\nabc\r\n0\r\n\r\n", b"3\nabc\n0\n\n", b"3\r\nabc", b"0\r\n",
                b"3 \r\nabc\r\n0\r\n\r\n", b"\r\n\r\n", b"0\r\nX-Trailer: 1\r\n\r\n",
                chunks + b"junk"])
            wire = request_bytes(b"POST", b"/", [host, ctype, te], bad, length=None)
            return case(wire, f"chunked body {bad[:12]!r}", EXPECT_REJECT, well_formed=False,
                        may_close="malformed chunked body")
        if what == "te-and-cl":
            wire = request_bytes(b"POST", b"/", [host, ctype, (b"Transfer-Encoding", b"chunked")],
                                 f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
            return case(wire, "Transfer-Encoding and Content-Length", EXPECT_REJECT,
                        well_formed=False, may_close="Transfer-Encoding with Content-Length "
                        "(RFC 9112 6.1: close after answering)")
        if what == "te-other":
            te_value = rng.choice([b"gzip", b"gzip, chunked", b"identity", b"chunked, gzip",
                                   b"CHUNKED", b"chunked\x0b"])
            wire = request_bytes(b"POST", b"/", [host, ctype, (b"Transfer-Encoding", te_value)],
                                 body)
            return case(wire, f"Transfer-Encoding {te_value!r}", EXPECT_REJECT,
                        well_formed=False, may_close="unknown transfer coding")
        if what == "expect-100":
            wire = request_bytes(b"POST", b"/", [host, ctype, (b"Expect", b"100-continue")], body)
            return case(wire, "Expect: 100-continue", expect)
        if what == "ct-twice":
            other = rng.choice([URLENCODED.encode(), b"text/plain",
                                f"{MULTIPART}; boundary=x".encode()])
            wire = request_bytes(b"POST", b"/", [host, ctype, (b"Content-Type", other)], body)
            return case(wire, f"Content-Type twice ({other!r})", EXPECT_REJECT)
        if what == "huge-header":
            size = rng.choice([8 << 10, 64 << 10, 256 << 10, 1 << 20])
            name = rng.choice([b"X-Fuzz", b"Cookie", b"Referer", b"Content-Type"])
            value = bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789;=") for _ in
                          range(64)) * (size // 64)
            hs = [host, ctype, (name, value)] if name != b"Content-Type" else [host,
                                                                               (name, value)]
            wire = request_bytes(b"POST", b"/", hs, body)
            exp = EXPECT_REJECT if name == b"Content-Type" else None
            return case(wire, f"a {size >> 10} KiB {name.decode()} header", exp,
                        may_close="request header fields too large (RFC 6585 431, or close)")
        if what == "many-headers":
            n = rng.choice([100, 1000, 5000])
            hs = [host, ctype] + [(f"X-H{i}".encode(), b"v") for i in range(n)]
            wire = request_bytes(b"POST", b"/", hs, body)
            return case(wire, f"{n} headers", None,
                        may_close="request header fields too large (RFC 6585 431, or close)")
        if what == "bad-header":
            bad = rng.choice([b"Foo Bar: x", b"Host : x", b"X-A: a\r\n folded", b"X-A: a\x00b",
                              b": novalue", b"NoColon", b"X-A: \xff\xfe", b"X\x01: y",
                              b"X-A: a\rb", b"X-A:\ta\t", b"\x00: y", b"X-\xe9: y"])
            head, _, tail = request_bytes(b"POST", b"/", [host, ctype], body).partition(b"\r\n")
            wire = head + b"\r\n" + bad + b"\r\n" + tail
            return case(wire, f"header line {bad[:20]!r}", None, well_formed=False,
                        may_close="malformed header line (RFC 9112 5: 400 or close)")
        if what == "request-line":
            line = rng.choice([
                b"post / HTTP/1.1", b"FOO / HTTP/1.1", b"GET  / HTTP/1.1", b"GET / HTTP/1.1 x",
                b"GET / HTTP/2.0", b"GET / HTTP/1.2", b"GET / HTTP/9.9", b"GET / HTTP/1.",
                b"GET / http/1.1", b"GET http://127.0.0.1/ HTTP/1.1", b"OPTIONS * HTTP/1.1",
                b"GET * HTTP/1.1", b"PRI * HTTP/2.0", b"G\x00T / HTTP/1.1", b"GET /\t HTTP/1.1",
                b"GET / HTTP/1.1\x00", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                b"GET" + b"A" * 10000 + b" / HTTP/1.1", b"", b" GET / HTTP/1.1",
                b"GET /" + b"a" * 100_000 + b" HTTP/1.1", b"M-SEARCH * HTTP/1.1",
                b"PROPFIND / HTTP/1.1", b"BREW / HTTP/1.1", b"GET\x0b/ HTTP/1.1"])
            wire = line + b"\r\nHost: x\r\n\r\n"
            method = line.split(b" ", 1)[0].decode("latin-1") or "?"
            return case(wire, f"request line {line[:24]!r}", None, well_formed=False,
                        may_close="malformed request line (RFC 9112 3: 400 or close)",
                        method=method, mk=())
        if what == "http10":
            hs = [ctype] + ([(b"Connection", b"keep-alive")] if rng.random() < 0.5 else [])
            if rng.random() < 0.5:
                hs.append(host)
            wire = request_bytes(b"POST", b"/", hs, body, version=b"HTTP/1.0")
            return case(wire, "HTTP/1.0", expect)
        if what == "http09":
            wire = rng.choice([b"GET /\r\n", b"GET /\r\n\r\n", b"GET /healthz\r\n\r\n"])
            return case(wire, f"HTTP/0.9 {wire!r}", None, well_formed=False,
                        may_close="HTTP/0.9 is not supported", method="GET", mk=())
        if what == "host":
            hv = rng.choice([[], [host, host], [host, (b"Host", b"evil.example")],
                             [(b"Host", b"")], [(b"Host", b"a b")], [(b"Host", b"\xff")],
                             [(b"Host", b"x" * 5000)]])
            wire = request_bytes(b"POST", b"/", [*hv, ctype], body)
            return case(wire, f"Host headers {[v[:10] for _, v in hv]!r}", None)
        if what == "utf8-target":
            target = rng.choice([b"/\xff", b"/?\xff=1", b"/%ff", b"/?request=%ff",
                                 b"/\xc3\xa9", b"/?a=\xc3\xa9", b"/%00", b"/?%00=%00"])
            wire = request_bytes(b"POST", target, [host, ctype], body)
            raw = any(c > 127 for c in target)
            return case(wire, f"target {target!r}", None, well_formed=not raw,
                        may_close="non-ASCII bytes in the request target" if raw else None,
                        target=target.decode("latin-1"))
        # upgrade
        up = rng.choice([(b"h2c", []), (b"websocket", [(b"Sec-WebSocket-Key",
                                                        b"dGhlIHNhbXBsZSBub25jZQ=="),
                                                       (b"Sec-WebSocket-Version", b"13")]),
                         (b"foo/1", [])])
        wire = request_bytes(b"GET", b"/", [host, (b"Upgrade", up[0]),
                                            (b"Connection", b"Upgrade"), *up[1]])
        return case(wire, f"Upgrade: {up[0].decode()}", None, method="GET", mk=())

    # -- methods and paths ------------------------------------------------------------------
    def endpoints(self) -> list[str]:
        d = self.m.hex(64)
        return ["/", "/?request=get-public-key-v1", "/?request=nope",
                "/?request=get-public-key-v1&request=get-public-key-v1", "/v1/stamps",
                f"/v1/stamps/sha256/{d}", f"/v1/stamps/sha512/{self.m.hex(128)}",
                f"/v1/stamps/sha1/{d[:40]}", "/v1/keys", "/v1/keys/allowed_signers",
                "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/log.git/HEAD",
                "/log.git/info/refs", "/log.git/objects/info/packs", "/v1", "/v1/",
                "/favicon.ico", "/v1/proofs/1", f"/v1/proofs/git/{d[:40]}", "/tlog/checkpoint",
                "/tlog/vkey", "/tlog/tile/0/000.p/1", "/tlog/tile/entries/000.p/1"]

    def methods(self) -> Case:
        rng = self.rng
        path = rng.choice(self.endpoints())
        method = rng.choice([b"GET", b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"PATCH",
                             b"OPTIONS", b"TRACE", b"CONNECT", b"PROPFIND", b"MKCOL", b"LINK",
                             b"QUERY", b"SEARCH", b"purge", b"X" * 64, b"G\xc3\xa9T"])
        headers = self.headers()
        if rng.random() < 0.5:
            headers.append((b"Accept", rng.choice([b"text/html", b"application/json", b"*/*",
                                                   b"text/html;q=0", b"\xff", b"x" * 2000])))
        if rng.random() < 0.2:
            headers.append((b"Range", rng.choice([b"bytes=0-0", b"bytes=5-1", b"bytes=-1",
                                                  b"bytes=0-1,2-3,4-5", b"lines=1"])))
        if rng.random() < 0.1:
            headers.append((b"If-None-Match", b"*"))
        body = b""
        if rng.random() < 0.3:
            body = rng.choice([b"x", b"request=stamp-tag-v1", b"{}", b"\x00" * 50])
            headers.append((b"Content-Type", URLENCODED.encode()))
        if rng.random() < 0.3:
            q = rng.choice(["limit=0", "limit=101", "limit=-1", "limit=1e2", "limit=\u00b2",
                            "after=99999999999999999999", "after=-1", "limit=1&limit=2",
                            "after=" + "9" * 19, "limit=%00", "x=1", "request="])
            path += ("&" if "?" in path else "?") + urllib.parse.quote(q, safe="=&")
        std = method.decode("latin-1") in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH",
                                           "OPTIONS", "TRACE", "PROPFIND", "MKCOL", "LINK",
                                           "SEARCH", "QUERY", "CONNECT")
        if method == b"CONNECT":
            std = False  # CONNECT takes an authority, not a path
        wire = request_bytes(method, path.encode(), headers, body)
        return Case("methods", f"{method[:10].decode('latin-1')} {path.split('?')[0][:40]}",
                    [wire], [Req(method.decode("latin-1"), path, (), None, well_formed=std)],
                    may_close=None if std else "a method the parser does not know")

    def paths(self) -> Case:
        rng = self.rng
        objects = "objects/" + self.m.hex(40)[:2] + "/" + self.m.hex(40)[2:]
        path = rng.choice([
            "/log.git/../log.git/config", "/log.git/%2e%2e/config",
            "/log.git/%2E%2E/%2E%2E/etc/passwd",
            "/log.git/..%2fconfig", "/log.git/config", "/log.git/objects/../config",
            "/log.git/objects/info/../../config", "/log.git/HEAD%00", "/log.git/HEAD%00.txt",
            "/log.git/%00", "/log.git//HEAD", "/log.git/./HEAD", "/log.git/HEAD/",
            "/log.git/%252e%252e/config", "/log.git/..\\config", "/log.git/%5c..%5cconfig",
            "/log.git/" + "a" * 8000, "/log.git/" + "../" * 50 + "etc/passwd",
            "/log.git/" + objects, "/log.git/objects/pack/pack-" + self.m.hex(40) + ".pack",
            "/log.git/objects/pack/../../../keys/secret-key.asc",
            "/log.git/%2e%2e/keys/secret-key.asc", "/log.git/refs/heads/main",
            "/log.git/info/refs?service=git-upload-pack", "/log.git/git-upload-pack",
            "/log.git/description", "/log.git/hooks/pre-receive", "/log.git/logs/HEAD",
            "/log.git/packed-refs", "/log.git/objects/info/alternates", "/log.git/%ff",
            "/log.git/HEAD;x", "/log.git/HEAD?x=1", "/log.git/\u00e9", "/log.git",
            "/../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "//", "/v1//keys", "/v1/keys/",
            "/v1/stamps/sha256/" + "a" * 100_000, "/v1/stamps/sha256/%00",
            "/v1/stamps/sha256/..%2f..%2fkeys", "/v1/stamps/%2e%2e/keys", "/healthz/../metrics",
            "/docs/../openapi.json", "/?request=get-public-key-v1%00", "/" + "x" * 60_000,
            "/keys/secret-key.asc", "/var/keys/secret-key.asc", "/stampd.sqlite3",
            "/tlog/../keys/secret-key.asc", "/tlog/tile/../../stampd.sqlite3",
            "/tlog/tile/entries/../../../keys/tlog-ed25519/key", "/tlog/%2e%2e/stampd.sqlite3",
            "/tlog//checkpoint", "/tlog/checkpoint/", "/tlog/", "/tlog",
            "/v1/proofs/git/..%2f..%2fkeys", "/v1/proofs/%2e%2e",
        ])
        method = rng.choice([b"GET", b"GET", b"HEAD"])
        target = urllib.parse.quote(path, safe="/%?=&;:\\.").encode("ascii")
        wire = request_bytes(method, target, self.headers())
        return Case("paths", path[:60], [wire], [Req(method.decode(), path)])

    # -- the transparency log ----------------------------------------------------------------
    def tlog(self) -> Case:
        """A GET of the log's files or of a proof: valid (what the rules decide: 200) or
        malformed (4xx), never a wait above 1 s."""
        rng = self.rng
        what = rng.choice(["proof", "proof", "git-proof", "git-proof", "checkpoint", "vkey",
                           "tile", "tile", "entries", "entries", "bad-tile", "bad-tile"])
        path, expect = "/tlog/checkpoint", EXPECT_OK
        if what in ("proof", "git-proof"):
            path, expect = self._proof_target(what == "git-proof")
        elif what == "vkey":
            path = "/tlog/vkey"
        elif what in ("tile", "entries"):
            path, expect = self._tile_target(what == "entries")
        elif what == "bad-tile":
            path = self._bad_tile_target()
            # (/tlog/tile is redirected to /tlog/tile/, as every path of a slash's difference)
            expect = None if path == "/tlog/tile" else EXPECT_REJECT
        method = b"HEAD" if rng.random() < 0.1 else b"GET"
        if method == b"HEAD" and expect == EXPECT_OK:
            expect = None  # (405 or 200: the rules do not say)
        target = urllib.parse.quote(path, safe="/%?=&;:.~+-_").encode("ascii")
        return Case("tlog", f"{what} {path[:60]}", [request_bytes(method, target, self.headers())],
                    [Req(method.decode(), path, (), expect)])

    # -- the witness ---------------------------------------------------------------------
    def witness(self) -> Case:
        """An ``add-checkpoint`` request: of the witnessed log (what the state makes of it:
        200 or 409), or one the rules refuse whatever the state (4xx)."""
        rng = self.rng
        log = WITNESSED
        n = len(log.hashes)
        from_stored = rng.random() < 0.5
        old = self.witness_size if from_stored else rng.randrange(0, n)
        new = rng.randrange(old, n + 1)
        what = rng.choice(["chain", "chain", "unknown", "impostor", "malformed", "bad-proof",
                           "fork", "old-above", "big", "garbage"])
        expect: str | None = EXPECT_REJECT
        if what == "chain":
            body, expect = log.request(old, new), None
            if from_stored:  # (one from elsewhere is refused: 409)
                self.witness_size = new
        elif what == "unknown":
            other = WitnessedLog(f"fuzz.example/{self.m.hex(16)}", leaves=4, seed=bytes(32))
            body = other.request(0, rng.randrange(0, 5))
        elif what == "impostor":
            body = WitnessedLog(log.origin, leaves=8, seed=b"\x09" * 32).request(0, 5)
        elif what == "malformed":
            good = log.request(old, new)
            cut = rng.randrange(0, len(good))
            body = rng.choice([good[:cut], good.replace(b"old ", b"old -", 1),
                               good.replace(b"\n\n", b"\n", 1), b"old 0" + good,
                               good[:cut] + b"\xff" + good[cut + 1:]])
            expect = None if body == good else EXPECT_REJECT
        elif what == "bad-proof":
            new = max(new, old + 2) if old else 0
            if old == 0 or new > n:
                body = log.request(0, 5, proof=(bytes(32),))  # a proof from 0: 422 (or 409)
            else:
                proof = log.proof(old, new)
                body = log.request(old, new, proof=(bytes(32), *proof[1:]))
        elif what == "fork":
            # (from old size 0 every tree is consistent with the empty one: a first checkpoint
            # of another tree, which a witness with nothing stored rightly cosigns; a fork is
            # from a size the witness may hold)
            if old == 0:
                old, new = 1, max(new, 1)
            root = bytes(rng.getrandbits(8) for _ in range(32))
            body = log.request(old, new, checkpoint=log.checkpoint(new, root=root))
            expect = None if new == 0 else EXPECT_REJECT  # (size 0: the checkpoint refuses)
            if new == 0:
                body = b"old 0\n\n" + b"x\n"
                expect = EXPECT_REJECT
        elif what == "old-above":
            # (an old size above the checkpoint's: never at the log's full size, where the old
            # size could only equal it, a request a witness holding that size cosigns)
            new = min(new, n - 1)
            old = new + 1
            body = log.request(old, new, proof=())
        elif what == "big":
            body = log.request(old, new) + b"x" * (64 * 1024)
        else:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
        headers = self.headers((b"Content-Type", b"text/plain"))
        return Case("witness", f"{what} {old}->{new}",
                    [request_bytes(b"POST", b"/add-checkpoint", headers, body)],
                    [Req("POST", "/add-checkpoint", (), expect)])

    def _wait(self) -> tuple[str, bool | None]:
        """('?wait=...' or '', whether it is a valid wait; None: no wait)."""
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            return "", None
        if r < 0.75:
            value = rng.choice(["0", "0.1", "0.5", "1", "1.0", "0e0", "+1", "0.05", ".5", " 1",
                                "1 ", "\u0661"])  # (float() takes an Arabic-Indic one)
            return "?wait=" + urllib.parse.quote(value, safe="+"), True
        bad = rng.choice(["-1", "61", "60.0001", "1e9", "nan", "NaN", "inf", "-inf", "", "abc",
                          "1s", "0x1", "%00", "%ff", "1e999", "-0.1", "9" * 400, "1,5"])
        return "?wait=" + urllib.parse.quote(bad), False

    def _proof_target(self, git: bool) -> tuple[str, str | None]:
        rng = self.rng
        t = self.t
        wait, wait_ok = self._wait()
        if wait_ok is False:
            expect: str | None = EXPECT_REJECT
        else:
            expect = None
        if git:
            r = rng.random()
            if r < 0.4 and t.git_ids:
                value = rng.choice(t.git_ids)
                return f"/v1/proofs/git/{value}{wait}", expect or EXPECT_OK
            if r < 0.6:  # unknown, well-formed: 404 (a wait makes it wait for it)
                value = self.m.hex(rng.choice([40, 64]))
                return f"/v1/proofs/git/{value}{wait}", EXPECT_REJECT
            good = t.git_ids[0] if t.git_ids else self.m.hex(40)
            _, bad = rng.choice(_bad_ids(rng, good))
            return f"/v1/proofs/git/{bad}{wait}", EXPECT_REJECT if bad else None
        r = rng.random()
        if r < 0.4 and t.serials:
            return f"/v1/proofs/{rng.choice(t.serials)}{wait}", expect or EXPECT_OK
        if r < 0.6:
            value = rng.choice(["0", "1", "2", "3", str(rng.randrange(1, 20_000)),
                                "999999999999999999", "9223372036854775807"])
            return f"/v1/proofs/{value}{wait}", expect  # known or not: 200 or 404
        bad = rng.choice(["-1", "+1", "1.0", "1e3", "0x10", "abc", "", "1 ", " 1", "%00",
                          "1%00", "\u0661", "\uff11", "9" * 19, "9" * 1000, "1/2", "..",
                          "01", "00000000000000001", "1;x"])
        # (leading zeros name a serial too; an empty one is the collection's path)
        known = bad in ("01", "00000000000000001", "")
        return f"/v1/proofs/{bad}{wait}", None if known else EXPECT_REJECT

    def _tile_target(self, entries: bool) -> tuple[str, str | None]:
        """A tile or bundle of the tree of ``tree_size``: a full one or a partial view of it
        (as tlog-tiles allows), or the partial one of that size (all must be served); or
        another width of that partial one (only served if the sequencer wrote that width)."""
        rng = self.rng
        size = self.t.tree_size
        full, rest = divmod(size, 256)
        expect: str | None = EXPECT_OK
        if full and (not rest or rng.random() < 0.5):
            n = rng.randrange(full)
            width = rng.choice([None, None, rng.randrange(1, 256)])
        elif rng.random() < 0.7:
            n, width = full, rest
        else:
            n, width, expect = full, rng.randrange(1, rest + 1), None
        suffix = "" if width is None else f".p/{width}"
        level = "entries" if entries else "0"
        return f"/tlog/tile/{level}/{_tile_index(n)}{suffix}", expect

    def _bad_tile_target(self) -> str:
        rng = self.rng
        huge = rng.choice(["x999/x999/x999/x999/x999/x999/999", "x001/" * 7 + "000",
                           "x000/000", "x001/x000/000", "9" * 30, "999"])
        return rng.choice([
            "/tlog/tile/0/5", "/tlog/tile/0/05", "/tlog/tile/0/0000", f"/tlog/tile/0/{huge}",
            f"/tlog/tile/entries/{huge}", "/tlog/tile/64/000", "/tlog/tile/63/000",
            "/tlog/tile/99/000", "/tlog/tile/-1/000", "/tlog/tile/00/000", "/tlog/tile/1/999",
            "/tlog/tile/0/000.p/0", "/tlog/tile/0/000.p/256", "/tlog/tile/0/000.p/257",
            "/tlog/tile/0/000.p/-1", "/tlog/tile/0/000.p/01", "/tlog/tile/0/000.p/",
            "/tlog/tile/0/000.p", "/tlog/tile/0/000.p/1/x", "/tlog/tile/entries/000.p/0",
            "/tlog/tile/entries/000.p/256", "/tlog/tile/entries/000.p/99999999999999999999",
            "/tlog/tile/entries/", "/tlog/tile/entries", "/tlog/tile/", "/tlog/tile",
            "/tlog/tile/1/entries/000", "/tlog/tile/entries/x000", "/tlog/tile/0/x000/",
            "/tlog/tile/0/000%00", "/tlog/tile/0/000\\",
            "/tlog/tile/0/\uff10\uff10\uff10", "/tlog/tile/0/..%2f..%2fcheckpoint",
            "/tlog/tile/../checkpoint", "/tlog/tile/0/../../checkpoint",
            "/tlog/tile/0/%2e%2e/%2e%2e/stampd.sqlite3", "/tlog/tile/0/" + "x000/" * 2000 + "000",
            "/tlog/tile/entries/000.p/" + "9" * 5000, "/tlog/tile/0/000.P/1",
            "/tlog/tile/0/000.p/1.0", "/tlog/tile/0/000.p/+1"
        ])

    # -- pipelines and slow clients ---------------------------------------------------------
    def one_request(self) -> tuple[bytes, Req]:
        """A well-formed request for a pipeline: a stamp (valid or not) or a GET."""
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            fields, markers, expect, _ = self.zg_fields()
            body = urlencode(fields)
            if len(body) > 1000:
                expect = EXPECT_REJECT
            return request_bytes(b"POST", b"/", [(b"Host", self.t.hostport),
                                                 (b"Content-Type", URLENCODED.encode())], body), \
                Req("POST", "/", markers, expect)
        if r < 0.6:
            algorithm = rng.choice(["sha256", "sha512"])
            value = self.m.hex(64 if algorithm == "sha256" else 128)
            return request_bytes(b"POST", b"/v1/stamps", [(b"Host", self.t.hostport),
                                                          (b"Content-Type", JSON.encode())],
                                 json.dumps({algorithm: value}).encode()), \
                Req("POST", "/v1/stamps", (value,), EXPECT_OK)
        path = rng.choice(["/healthz", "/?request=get-public-key-v1", "/v1/keys", "/metrics",
                           "/log.git/info/refs", "/nope"])
        method = rng.choice(["GET", "HEAD"])
        return request_bytes(method.encode(), path.encode(), [(b"Host", self.t.hostport)]), \
            Req(method, path)

    def pipeline(self) -> Case:
        rng = self.rng
        parts = [self.one_request() for _ in range(rng.randrange(2, 5))]
        wire = b"".join(p[0] for p in parts)
        reqs = [p[1] for p in parts]
        if rng.random() < 0.3:
            # Garbage after well-formed requests: the server may close after answering them,
            # but each of them is owed its answer, in order (RFC 9112 9.3.2).
            junk = rng.choice([b"GARBAGE\r\n\r\n", b"\x00\x01\x02", b"GET / HTTP/1.1\r\nX\r\n\r\n"])
            return Case("pipeline", f"{len(parts)} requests, then {junk[:8]!r}", [wire + junk],
                        reqs, trailing_junk=True)
        if rng.random() < 0.3:
            cut = rng.randrange(1, len(wire))
            return Case("pipeline", f"{len(parts)} requests in 2 pieces", [wire[:cut], wire[cut:]],
                        reqs, pause=0.05)
        return Case("pipeline", f"{len(parts)} requests", [wire], reqs)

    def slow(self) -> Case:
        rng = self.rng
        what = rng.choice(["headers-never-end", "byte-pieces", "body-never-comes", "idle"])
        wire, req = self.one_request()
        if what == "headers-never-end":
            cut = wire.index(b"\r\n\r\n")
            return Case("slow", "headers never end", [wire[:rng.randrange(1, cut)]],
                        [Req(req.method, req.target, req.markers, None, well_formed=False)],
                        may_close="request headers never completed (closed after "
                                  "STAMPD_KEEPALIVE_TIMEOUT)")
        if what == "idle":
            return Case("slow", "connect, send nothing", [b""],
                        [Req("GET", "-", (), None, well_formed=False)],
                        may_close="no request was sent (closed after STAMPD_KEEPALIVE_TIMEOUT)")
        if what == "byte-pieces":
            n = rng.randrange(3, 12)
            step = max(1, len(wire) // n)
            pieces = [wire[i:i + step] for i in range(0, len(wire), step)]
            return Case("slow", f"in {len(pieces)} pieces", pieces, [req], pause=0.02)
        # body-never-comes: the head of a POST only
        if req.method != "POST":
            return Case("slow", "in one piece", [wire], [req])
        head = wire[:wire.index(b"\r\n\r\n") + 4]
        return Case("slow", "body never comes",
                    [head], [Req(req.method, req.target, req.markers, EXPECT_REJECT)])
