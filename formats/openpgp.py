"""OpenPGP v4 detached signatures, built byte by byte (RFC 4880), with no I/O.

gpg-agent only turns a digest into raw signature values (see :mod:`workers.agents.gpg`); the packet
around them is public data that we build here, so that signing needs no ``gpg`` process:

1. :func:`signature_hashed_part` — version 4, signature type, algorithms and the hashed
   subpackets (creation time, issuer fingerprint);
2. :func:`signature_digest` — the hash over the data, the hashed part and the v4 trailer;
3. the agent signs that digest (``sign(hash_algo, digest) -> values``);
4. :func:`signature_packet` — hashed part, unhashed subpackets (issuer key id), the left 16 bits
   of the digest and the values as MPIs, in a new-format packet (tag 2);
5. :func:`armor_signature` — ASCII armor *without* ``Version:``/``Comment:`` headers: the
   git-timestamp client requires the blank line right after the BEGIN line.

:func:`detached_signature` runs the whole chain. Signatures are binary-mode (type 0x00): the
data is hashed as is, with no line-ending normalisation, which is what git verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "HASH_NAMES",
    "HASH_SIZES",
    "H_SHA256",
    "H_SHA384",
    "H_SHA512",
    "PK_DSA",
    "PK_ECDSA",
    "PK_EDDSA",
    "PK_RSA",
    "SIGNATURE_VALUE_COUNT",
    "SIG_BINARY",
    "KeyInfo",
    "PreparedSignature",
    "armor_signature",
    "crc24",
    "dearmor_signature",
    "detached_signature",
    "encode_mpi",
    "encode_packet",
    "finish_signature",
    "hash_algo_for",
    "prepare_signature",
    "signature_digest",
    "signature_hashed_part",
    "signature_packet",
    "signed_message",
]

# Public-key algorithms (RFC 4880 9.1; 22 is the v4 "EdDSA legacy" of RFC 9580).
PK_RSA = 1
PK_DSA = 17
PK_ECDSA = 19
PK_EDDSA = 22

# Hash algorithms (RFC 4880 9.4).
H_SHA256 = 8
H_SHA384 = 9
H_SHA512 = 10

# Signature type: signature of a binary document (RFC 4880 5.2.1).
SIG_BINARY = 0x00

HASH_NAMES: dict[int, str] = {H_SHA256: "sha256", H_SHA384: "sha384", H_SHA512: "sha512"}
"""hashlib (and gpg-agent ``SETHASH --hash=``) names of the supported hash algorithms."""

HASH_SIZES: dict[int, int] = {H_SHA256: 32, H_SHA384: 48, H_SHA512: 64}
"""Digest sizes in bytes."""

SIGNATURE_VALUE_COUNT: dict[int, int] = {PK_RSA: 1, PK_DSA: 2, PK_ECDSA: 2, PK_EDDSA: 2}
"""How many MPIs a signature of each public-key algorithm carries (RSA ``s``; else ``r, s``)."""

_TAG_SIGNATURE = 2
_SUBPACKET_CREATION_TIME = 2
_SUBPACKET_ISSUER_KEY_ID = 16
_SUBPACKET_ISSUER_FINGERPRINT = 33

_HEX40 = re.compile(r"[0-9A-F]{40}")

# Curves whose group order is longer than 256 bits: gpg-agent refuses a shorter digest for them
# ("Invalid length"); a longer one is truncated to the order's length, which is what ECDSA wants.
_CURVE_HASHES: dict[str, int] = {
    "nistp384": H_SHA384,
    "brainpoolp384r1": H_SHA384,
    "nistp521": H_SHA512,
    "brainpoolp512r1": H_SHA512,
}

_ARMOR_BEGIN = "-----BEGIN PGP SIGNATURE-----"
_ARMOR_END = "-----END PGP SIGNATURE-----"
_ARMOR_LINE = 64


@dataclass(frozen=True)
class KeyInfo:
    """What signing needs to know about a key.

    ``fingerprint``, ``keygrip``, ``pubkey_algo``, ``bits`` and ``curve`` describe the key that
    signs (the primary key or a signing subkey); ``uid`` is the first user id of the primary key.
    """

    fingerprint: str
    """40 uppercase hex digits (v4 fingerprint)."""
    keygrip: str
    """40 uppercase hex digits (``gpg --with-keygrip``): how gpg-agent names the secret key."""
    pubkey_algo: int
    """One of the ``PK_*`` constants."""
    bits: int
    """Key size: modulus or prime bits for RSA/DSA, curve bits for ECC (255 for ed25519)."""
    curve: str | None
    """Curve name as gpg spells it (``ed25519``, ``nistp256``, ``brainpoolP384r1``...);
    ``None`` for RSA and DSA."""
    uid: str
    """``Name <email>`` of the primary key's first user id."""

    def __post_init__(self) -> None:
        if not _HEX40.fullmatch(self.fingerprint):
            raise ValueError(f"fingerprint must be 40 uppercase hex digits: {self.fingerprint!r}")
        if not _HEX40.fullmatch(self.keygrip):
            raise ValueError(f"keygrip must be 40 uppercase hex digits: {self.keygrip!r}")
        if self.pubkey_algo not in SIGNATURE_VALUE_COUNT:
            raise ValueError(f"unsupported public-key algorithm {self.pubkey_algo}")
        if self.bits <= 0:
            raise ValueError(f"key size must be positive: {self.bits}")

    @property
    def key_id(self) -> str:
        """The long key id: the last 16 hex digits of the fingerprint."""
        return self.fingerprint[-16:]


