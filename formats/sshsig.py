"""Pure construction of SSH signatures (SSHSIG), as ``ssh-keygen -Y sign`` makes them.

Git signs with SSH keys (``gpg.format=ssh``) by running ``ssh-keygen -Y sign -n git``; the
result is an SSHSIG blob (OpenSSH ``PROTOCOL.sshsig``) armored as ``-----BEGIN SSH
SIGNATURE-----``. Everything around the one private-key operation is public data, so this
module builds it without any I/O:

* :func:`sshsig_signed_data` is what the key must sign: ``"SSHSIG"``, the namespace, an empty
  reserved string, the hash algorithm name and the hash of the message;
* the signer (an ssh-agent, see :mod:`workers.agents.ssh`) returns an SSH signature blob
  (``string algorithm, string signature``), checked by :func:`check_signature_blob`;
* :func:`sshsig_blob` wraps it with the public key and :func:`armor` armors it byte for byte
  as ssh-keygen does (base64 in lines of 70 characters, a final newline).

Key types: ``ssh-ed25519``, ``ecdsa-sha2-nistp256/384/521`` and ``ssh-rsa``; RSA keys must sign
with ``rsa-sha2-512`` (ask the agent with :data:`SSH_AGENT_RSA_SHA2_512`), which is what
ssh-keygen uses and the only RSA algorithm we accept back. Certificates and FIDO (``sk-``) keys
are not supported. Encoding follows RFC 4251: ``uint32`` big-endian, ``string`` = ``uint32``
length + bytes, ``mpint`` = two's complement big-endian in a string.

Ed25519 signatures are deterministic, so for such a key the armored text built here is
byte-identical to ssh-keygen's for the same message, namespace and hash algorithm.

An SSH signature carries no time of its own (docs/protocol.md): for git objects the
tagger/committer time is the stamp.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_HASH",
    "HASH_ALGORITHMS",
    "KEY_TYPES",
    "SSH_AGENT_RSA_SHA2_256",
    "SSH_AGENT_RSA_SHA2_512",
    "SshPublicKey",
    "SshReader",
    "SshSigError",
    "SshSignature",
    "allowed_signers_line",
    "armor",
    "check_signature_blob",
    "dearmor",
    "ecdsa_point",
    "ecdsa_signature_values",
    "ssh_signature",
    "ssh_string",
    "ssh_uint32",
    "sshsig_armor",
    "sshsig_blob",
    "sshsig_signed_data",
]

MAGIC = b"SSHSIG"
SIG_VERSION = 1
BEGIN = "-----BEGIN SSH SIGNATURE-----"
END = "-----END SSH SIGNATURE-----"
ARMOR_LINE = 70  # ssh-keygen's base64 line length (sshbuf_dtob64 with wrapping)

HASH_ALGORITHMS: tuple[str, ...] = ("sha256", "sha512")
"""The hash algorithms SSHSIG allows for ``H(message)``."""

DEFAULT_HASH = "sha512"
"""ssh-keygen's default (and git's, which never asks for another)."""

SSH_AGENT_RSA_SHA2_256 = 0x02
SSH_AGENT_RSA_SHA2_512 = 0x04
"""Sign-request flags asking an agent for ``rsa-sha2-256`` / ``rsa-sha2-512`` RSA signatures."""

_ECDSA_CURVES = {  # key type -> (curve name in the blob, field size in bytes)
    "ecdsa-sha2-nistp256": ("nistp256", 32),
    "ecdsa-sha2-nistp384": ("nistp384", 48),
    "ecdsa-sha2-nistp521": ("nistp521", 66),
}
_RSA_SIGNATURE_ALGORITHM = "rsa-sha2-512"
_RSA_MIN_BITS = 1024  # OpenSSH refuses smaller moduli
_ED25519_KEY_SIZE = 32
_ED25519_SIGNATURE_SIZE = 64

KEY_TYPES: tuple[str, ...] = ("ssh-ed25519", *_ECDSA_CURVES, "ssh-rsa")
"""The public key types this module handles."""

_PRINCIPAL_FORBIDDEN = re.compile(r'[\s",*?!\\#]')  # whitespace, quotes, pattern syntax, lists
_NAMESPACE_FORBIDDEN = re.compile(r'[\s",*?!\\]')


class SshSigError(ValueError):
    """Malformed or unsupported SSH key, signature blob or armored signature."""


# --------------------------------------------------------------------------------------------
# RFC 4251 encoding


def ssh_uint32(value: int) -> bytes:
    """``uint32``: four bytes, big-endian."""
    return struct.pack(">I", value)


def ssh_string(data: bytes | str) -> bytes:
    """``string``: a ``uint32`` length and the bytes (text is encoded as UTF-8)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


