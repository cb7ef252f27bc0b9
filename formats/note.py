"""Signed notes (c2sp.org/signed-note): text signed by one or more keys, and verifier keys.

A signed note is its *text* (valid UTF-8, no control character but newline, ending in a
newline), a blank line, then one or more signature lines::

    — <key name> <base64(4-byte big-endian key ID || signature)>

(``—`` is the em dash U+2014). The text is separated from the signatures by the *last* blank
line. Key names are non-empty, without Unicode spaces or ``+``. A verifier key (*vkey*) is
``<name>+<8 lowercase hex key ID>+<base64(signature type || public key)>``, and the key ID is
``SHA-256(name || "\\n" || signature type || public key)[:4]``.

Signature types here: ``0x01`` Ed25519 over the note text (:class:`Ed25519Verifier`) and
``0x04`` timestamped Ed25519 cosignatures (c2sp.org/tlog-cosignature, whose verifier is
:class:`formats.tlog.checkpoint.CosignatureVerifier`). Any verifier with a ``name``, a
``key_id`` and ``verify(text, signature)`` fits :func:`open_note`.

Opening a note (:func:`open_note`) follows the spec: signatures from unknown keys (name and
key ID not both those of a given verifier) are kept aside, unverified; a signature from a
known key that fails to verify rejects the whole note; a note with no verified signature is
rejected. Notes with more than :data:`MAX_SIGNATURES` signatures are refused (the spec asks to
accept at least 16).

Signing never sees a private key: a :class:`Signer` carries a callable that signs bytes (an
agent in a worker process). :func:`ed25519_signer` checks what it returns against the public
key before the signature goes into a note.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "ED25519",
    "ED25519_COSIGNATURE",
    "MAX_SIGNATURES",
    "Ed25519Verifier",
    "InvalidSignature",
    "InvalidSigner",
    "MalformedNote",
    "MalformedVerifierKey",
    "Note",
    "NoteError",
    "OpenedNote",
    "Signature",
    "Signer",
    "UnverifiedNote",
    "Verifier",
    "VerifierKey",
    "b64decode_strict",
    "ed25519_signer",
    "ed25519_verify",
    "key_id",
    "open_note",
    "parse_note",
    "sign_note",
    "valid_key_name",
]

ED25519 = 0x01
ED25519_COSIGNATURE = 0x04
# Public key sizes of the signature types a vkey may name here.
_KEY_SIZES = {ED25519: 32, ED25519_COSIGNATURE: 32}
MAX_SIGNATURES = 100
SIGNATURE_PREFIX = "\u2014 "  # em dash, space
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f]")
_HEX_ID = re.compile("[0-9a-f]{8}", re.ASCII)


class NoteError(ValueError):
    """Base of every refusal in :mod:`formats.note`."""


class MalformedNote(NoteError):
    """Not a signed note as c2sp.org/signed-note says (syntax, encoding, too many signatures)."""


class MalformedVerifierKey(NoteError):
    """A vkey that is not ``name+keyid+base64(type || key)`` with the right key ID."""


class UnverifiedNote(NoteError):
    """No signature of the note is from a known key; the parsed note is in ``note``."""

    def __init__(self, note: Note) -> None:
        super().__init__("the note has no signature from a known key")
        self.note = note


class InvalidSignature(NoteError):
    """A signature from a known key does not verify: the whole note is rejected."""


class InvalidSigner(NoteError):
    """A signer with an invalid name, or whose callable returned a bad signature."""


def b64decode_strict(text: str) -> bytes:
    """Standard base64 (RFC 4648 §4) with padding, in its one canonical spelling only."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as e:
        raise ValueError(f"not base64: {text!r}") from e
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError(f"not canonical base64: {text!r}")
    return raw


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_key_name(name: str) -> bool:
    """Non-empty, UTF-8 (a text decoded with ``surrogateescape`` may hold bytes that are
    not), no Unicode space, no ``+`` (and, in a note, no control character)."""
    return (
        bool(name)
        and not _SURROGATE.search(name)
        and "+" not in name
        and not any(c.isspace() for c in name)
        and not _CONTROL.search(name)
    )


