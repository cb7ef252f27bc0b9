"""Pure construction of the git objects stampd signs: tags and commits, with embedded signatures.

Byte layout follows git (docs/protocol.md): a tag's signature is appended after its
message; a commit's goes into a ``gpgsig`` header (``gpgsig-sha256`` in a SHA-256 repository)
right before the blank line, each further line prefixed by one space. The signed payload is the
object without its signature.

A repository's object format (``sha1`` or ``sha256``, `OBJECT_FORMATS`) decides how long its
object ids are, which hash names an object and which header carries a commit's signature; a tag
is signed the same way in both.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

SHA1 = "sha1"
SHA256 = "sha256"
# object format -> (hex digits of an object id, the commit header that carries the signature)
OBJECT_FORMATS: dict[str, tuple[int, str]] = {SHA1: (40, "gpgsig"), SHA256: (64, "gpgsig-sha256")}
# object format -> its hash function (the function itself: hashlib.new looks the name up
# every time, half a microsecond more for each stamp)
_HASHES = {SHA1: hashlib.sha1, SHA256: hashlib.sha256}
# object format -> the pattern of its object ids (lowercase hex), and either one's
ID_PATTERNS = {name: f"[0-9a-f]{{{digits}}}" for name, (digits, _) in OBJECT_FORMATS.items()}
OBJECT_ID = re.compile("|".join(ID_PATTERNS.values()))


def object_format_of(oid: str) -> str:
    """The object format whose ids have the length of ``oid``; `ValueError` for any other."""
    for name, (digits, _) in OBJECT_FORMATS.items():
        if len(oid) == digits:
            return name
    raise ValueError(f"an object id has 40 (SHA-1) or 64 (SHA-256) hex digits, not {len(oid)}")


def signature_header(object_format: str) -> str:
    """The commit header git reads the signature from in a repository of ``object_format``."""
    return OBJECT_FORMATS[object_format][1]


def tag_payload(commit: str, tagname: str, uid: str, t: int, message: str) -> bytes:
    return (
        f"object {commit}\ntype commit\ntag {tagname}\ntagger {uid} {t} +0000\n\n{message}"
    ).encode("ascii")


def commit_payload(
    tree: str, parents: Sequence[str], uid: str, t: int, message: str
) -> bytes:
    head = f"tree {tree}\n" + "".join(f"parent {p}\n" for p in parents)
    ident = f"{uid} {t} +0000"
    return f"{head}author {ident}\ncommitter {ident}\n\n{message}".encode("ascii")


def embed_tag_signature(payload: bytes, signature: str) -> bytes:
    if not payload.endswith(b"\n") or not signature.endswith("\n"):
        raise ValueError("tag payload and signature must end in a newline")
    return payload + signature.encode("ascii")


def embed_commit_signature(payload: bytes, signature: str, header: str = "gpgsig") -> bytes:
    """Insert ``signature`` as the ``header`` header (`signature_header`) just before the
    blank line."""
    if not signature.endswith("\n"):
        raise ValueError("signature must end in a newline")
    end = payload.index(b"\n\n") + 1
    folded = signature[:-1].replace("\n", "\n ") + "\n"
    return payload[:end] + f"{header} {folded}".encode("ascii") + payload[end:]


def git_object_id(kind: str, body: bytes, object_format: str = SHA1) -> str:
    """Object id of a git object of ``kind`` ("tag", "commit", ...) in a repository of
    ``object_format``: ``<hash>("<kind> <length>\\0" + body)``."""
    hash_function = _HASHES.get(object_format)
    if hash_function is None:
        raise ValueError(f"unknown object format {object_format!r}")
    return hash_function(f"{kind} {len(body)}\0".encode() + body).hexdigest()


# The lines that start a signature block git knows (gpg-interface.c), in a tag's body.
_SIGNATURE_START = re.compile(
    rb"^-----BEGIN (?:PGP SIGNATURE|PGP MESSAGE|SIGNED MESSAGE|SSH SIGNATURE)-----\n", re.M)
SIGNATURE_HEADERS = tuple(header for _, header in OBJECT_FORMATS.values())


def split_signed(kind: str, body: bytes, object_format: str = SHA1
                 ) -> tuple[bytes, bytes | None, int]:
    """(payload, signature, signatures found) of a tag or commit as git splits it to verify it.

    A commit: the signature is the ``gpgsig`` header of ``object_format`` (``gpgsig-sha256``
    in a SHA-256 repository) with its continuation lines unfolded; the payload is the commit
    without the signature headers of any format (commit.c ``parse_signed_commit``). A tag: the
    signature starts at the last line that begins a signature block; the payload is what comes
    before it. ``signatures found``: how many signature headers (or blocks) there are, so that
    a caller can refuse more than one. No signature: ``(body, None, 0)``."""
    if kind == "tag":
        starts = [m.start() for m in _SIGNATURE_START.finditer(body)]
        if not starts:
            return body, None, 0
        return body[:starts[-1]], body[starts[-1]:], len(starts)
    if kind != "commit":
        raise ValueError(f"only tags and commits are signed, not a {kind}")
    wanted = OBJECT_FORMATS[object_format][1]
    end = body.find(b"\n\n")
    head, rest = (body, b"") if end < 0 else (body[:end + 1], body[end + 1:])
    payload: list[bytes] = []
    signature: list[bytes] | None = None
    found = 0
    in_sig = current_is_wanted = False
    for line in head.splitlines(keepends=True):
        if in_sig and line.startswith(b" "):
            if signature is not None and current_is_wanted:
                signature.append(line[1:])
            continue
        in_sig = False
        name = line.split(b" ", 1)[0].decode("ascii", "replace")
        if name in SIGNATURE_HEADERS and b" " in line:
            in_sig, found = True, found + 1
            current_is_wanted = name == wanted
            if current_is_wanted:
                signature = [line[len(name) + 1:]]
            continue
        payload.append(line)
    if signature is None:
        return b"".join(payload) + rest, None, found
    return b"".join(payload) + rest, b"".join(signature), found