class SshReader:
    """Reads RFC 4251 data types from a byte string; every shortfall raises :class:`SshSigError`."""

    def __init__(self, data: bytes, what: str = "data") -> None:
        self._data = data
        self._pos = 0
        self._what = what

    @property
    def remaining(self) -> int:
        """Bytes not read yet."""
        return len(self._data) - self._pos

    def byte(self) -> int:
        if self.remaining < 1:
            raise SshSigError(f"{self._what}: truncated")
        value = self._data[self._pos]
        self._pos += 1
        return value

    def raw(self, size: int) -> bytes:
        if self.remaining < size:
            raise SshSigError(f"{self._what}: truncated")
        value = self._data[self._pos : self._pos + size]
        self._pos += size
        return value

    def uint32(self) -> int:
        value: int = struct.unpack(">I", self.raw(4))[0]
        return value

    def string(self) -> bytes:
        return self.raw(self.uint32())

    def text(self) -> str:
        """A ``string`` holding UTF-8 text without NUL (names, namespaces, comments)."""
        raw = self.string()
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SshSigError(f"{self._what}: text is not UTF-8: {raw[:40]!r}") from None
        if "\0" in value:
            raise SshSigError(f"{self._what}: text contains NUL")
        return value

    def mpint(self) -> int:
        """A non-negative ``mpint``."""
        raw = self.string()
        value = int.from_bytes(raw, "big", signed=True)
        if value < 0:
            raise SshSigError(f"{self._what}: negative integer")
        return value

    def end(self) -> None:
        """Insist that everything was read."""
        if self.remaining:
            raise SshSigError(f"{self._what}: {self.remaining} bytes of trailing data")


def _check_hash_alg(hash_alg: str) -> None:
    if hash_alg not in HASH_ALGORITHMS:
        raise SshSigError(f"unsupported SSHSIG hash algorithm {hash_alg!r} (sha256 or sha512)")


def _check_namespace(namespace: str) -> None:
    if not namespace or "\0" in namespace:
        raise SshSigError(f"an SSHSIG namespace must be non-empty text: {namespace!r}")


# --------------------------------------------------------------------------------------------
# Public keys