def key_id(name: str, sig_type: int, public_key: bytes) -> int:
    """``SHA-256(name || "\\n" || sig_type || public_key)[:4]`` as a big-endian uint32."""
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class Signature:
    """One signature line: key name, key ID and the signature bytes after the key ID."""

    name: str
    key_id: int
    signature: bytes

    def line(self) -> str:
        blob = struct.pack(">I", self.key_id) + self.signature
        return f"{SIGNATURE_PREFIX}{self.name} {base64.b64encode(blob).decode('ascii')}\n"


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise MalformedNote("a note text must end in a newline")
    if _CONTROL.search(text):
        raise MalformedNote("a note text must not hold control characters but newline")


@dataclass(frozen=True)
class Note:
    """A signed note: its text (final newline included) and its signatures, in order."""

    text: str
    signatures: tuple[Signature, ...]

    def __post_init__(self) -> None:
        _check_text(self.text)
        if not self.signatures:
            raise MalformedNote("a signed note has at least one signature")
        if len(self.signatures) > MAX_SIGNATURES:
            raise MalformedNote(f"more than {MAX_SIGNATURES} signatures")
        for s in self.signatures:
            if not valid_key_name(s.name) or not 0 <= s.key_id < 2**32 or not s.signature:
                raise MalformedNote(f"invalid signature line for {s.name!r}")

    def encode(self) -> bytes:
        return (self.text + "\n" + "".join(s.line() for s in self.signatures)).encode()


def _parse_signature_line(line: str) -> Signature:
    if not line.startswith(SIGNATURE_PREFIX):
        raise MalformedNote(f"not a signature line: {line!r}")
    name, space, b64 = line[len(SIGNATURE_PREFIX) :].partition(" ")
    if not space or not valid_key_name(name):
        raise MalformedNote(f"invalid key name in {line!r}")
    try:
        blob = b64decode_strict(b64)
    except ValueError as e:
        raise MalformedNote(str(e)) from e
    if len(blob) < 5:
        raise MalformedNote(f"signature too short in {line!r}")
    (kid,) = struct.unpack(">I", blob[:4])
    return Signature(name, kid, blob[4:])


