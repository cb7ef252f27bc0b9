"""The algorithms of RFC 3161 requests, tokens and TSA certificates.

Signature algorithms are named as asn1crypto names them: ``sha256_ecdsa`` (P-256 keys),
``sha384_ecdsa`` (P-384 keys) and ``sha256_rsa`` (RSASSA-PKCS1-v1_5). The signer hashes the
data with the hash :func:`signature_hash` names, and the SignerInfo's digestAlgorithm (and so
the messageDigest attribute) uses that same hash; :func:`ecdsa_signature` turns an ECDSA
``(r, s)`` into the DER ``ECDSA-Sig-Value`` that CMS and X.509 carry.
"""

from __future__ import annotations

from collections.abc import Mapping

from asn1crypto import core

from formats.tsp.der import sequence
from formats.tsp.errors import TspError

__all__ = [
    "HASH_ALGORITHMS",
    "HASH_BY_OID",
    "MAX_NONCE_BITS",
    "SIGNATURE_ALGORITHMS",
    "ecdsa_signature",
    "signature_hash",
]

#: Message-imprint hash algorithms: name → (dotted OID, digest length).
HASH_ALGORITHMS: Mapping[str, tuple[str, int]] = {
    "sha1": ("1.3.14.3.2.26", 20),
    "sha256": ("2.16.840.1.101.3.4.2.1", 32),
    "sha384": ("2.16.840.1.101.3.4.2.2", 48),
    "sha512": ("2.16.840.1.101.3.4.2.3", 64),
}
HASH_BY_OID = {oid: name for name, (oid, _) in HASH_ALGORITHMS.items()}

#: Signature algorithms we produce: name → the hash the signer applies to what it signs.
SIGNATURE_ALGORITHMS: Mapping[str, str] = {
    "sha256_ecdsa": "sha256",
    "sha384_ecdsa": "sha384",
    "sha256_rsa": "sha256",
}

#: RFC 3161 asks for a large random nonce; 160 bits is as large as we take.
MAX_NONCE_BITS = 160


def signature_hash(signature_algorithm: str) -> str:
    """The hashlib name of the hash the signer applies for ``signature_algorithm``."""
    try:
        return SIGNATURE_ALGORITHMS[signature_algorithm]
    except KeyError:
        raise TspError(f"unsupported signature algorithm {signature_algorithm!r}") from None


def ecdsa_signature(r: int, s: int) -> bytes:
    """The DER ``ECDSA-Sig-Value`` (``SEQUENCE { r, s }``) for an ECDSA signature."""
    if r <= 0 or s <= 0:
        raise TspError("ECDSA r and s must be positive")
    return sequence(core.Integer(r).dump(), core.Integer(s).dump())  # as algos.DSASignature