@dataclass(frozen=True)
class SshPublicKey:
    """An OpenSSH public key: its type, its wire-format blob, its comment, its size in bits."""

    key_type: str
    blob: bytes
    bits: int
    comment: str = ""

    @classmethod
    def from_blob(cls, blob: bytes, comment: str = "") -> SshPublicKey:
        """Parse and check a public key blob (``string type, ...``)."""
        reader = SshReader(blob, "public key")
        key_type = reader.text()
        if key_type == "ssh-ed25519":
            if len(reader.string()) != _ED25519_KEY_SIZE:
                raise SshSigError("ssh-ed25519 public key is not 32 bytes")
            bits = 256
        elif key_type in _ECDSA_CURVES:
            curve, size = _ECDSA_CURVES[key_type]
            if reader.text() != curve:
                raise SshSigError(f"{key_type} public key names another curve")
            point = reader.string()
            if len(point) != 1 + 2 * size or point[0] != 4:
                raise SshSigError(f"{key_type} public key is not an uncompressed point")
            bits = 521 if size == 66 else 8 * size
        elif key_type == "ssh-rsa":
            exponent = reader.mpint()
            modulus = reader.mpint()
            bits = modulus.bit_length()
            if exponent < 3 or exponent % 2 == 0:
                raise SshSigError("ssh-rsa public exponent is invalid")
            if bits < _RSA_MIN_BITS:
                raise SshSigError(f"ssh-rsa key of {bits} bits is too small for OpenSSH")
        else:
            raise SshSigError(f"unsupported SSH key type {key_type!r}")
        reader.end()
        return cls(key_type=key_type, blob=bytes(blob), bits=bits, comment=comment)

    @classmethod
    def from_line(cls, line: str) -> SshPublicKey:
        """Parse an OpenSSH public key line: ``<type> <base64> [comment]`` (as in ``*.pub``)."""
        fields = line.strip().split(None, 2)
        if len(fields) < 2:
            raise SshSigError(f"not an OpenSSH public key line: {line[:60]!r}")
        key_type, b64 = fields[0], fields[1]
        try:
            blob = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise SshSigError(f"public key is not valid base64: {b64[:40]!r}") from None
        key = cls.from_blob(blob, comment=fields[2] if len(fields) > 2 else "")
        if key.key_type != key_type:
            raise SshSigError(f"public key line says {key_type!r}, its blob {key.key_type!r}")
        return key

    def to_line(self, *, comment: bool = True) -> str:
        """The OpenSSH public key line (no newline); the comment only if asked and present."""
        line = f"{self.key_type} {base64.b64encode(self.blob).decode('ascii')}"
        return f"{line} {self.comment}" if comment and self.comment else line

    @property
    def fingerprint(self) -> str:
        """``SHA256:<base64>``, as ``ssh-keygen -l`` prints it."""
        digest = base64.b64encode(hashlib.sha256(self.blob).digest()).decode("ascii")
        return "SHA256:" + digest.rstrip("=")

    @property
    def signature_algorithm(self) -> str:
        """The signature algorithm we require from this key (``rsa-sha2-512`` for RSA)."""
        return _RSA_SIGNATURE_ALGORITHM if self.key_type == "ssh-rsa" else self.key_type

    @property
    def agent_flags(self) -> int:
        """Flags for an agent sign request that yield :attr:`signature_algorithm`."""
        return SSH_AGENT_RSA_SHA2_512 if self.key_type == "ssh-rsa" else 0


def _rsa_modulus_size(key: SshPublicKey) -> int:
    reader = SshReader(key.blob, "public key")
    reader.text()
    reader.mpint()
    return (reader.mpint().bit_length() + 7) // 8


def check_signature_blob(key: SshPublicKey, signature: bytes) -> None:
    """Check that ``signature`` (``string algorithm, string sig``) is well-formed for ``key``.

    Checks structure and algorithm, not the mathematics: verification is ssh-keygen's (and
    git's) job. An RSA signature must be ``rsa-sha2-512``; ``ssh-rsa`` (SHA-1) means the agent
    was asked without :data:`SSH_AGENT_RSA_SHA2_512` and ssh-keygen would reject it.
    """
    reader = SshReader(signature, "signature")
    algorithm = reader.text()
    value = reader.string()
    reader.end()
    expected = key.signature_algorithm
    if algorithm != expected:
        hint = " (sign with the SSH_AGENT_RSA_SHA2_512 flag)" if algorithm == "ssh-rsa" else ""
        raise SshSigError(f"signature algorithm is {algorithm!r}, expected {expected!r}{hint}")
    if key.key_type == "ssh-ed25519":
        if len(value) != _ED25519_SIGNATURE_SIZE:
            raise SshSigError(f"ssh-ed25519 signature of {len(value)} bytes, expected 64")
    elif key.key_type in _ECDSA_CURVES:
        _ecdsa_values(value)
    else:
        size = _rsa_modulus_size(key)
        if not value or len(value) > size:
            raise SshSigError(f"RSA signature of {len(value)} bytes for a {size}-byte modulus")


