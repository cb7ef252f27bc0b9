"""Key files broken in the ways a server must notice before it signs (helpers, no fixtures).

- `corrupt_armor`: one base64 character of an armored key changed; gpg refuses the file (its
  CRC-24 no longer matches).
- `wrong_secret`: the fixed test key with another secret scalar, checksums fixed up: gpg imports
  it, its fingerprint is the test key's, gpg-agent signs with it, and only the signature shows
  that the secret key does not belong to the public key.
- `corrupt_ssh_key`: an OpenSSH private key file that ssh-keygen cannot load.
"""

from __future__ import annotations

import base64
from pathlib import Path

from formats.openpgp import crc24


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
