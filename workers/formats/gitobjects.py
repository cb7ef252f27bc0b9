"""Pure construction of the git objects stampd signs: tags and commits, with embedded signatures.

Byte layout follows git (docs/protocol.md): a tag's signature is appended after its
message; a commit's goes into a ``gpgsig`` header right before the blank line, each further line
prefixed by one space. The signed payload is the object without its signature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


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
    """Insert ``signature`` as the ``gpgsig`` header just before the blank line."""
    if not signature.endswith("\n"):
        raise ValueError("signature must end in a newline")
    end = payload.index(b"\n\n") + 1
    folded = signature[:-1].replace("\n", "\n ") + "\n"
    return payload[:end] + f"{header} {folded}".encode("ascii") + payload[end:]


def git_object_id(kind: str, body: bytes) -> str:
    """SHA-1 object id of a git object of ``kind`` ("tag", "commit", ...)."""
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()