def _ecdsa_values(value: bytes) -> tuple[int, int]:
    inner = SshReader(value, "ECDSA signature")
    r, s = inner.mpint(), inner.mpint()
    inner.end()
    if r == 0 or s == 0:
        raise SshSigError("ECDSA signature value is zero")
    return r, s


def ecdsa_signature_values(key: SshPublicKey, signature: bytes) -> tuple[int, int]:
    """The ``(r, s)`` of an ECDSA signature blob of ``key`` (``string "ecdsa-sha2-<curve>",
    string(mpint r, mpint s)``, RFC 5656 section 3.1.2), checked as `check_signature_blob`
    checks it; the agent hashed the data with the curve's hash (SHA-256 for nistp256, SHA-384
    for nistp384)."""
    if key.key_type not in _ECDSA_CURVES:
        raise SshSigError(f"{key.key_type} is not an ECDSA key")
    check_signature_blob(key, signature)
    reader = SshReader(signature, "signature")
    reader.text()
    return _ecdsa_values(reader.string())


def ecdsa_point(key: SshPublicKey) -> bytes:
    """The public point of an ECDSA key (uncompressed, ``04 || x || y``)."""
    if key.key_type not in _ECDSA_CURVES:
        raise SshSigError(f"{key.key_type} is not an ECDSA key")
    reader = SshReader(key.blob, "public key")
    reader.text()
    reader.text()
    return reader.string()


# --------------------------------------------------------------------------------------------
# SSHSIG


def sshsig_signed_data(message: bytes | Iterable[bytes], namespace: str,
                       hash_alg: str = DEFAULT_HASH) -> bytes:
    """What the private key signs for ``message``: MAGIC, namespace, reserved, hash alg, H(m).
    ``message`` may come in pieces (an iterable of bytes), hashed one at a time."""
    _check_hash_alg(hash_alg)
    _check_namespace(namespace)
    h = hashlib.new(hash_alg)
    for piece in (message,) if isinstance(message, bytes) else message:
        h.update(piece)
    digest = h.digest()
    return (
        MAGIC
        + ssh_string(namespace)
        + ssh_string(b"")  # reserved
        + ssh_string(hash_alg)
        + ssh_string(digest)
    )


def sshsig_blob(
    pubkey_blob: bytes, namespace: str, signature: bytes, hash_alg: str = DEFAULT_HASH
) -> bytes:
    """The binary SSHSIG: MAGIC, version 1, public key, namespace, reserved, hash alg, sig."""
    _check_hash_alg(hash_alg)
    _check_namespace(namespace)
    return (
        MAGIC
        + ssh_uint32(SIG_VERSION)
        + ssh_string(pubkey_blob)
        + ssh_string(namespace)
        + ssh_string(b"")  # reserved
        + ssh_string(hash_alg)
        + ssh_string(signature)
    )


def armor(blob: bytes) -> str:
    """Armor an SSHSIG blob exactly as ssh-keygen does (70-column base64, final newline)."""
    b64 = base64.b64encode(blob).decode("ascii")
    lines = [b64[pos : pos + ARMOR_LINE] for pos in range(0, len(b64), ARMOR_LINE)]
    return "\n".join([BEGIN, *lines, END]) + "\n"


def dearmor(text: str) -> bytes:
    """The SSHSIG blob inside an armored signature (surrounding text is not allowed)."""
    lines = text.strip().splitlines()
    if len(lines) < 3 or lines[0].strip() != BEGIN or lines[-1].strip() != END:
        raise SshSigError("not an armored SSH signature")
    try:
        return base64.b64decode("".join(line.strip() for line in lines[1:-1]), validate=True)
    except (binascii.Error, ValueError):
        raise SshSigError("armored SSH signature is not valid base64") from None


