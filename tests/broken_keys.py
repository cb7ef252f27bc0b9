"""Key files broken in the ways a server must notice before it signs (helpers, no fixtures).

- `corrupt_armor`: one base64 character of an armored key changed; gpg refuses the file (its
  CRC-24 no longer matches).
- `wrong_secret`: the fixed test key with another secret scalar, checksums fixed up: gpg imports
  it, its fingerprint is the test key's, gpg-agent signs with it, and only the signature shows
  that the secret key does not belong to the public key.
- `corrupt_ssh_key`: an OpenSSH private key file that ssh-keygen cannot load.
- `revoked_public_key`: the fixed test key's public key with a revocation signature by itself;
  `sign_as_test_key` signs as the test key (no agent): gpg then reports a good signature
  by it with REVKEYSIG beside VALIDSIG, and exits 0.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from formats.openpgp import (
    PK_EDDSA,
    KeyInfo,
    crc24,
    detached_signature,
    encode_packet,
    prepare_signature,
    signature_packet,
)

_SIG_KEY_REVOCATION = 0x20  # RFC 4880 5.2.1


def _armor_parts(armored: str) -> tuple[list[str], bytes]:
    lines = armored.strip().splitlines()
    body = lines[lines.index("") + 1:-1]
    return lines, base64.b64decode("".join(line for line in body if not line.startswith("=")))


def _armor(lines: list[str], data: bytes) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    crc = base64.b64encode(crc24(data).to_bytes(3, "big")).decode("ascii")
    body = [b64[i:i + 64] for i in range(0, len(b64), 64)]
    return "\n".join([lines[0], "", *body, "=" + crc, lines[-1]]) + "\n"


def corrupt_armor(path: Path) -> None:
    """Change one base64 character in the middle of the armored key at ``path``."""
    lines = path.read_text().splitlines()
    i = len(lines) // 2
    line = lines[i]
    lines[i] = line[:10] + ("B" if line[10] == "A" else "A") + line[11:]
    path.write_text("\n".join(lines) + "\n")


def wrong_secret(armored: str) -> str:
    """The unprotected ed25519 secret key ``armored`` (an old-format secret key packet first,
    as gpg exports the test key) with the last byte of its secret scalar changed."""
    lines, packets = _armor_parts(armored)
    data = bytearray(packets)
    # ctb 0x94: old format, tag 5, one length byte; an ed25519 key's packet is 88 bytes:
    # version, time, algorithm, OID (10), public point MPI (2 + 33), S2K usage 0, then the
    # secret scalar MPI (2 + 32) and a two-byte checksum (the sum of the MPI's bytes).
    assert data[0] == 0x94 and data[1] == 88 and data[2 + 51] == 0, "not the test key's layout"
    mpi = 2 + 52
    data[mpi + 2 + 31] ^= 0x01
    data[mpi + 34:mpi + 36] = (sum(data[mpi:mpi + 34]) & 0xFFFF).to_bytes(2, "big")
    return _armor(lines, bytes(data))


def corrupt_ssh_key(path: Path) -> None:
    """Overwrite the body of the OpenSSH private key at ``path`` (mode kept)."""
    lines = path.read_text().splitlines()
    lines[1:-1] = ["A" * 70 for _ in lines[1:-1]]
    path.write_text("\n".join(lines) + "\n")


def _ed25519_seed(secret_armored: str) -> bytes:
    """The secret of the unprotected ed25519 test key (the layout `wrong_secret` describes)."""
    _, data = _armor_parts(secret_armored)
    assert data[0] == 0x94 and data[1] == 88 and data[2 + 51] == 0, "not the test key's layout"
    return data[2 + 52 + 2:2 + 52 + 2 + 32]


def _public_packets(public_armored: str) -> tuple[list[str], bytes, bytes]:
    """(armor lines, the public-key packet's body, every packet after it)."""
    lines, data = _armor_parts(public_armored)
    assert data[0] == 0x98, "not an old-format public-key packet with one length byte"
    end = 2 + data[1]
    return lines, data[2:end], data[end:]


def _signer(secret_armored: str, fingerprint: str
            ) -> tuple[KeyInfo, Callable[[int, bytes], list[int]]]:
    """The test key as `formats.openpgp` describes a key, and a ``sign`` that needs no agent."""
    key = KeyInfo(fingerprint=fingerprint, keygrip="0" * 40, pubkey_algo=PK_EDDSA, bits=255,
                  curve="ed25519", uid="")
    private = Ed25519PrivateKey.from_private_bytes(_ed25519_seed(secret_armored))

    def sign(hash_algo: int, digest: bytes) -> list[int]:
        raw = private.sign(digest)
        return [int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")]

    return key, sign


def sign_as_test_key(secret_armored: str, fingerprint: str, data: bytes, created: int,
                       sig_type: int = 0x00) -> str:
    """An armored detached signature of ``data`` by the ed25519 test key, made at
    ``created``, built with `formats.openpgp` and signed without an agent."""
    key, sign = _signer(secret_armored, fingerprint)
    return detached_signature(data, key, created, sign, sig_type=sig_type)


def revoked_public_key(public_armored: str, secret_armored: str, fingerprint: str,
                       created: int) -> str:
    """The test key's public key with a key revocation signature by itself made at
    ``created`` (RFC 4880 5.2.4: over the public-key packet alone), after its key packet."""
    _, body, rest = _public_packets(public_armored)
    key, sign = _signer(secret_armored, fingerprint)
    prepared = prepare_signature(b"\x99" + len(body).to_bytes(2, "big") + body, key, created,
                                 _SIG_KEY_REVOCATION)
    revocation = signature_packet(prepared.hashed_part, prepared.digest, key,
                                  sign(prepared.hash_algo, prepared.digest))
    return _armor(["-----BEGIN PGP PUBLIC KEY BLOCK-----", "-----END PGP PUBLIC KEY BLOCK-----"],
                  encode_packet(6, body) + revocation + rest)