def hash_algo_for(key: KeyInfo) -> int:
    """The hash algorithm to sign with ``key``.

    SHA-256 unless the key needs a longer digest: gpg-agent rejects a digest shorter than the
    group order of an ECDSA curve, so 384-bit curves get SHA-384 and nistp521/brainpoolP512r1
    get SHA-512. DSA keys made by GnuPG have a 160-, 224- or 256-bit ``q``; the agent truncates
    SHA-256 to ``q`` as FIPS 186 prescribes. EdDSA hashes the digest again internally, so
    SHA-256 suffices for ed25519.
    """
    if key.pubkey_algo in (PK_ECDSA, PK_EDDSA):
        if key.curve is not None and key.curve.lower() in _CURVE_HASHES:
            return _CURVE_HASHES[key.curve.lower()]
        # An unknown curve: pick a digest at least as long as the group order.
        if key.bits > 384:
            return H_SHA512
        if key.bits > 256:
            return H_SHA384
    return H_SHA256


def _check_hash_algo(hash_algo: int) -> None:
    if hash_algo not in HASH_NAMES:
        raise ValueError(f"unsupported hash algorithm {hash_algo}")


def encode_mpi(value: int) -> bytes:
    """A multiprecision integer (RFC 4880 3.2): 2-octet bit count, then big-endian octets.

    The bit count is that of the value itself, so leading zero bits and bytes are dropped;
    zero is ``00 00`` with no octets.
    """
    if value < 0:
        raise ValueError("an MPI cannot be negative")
    bits = value.bit_length()
    if bits > 0xFFFF:
        raise ValueError(f"an MPI cannot hold {bits} bits")
    return bits.to_bytes(2, "big") + value.to_bytes((bits + 7) // 8, "big")


def _new_format_length(length: int) -> bytes:
    """A new-format body length (RFC 4880 4.2.2): 1, 2 or 5 octets; also used by subpackets."""
    if length < 0:
        raise ValueError("a length cannot be negative")
    if length < 192:
        return bytes([length])
    if length < 8384:
        length -= 192
        return bytes([(length >> 8) + 192, length & 0xFF])
    if length <= 0xFFFFFFFF:
        return b"\xff" + length.to_bytes(4, "big")
    raise ValueError(f"length {length} does not fit a packet")


def encode_packet(tag: int, body: bytes) -> bytes:
    """A packet with a new-format header (``0xC0 | tag``) and a definite length."""
    if not 0 <= tag <= 63:
        raise ValueError(f"packet tag out of range: {tag}")
    return bytes([0xC0 | tag]) + _new_format_length(len(body)) + body


def _subpacket(kind: int, body: bytes) -> bytes:
    return _new_format_length(len(body) + 1) + bytes([kind]) + body


def signature_hashed_part(
    key: KeyInfo, created: int, hash_algo: int, sig_type: int = SIG_BINARY
) -> bytes:
    """The hashed part of a v4 signature packet (RFC 4880 5.2.3).

    Version 4, ``sig_type``, the key's public-key algorithm, ``hash_algo`` and the
    length-prefixed hashed subpackets: signature creation time (``created``, seconds since
    the epoch) and issuer fingerprint (v4).
    """
    _check_hash_algo(hash_algo)
    if not 0 <= created <= 0xFFFFFFFF:
        raise ValueError(f"creation time out of range: {created}")
    if not 0 <= sig_type <= 0xFF:
        raise ValueError(f"signature type out of range: {sig_type}")
    subpackets = _subpacket(_SUBPACKET_CREATION_TIME, created.to_bytes(4, "big")) + _subpacket(
        _SUBPACKET_ISSUER_FINGERPRINT, b"\x04" + bytes.fromhex(key.fingerprint)
    )
    return (
        bytes([4, sig_type, key.pubkey_algo, hash_algo])
        + len(subpackets).to_bytes(2, "big")
        + subpackets
    )


def _parse_hashed_part(hashed_part: bytes) -> tuple[int, int]:
    """Check the shape of a hashed part; return its public-key and hash algorithms."""
    if len(hashed_part) < 6 or hashed_part[0] != 4:
        raise ValueError("not the hashed part of a version 4 signature")
    if 6 + int.from_bytes(hashed_part[4:6], "big") != len(hashed_part):
        raise ValueError("hashed subpacket length does not match the hashed part")
    return hashed_part[2], hashed_part[3]


def signature_digest(data: bytes | Iterable[bytes], hashed_part: bytes, hash_algo: int) -> bytes:
    """The digest a v4 signature signs: ``hash(data || hashed_part || 04 FF || len)``.

    ``len`` is the 4-octet big-endian length of ``hashed_part`` (RFC 4880 5.2.4). ``data``
    may come in pieces (an iterable of bytes), hashed one at a time.
    """
    _check_hash_algo(hash_algo)
    digest = hashlib.new(HASH_NAMES[hash_algo])
    for piece in (data,) if isinstance(data, bytes) else data:
        digest.update(piece)
    digest.update(hashed_part)
    digest.update(b"\x04\xff" + len(hashed_part).to_bytes(4, "big"))
    return digest.digest()


def signature_packet(
    hashed_part: bytes, digest: bytes, key: KeyInfo, values: Sequence[int]
) -> bytes:
    """The complete signature packet (tag 2), new-format header included.

    ``values`` are the signature values in OpenPGP order (RSA ``[s]``; DSA, ECDSA and EdDSA
    ``[r, s]``). The unhashed area carries the issuer key id for older verifiers.
    """
    pubkey_algo, hash_algo = _parse_hashed_part(hashed_part)
    if pubkey_algo != key.pubkey_algo:
        raise ValueError(
            f"hashed part is for public-key algorithm {pubkey_algo}, key is {key.pubkey_algo}"
        )
    _check_hash_algo(hash_algo)
    if len(digest) != HASH_SIZES[hash_algo]:
        raise ValueError(f"digest of {len(digest)} bytes does not fit hash algorithm {hash_algo}")
    expected = SIGNATURE_VALUE_COUNT[key.pubkey_algo]
    if len(values) != expected:
        raise ValueError(
            f"public-key algorithm {key.pubkey_algo} needs {expected} signature values, "
            f"got {len(values)}"
        )
    unhashed = _subpacket(_SUBPACKET_ISSUER_KEY_ID, bytes.fromhex(key.key_id))
    body = b"".join(
        [
            hashed_part,
            len(unhashed).to_bytes(2, "big"),
            unhashed,
            digest[:2],
            *(encode_mpi(value) for value in values),
        ]
    )
    return encode_packet(_TAG_SIGNATURE, body)


def _crc24_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
        table.append(crc & 0xFFFFFF)
    return tuple(table)


_CRC24_TABLE = _crc24_table()


def crc24(data: bytes) -> int:
    """The CRC-24 of OpenPGP armor (RFC 4880 6.1)."""
    crc = 0xB704CE
    table = _CRC24_TABLE
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFF) ^ table[(crc >> 16) ^ byte]
    return crc