def sshsig_armor(
    pubkey_blob: bytes, namespace: str, signature: bytes, hash_alg: str = DEFAULT_HASH
) -> str:
    """The armored SSHSIG (``-----BEGIN SSH SIGNATURE-----`` ... ``\\n``)."""
    return armor(sshsig_blob(pubkey_blob, namespace, signature, hash_alg))


@dataclass(frozen=True)
class SshSignature:
    """A parsed SSHSIG: who signed (public key), for which namespace, with which hash."""

    public_key: SshPublicKey
    namespace: str
    hash_alg: str
    signature: bytes

    @classmethod
    def from_blob(cls, blob: bytes) -> SshSignature:
        reader = SshReader(blob, "SSHSIG")
        if reader.raw(len(MAGIC)) != MAGIC:
            raise SshSigError("SSHSIG: bad magic")
        version = reader.uint32()
        if version != SIG_VERSION:
            raise SshSigError(f"SSHSIG: unsupported version {version}")
        key = SshPublicKey.from_blob(reader.string())
        namespace = reader.text()
        reader.string()  # reserved
        hash_alg = reader.text()
        signature = reader.string()
        reader.end()
        _check_hash_alg(hash_alg)
        _check_namespace(namespace)
        check_signature_blob(key, signature)
        return cls(public_key=key, namespace=namespace, hash_alg=hash_alg, signature=signature)

    @classmethod
    def from_armored(cls, text: str) -> SshSignature:
        return cls.from_blob(dearmor(text))

    def signed_data(self, message: bytes) -> bytes:
        """What the key must have signed if this is a signature over ``message``."""
        return sshsig_signed_data(message, self.namespace, self.hash_alg)


def ssh_signature(
    message: bytes,
    pubkey_blob: bytes,
    namespace: str,
    sign: Callable[[bytes], bytes],
    hash_alg: str = DEFAULT_HASH,
) -> str:
    """Sign ``message`` as ``ssh-keygen -Y sign -n <namespace>`` would; return the armor.

    ``sign(data)`` must return the SSH signature blob of ``data`` made by the key of
    ``pubkey_blob`` (for RSA with ``rsa-sha2-512``), e.g. an agent's sign response.
    """
    key = SshPublicKey.from_blob(pubkey_blob)
    signature = sign(sshsig_signed_data(message, namespace, hash_alg))
    check_signature_blob(key, signature)
    return sshsig_armor(key.blob, namespace, signature, hash_alg)


# --------------------------------------------------------------------------------------------
# allowed_signers


def allowed_signers_line(principal: str, pubkey_line: str, namespaces: str | None = "git") -> str:
    """One line of an ssh-keygen allowed-signers file (``gpg.ssh.allowedSignersFile``).

    ``<principal> namespaces="<namespaces>" <keytype> <base64>`` (ssh-keygen(1), ALLOWED
    SIGNERS), without the key's comment and without a newline. ``namespaces`` is a
    comma-separated list, ``None`` for a key accepted in every namespace. The principal is a
    single literal identity (``stampd@example.org``): no whitespace, quotes, commas or pattern
    characters, so the line never accepts more than that one name.
    """
    if not principal or _PRINCIPAL_FORBIDDEN.search(principal) or not principal.isprintable():
        raise SshSigError(f"principal must be one plain identity: {principal!r}")
    key = SshPublicKey.from_line(pubkey_line)
    fields = [principal]
    if namespaces is not None:
        names = namespaces.split(",")
        if any(not name or _NAMESPACE_FORBIDDEN.search(name) for name in names) or not (
            namespaces.isprintable()
        ):
            raise SshSigError(f"namespaces must be a comma-separated list: {namespaces!r}")
        fields.append(f'namespaces="{namespaces}"')
    fields.append(key.to_line(comment=False))
    return " ".join(fields)