def parse_note(msg: bytes) -> Note:
    """The text and signature lines of a signed note, checked for syntax only."""
    try:
        decoded = msg.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedNote("a note must be valid UTF-8") from e
    if _CONTROL.search(decoded):
        raise MalformedNote("a note must not hold control characters but newline")
    split = decoded.rfind("\n\n")
    if split < 0:
        raise MalformedNote("no blank line before the signatures")
    text, sigs = decoded[: split + 1], decoded[split + 2 :]
    if not sigs.endswith("\n"):
        raise MalformedNote("the signatures must end in a newline")
    lines = sigs[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise MalformedNote(f"more than {MAX_SIGNATURES} signatures")
    return Note(text, tuple(_parse_signature_line(line) for line in lines))


class Verifier(Protocol):
    """A known key: its name, its key ID and a check of a signature over a note text."""

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> int: ...

    def verify(self, text: bytes, signature: bytes) -> bool: ...


@dataclass(frozen=True)
class VerifierKey:
    """A vkey, ``<name>+<hex key ID>+<base64(type || public key)>``, of a type we know."""

    name: str
    sig_type: int
    public_key: bytes

    def __post_init__(self) -> None:
        if not valid_key_name(self.name):
            raise MalformedVerifierKey(f"invalid key name {self.name!r}")
        size = _KEY_SIZES.get(self.sig_type)
        if size is None:
            raise MalformedVerifierKey(f"unsupported signature type {self.sig_type:#04x}")
        if len(self.public_key) != size:
            raise MalformedVerifierKey(f"public key of {len(self.public_key)} bytes, not {size}")

    @property
    def key_id(self) -> int:
        return key_id(self.name, self.sig_type, self.public_key)

    def encode(self) -> str:
        b64 = base64.b64encode(bytes([self.sig_type]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_id:08x}+{b64}"

    @classmethod
    def parse(cls, vkey: str) -> VerifierKey:
        parts = vkey.split("+", 2)  # (the base64 of the key may hold "+" itself)
        if len(parts) != 3 or not _HEX_ID.fullmatch(parts[1]):
            raise MalformedVerifierKey(f"not name+keyid+key: {vkey!r}")
        try:
            blob = b64decode_strict(parts[2])
        except ValueError as e:
            raise MalformedVerifierKey(str(e)) from e
        if not blob:
            raise MalformedVerifierKey("empty key")
        key = cls(parts[0], blob[0], blob[1:])
        if key.key_id != int(parts[1], 16):
            raise MalformedVerifierKey(f"key ID {parts[1]} is not that of the key")
        return key


def ed25519_verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """RFC 8032 Ed25519 verification (``cryptography``)."""
    if len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (_CryptoInvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Ed25519Verifier:
    """Verifies type 0x01 signatures: Ed25519 over the note text."""

    key: VerifierKey
    name: str = field(init=False)
    key_id: int = field(init=False)

    def __post_init__(self) -> None:
        if self.key.sig_type != ED25519:
            raise MalformedVerifierKey("not an Ed25519 (0x01) note key")
        object.__setattr__(self, "name", self.key.name)
        object.__setattr__(self, "key_id", self.key.key_id)

    @classmethod
    def from_vkey(cls, vkey: str) -> Ed25519Verifier:
        return cls(VerifierKey.parse(vkey))

    def verify(self, text: bytes, signature: bytes) -> bool:
        return ed25519_verify(self.key.public_key, signature, text)


@dataclass(frozen=True)
class OpenedNote:
    """A note opened with known keys: its text, the signatures verified and those ignored."""

    text: str
    verified: tuple[Signature, ...]
    unverified: tuple[Signature, ...]


def open_note(msg: bytes, verifiers: Iterable[Verifier]) -> OpenedNote:
    """Parse ``msg`` and verify it with the known keys ``verifiers`` (see the module text)."""
    known: dict[tuple[str, int], Verifier] = {}
    for v in verifiers:
        if (v.name, v.key_id) in known:
            raise NoteError(f"two verifiers for the key {v.name}+{v.key_id:08x}")
        known[v.name, v.key_id] = v
    note = parse_note(msg)
    text = note.text.encode()
    verified: list[Signature] = []
    unverified: list[Signature] = []
    for sig in note.signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            if sig not in unverified:
                unverified.append(sig)
            continue
        if not verifier.verify(text, sig.signature):
            raise InvalidSignature(f"invalid signature for key {sig.name}+{sig.key_id:08x}")
        if sig not in verified:
            verified.append(sig)
    if not verified:
        raise UnverifiedNote(note)
    return OpenedNote(note.text, tuple(verified), tuple(unverified))


@dataclass(frozen=True)
class Signer:
    """A key name, its key ID and a callable that signs the note text (the private key lives
    elsewhere: an agent)."""

    name: str
    key_id: int
    sign: Callable[[bytes], bytes]


def ed25519_signer(name: str, public_key: bytes, sign: Callable[[bytes], bytes]) -> Signer:
    """A type 0x01 signer; each signature ``sign`` returns is checked against ``public_key``."""
    key = VerifierKey(name, ED25519, public_key)

    def checked(text: bytes) -> bytes:
        signature = sign(text)
        if not ed25519_verify(public_key, signature, text):
            raise InvalidSigner(f"the signer of {name} returned a signature that does not verify")
        return signature

    return Signer(name, key.key_id, checked)


def sign_note(text: str, signers: Sequence[Signer], keep: Sequence[Signature] = ()) -> Note:
    """The note of ``text`` signed by each of ``signers``, after the signatures ``keep`` (say,
    those it already had) less any from the same keys."""
    _check_text(text)
    new = []
    for s in signers:
        if not valid_key_name(s.name):
            raise InvalidSigner(f"invalid key name {s.name!r}")
        signature = s.sign(text.encode())
        if not signature:
            raise InvalidSigner(f"the signer of {s.name} returned nothing")
        new.append(Signature(s.name, s.key_id, signature))
    replaced = {(s.name, s.key_id) for s in signers}
    kept = tuple(s for s in keep if (s.name, s.key_id) not in replaced)
    return Note(text, (*kept, *new))