def armor_signature(packet: bytes) -> str:
    """ASCII armor for a signature: no armor headers, 64-column base64, CRC-24 checksum."""
    encoded = base64.b64encode(packet).decode("ascii")
    lines = [encoded[i : i + _ARMOR_LINE] for i in range(0, len(encoded), _ARMOR_LINE)]
    checksum = base64.b64encode(crc24(packet).to_bytes(3, "big")).decode("ascii")
    return (
        "".join(
            [
                _ARMOR_BEGIN,
                "\n\n",
                *(line + "\n" for line in lines),
                "=",
                checksum,
                "\n",
                _ARMOR_END,
            ]
        )
        + "\n"
    )


def dearmor_signature(text: str) -> bytes:
    """The packets inside one armored signature block; checks the CRC-24 when present.

    Accepts armor headers and ``\\r\\n`` line endings, so it reads gpg's output too.
    """
    lines = [line.rstrip("\r") for line in text.strip().split("\n")]
    if len(lines) < 3 or lines[0] != _ARMOR_BEGIN or lines[-1] != _ARMOR_END:
        raise ValueError("not an armored PGP signature")
    try:
        blank = lines.index("")
    except ValueError:
        raise ValueError("armor lacks the blank line after its headers") from None
    body = lines[blank + 1 : -1]
    checksum: str | None = None
    if body and body[-1].startswith("="):
        checksum = body.pop()[1:]
    try:
        packets = base64.b64decode("".join(body), validate=True)
        expected = base64.b64decode(checksum, validate=True) if checksum is not None else None
    except binascii.Error as exc:
        raise ValueError(f"bad base64 in armor: {exc}") from None
    if expected is not None and int.from_bytes(expected, "big") != crc24(packets):
        raise ValueError("armor checksum mismatch")
    return packets


