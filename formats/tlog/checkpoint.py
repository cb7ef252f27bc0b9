"""Checkpoints (c2sp.org/tlog-checkpoint) and Ed25519 cosignatures (c2sp.org/tlog-cosignature).

A checkpoint body is the note text::

    <origin>\\n
    <tree size, decimal, no leading zero>\\n
    <base64 root hash>\\n
    [<extension line>\\n ...]

signed as a note (:mod:`formats.note`) by the log and, as cosignatures, by witnesses. A v1
Ed25519 cosignature (signature type 0x04, key ID ``SHA-256(name || "\\n" || 0x04 || key)[:4]``)
is the 8-byte big-endian POSIX ``timestamp`` followed by the Ed25519 signature of::

    cosignature/v1\\n
    time <timestamp>\\n
    <the whole checkpoint body>
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from formats.note import (
    ED25519_COSIGNATURE,
    MalformedVerifierKey,
    Signature,
    VerifierKey,
    b64decode_strict,
    ed25519_verify,
)
from formats.tlog.errors import MalformedCheckpoint
from formats.tlog.merkle import EMPTY_ROOT, HASH_SIZE, MAX_TREE_SIZE

__all__ = [
    "COSIGNATURE_HEADER",
    "Checkpoint",
    "CosignatureVerifier",
    "cosign",
    "cosignature_message",
    "cosignature_timestamp",
]

COSIGNATURE_HEADER = b"cosignature/v1\n"
MAX_TIMESTAMP = 2**63 - 1
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)
_CONTROL = re.compile("[\x00-\x1f]")


@dataclass(frozen=True)
class Checkpoint:
    """A log's tree head: its origin, its size and its root hash, and extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for line in (self.origin, *self.extensions):
            if not line or _CONTROL.search(line):
                raise MalformedCheckpoint(f"empty line or control character in {line!r}")
        if not 0 <= self.size <= MAX_TREE_SIZE:
            raise MalformedCheckpoint(f"tree size {self.size} out of range")
        if len(self.root) != HASH_SIZE:
            raise MalformedCheckpoint(f"root hash of {len(self.root)} bytes, not {HASH_SIZE}")
        if self.size == 0 and self.root != EMPTY_ROOT:
            raise MalformedCheckpoint("the root of the empty tree is SHA-256 of the empty string")

    def body(self) -> str:
        """The note text: origin, size, base64 root, extensions, each ending in a newline."""
        root = base64.b64encode(self.root).decode("ascii")
        return "".join(
            f"{line}\n" for line in (self.origin, str(self.size), root, *self.extensions)
        )

    @classmethod
    def parse(cls, body: str) -> Checkpoint:
        """The checkpoint of a note text, refusing anything the spec does not allow."""
        if not body.endswith("\n"):
            raise MalformedCheckpoint("a checkpoint body ends in a newline")
        lines = body[:-1].split("\n")
        if len(lines) < 3:
            raise MalformedCheckpoint("a checkpoint body has at least three lines")
        origin, size, root, *extensions = lines
        if not _DECIMAL.fullmatch(size):
            raise MalformedCheckpoint(f"tree size {size!r} is not a decimal without leading zero")
        try:
            root_hash = b64decode_strict(root)
        except ValueError as e:
            raise MalformedCheckpoint(str(e)) from e
        return cls(origin, int(size), root_hash, tuple(extensions))


def cosignature_message(body: str, timestamp: int) -> bytes:
    """What a v1 Ed25519 cosigner signs over a checkpoint body at ``timestamp``."""
    if not 0 <= timestamp <= MAX_TIMESTAMP:
        raise MalformedCheckpoint(f"cosignature timestamp {timestamp} out of range")
    return COSIGNATURE_HEADER + b"time %d\n" % timestamp + body.encode()


def cosignature_timestamp(signature: bytes) -> int:
    """The timestamp of a cosignature's signature bytes (after the key ID)."""
    if len(signature) != 8 + 64:
        raise MalformedCheckpoint(f"cosignature of {len(signature)} bytes, not 72")
    (timestamp,) = struct.unpack(">Q", signature[:8])
    if timestamp > MAX_TIMESTAMP:
        raise MalformedCheckpoint(f"cosignature timestamp {timestamp} above 2**63 - 1")
    return int(timestamp)


@dataclass(frozen=True)
class CosignatureVerifier:
    """Verifies type 0x04 signatures (a witness's cosignatures) over a checkpoint note text."""

    key: VerifierKey
    name: str = field(init=False)
    key_id: int = field(init=False)

    def __post_init__(self) -> None:
        if self.key.sig_type != ED25519_COSIGNATURE:
            raise MalformedVerifierKey("not an Ed25519 cosignature (0x04) key")
        object.__setattr__(self, "name", self.key.name)
        object.__setattr__(self, "key_id", self.key.key_id)

    @classmethod
    def from_vkey(cls, vkey: str) -> CosignatureVerifier:
        return cls(VerifierKey.parse(vkey))

    def verify(self, text: bytes, signature: bytes) -> bool:
        try:
            timestamp = cosignature_timestamp(signature)
            message = cosignature_message(text.decode(), timestamp)
        except (MalformedCheckpoint, UnicodeDecodeError):
            return False
        return ed25519_verify(self.key.public_key, signature[8:], message)


def cosign(
    body: str, name: str, public_key: bytes, timestamp: int, sign: Callable[[bytes], bytes]
) -> Signature:
    """The cosignature line of a checkpoint ``body`` at ``timestamp`` by the cosigner ``name``
    whose key signs through ``sign``; checked against ``public_key``."""
    key = VerifierKey(name, ED25519_COSIGNATURE, public_key)
    message = cosignature_message(body, timestamp)
    signature = sign(message)
    if not ed25519_verify(public_key, signature, message):
        raise MalformedCheckpoint(f"the signer of {name} returned a signature that does not verify")
    return Signature(name, key.key_id, struct.pack(">Q", timestamp) + signature)