LITERAL_DATA = 11


def signed_message(payload: bytes, signature_packets: bytes) -> bytes:
    """An OpenPGP signed message (RFC 4880 11.3: the signature packets, then a literal data
    packet holding ``payload``, binary, no file name, no date) made of a detached signature
    over ``payload``: a binary signature (class 0x00) over the literal data's contents is one
    over the payload. Several of them are checked by one ``gpg --verify-files`` run."""
    return signature_packets + encode_packet(LITERAL_DATA, b"b\x00\x00\x00\x00\x00" + payload)


@dataclass(frozen=True)
class PreparedSignature:
    """A signature up to the agent's part: its hashed part and the digest the agent signs."""

    hash_algo: int
    hashed_part: bytes
    digest: bytes


def prepare_signature(
    data: bytes | Iterable[bytes], key: KeyInfo, created: int, sig_type: int = SIG_BINARY
) -> PreparedSignature:
    """What a signature of ``data`` by ``key`` made at ``created`` needs signed."""
    hash_algo = hash_algo_for(key)
    hashed_part = signature_hashed_part(key, created, hash_algo, sig_type)
    return PreparedSignature(hash_algo, hashed_part,
                             signature_digest(data, hashed_part, hash_algo))


def finish_signature(prepared: PreparedSignature, key: KeyInfo, values: Sequence[int]) -> str:
    """The armored signature of ``prepared``, given the agent's signature ``values``."""
    return armor_signature(signature_packet(prepared.hashed_part, prepared.digest, key, values))


def detached_signature(
    data: bytes | Iterable[bytes],
    key: KeyInfo,
    created: int,
    sign: Callable[[int, bytes], Sequence[int]],
    *,
    sig_type: int = SIG_BINARY,
) -> str:
    """An armored detached signature of ``data`` by ``key``, made at ``created``.

    ``sign(hash_algo, digest)`` produces the signature values in OpenPGP order, e.g.
    ``lambda algo, digest: connection.sign(key.keygrip, algo, digest)``.
    """
    prepared = prepare_signature(data, key, created, sig_type)
    return finish_signature(prepared, key, list(sign(prepared.hash_algo, prepared.digest)))
