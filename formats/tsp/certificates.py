"""TSA certificates, made from a key an agent holds: :func:`ec_public_key_info` or
:func:`rsa_public_key_info`, then :func:`tbs_certificate` (what the issuer's key signs) and
:func:`certificate`; or :func:`certification_request_info` and :func:`certification_request`
for a PKCS#10 request to an outside CA. :func:`pem` armors any of them; :func:`load_certificate`
reads one, :func:`parse_chain` a PEM chain of them."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime

from asn1crypto import csr, keys, x509
from asn1crypto import pem as asn1_pem

from formats.tsp.algorithms import MAX_NONCE_BITS, signature_hash
from formats.tsp.der import time_choice
from formats.tsp.errors import TspError

__all__ = [
    "cached_certificate",
    "certificate",
    "certification_request",
    "certification_request_info",
    "ec_public_key_info",
    "key_identifier",
    "load_certificate",
    "parse_chain",
    "pem",
    "rsa_public_key_info",
    "subject_of",
    "tbs_certificate",
]

_CURVE_POINT_LENGTHS = {"secp256r1": 65, "secp384r1": 97}


def ec_public_key_info(curve: str, point: bytes) -> bytes:
    """The DER ``SubjectPublicKeyInfo`` of an EC key: ``secp256r1``/``secp384r1``, uncompressed."""
    if _CURVE_POINT_LENGTHS.get(curve) != len(point) or point[:1] != b"\x04":
        raise TspError(f"not an uncompressed {curve} point")
    info = keys.PublicKeyInfo(
        {
            "algorithm": {
                "algorithm": "ec",
                "parameters": keys.ECDomainParameters(name="named", value=curve),
            },
            "public_key": point,
        }
    )
    return bytes(info.dump())


def rsa_public_key_info(n: int, e: int) -> bytes:
    """The DER ``SubjectPublicKeyInfo`` of an RSA key (rsaEncryption, NULL parameters)."""
    if n <= 0 or e <= 0:
        raise TspError("RSA modulus and exponent must be positive")
    info = keys.PublicKeyInfo(
        {
            "algorithm": {"algorithm": "rsa"},
            "public_key": keys.RSAPublicKey({"modulus": n, "public_exponent": e}),
        }
    )
    return bytes(info.dump())


def key_identifier(public_key_info: bytes) -> bytes:
    """The key identifier of RFC 5280 §4.2.1.2 method 1: SHA-1 of the subjectPublicKey bits."""
    return bytes(keys.PublicKeyInfo.load(public_key_info).sha1)


def tbs_certificate(
    public_key_info: bytes,
    subject: Mapping[str, str],
    *,
    serial: int,
    not_before: datetime,
    not_after: datetime,
    signature_algorithm: str,
    issuer: Mapping[str, str] | None = None,
    issuer_public_key_info: bytes | None = None,
    is_ca: bool = False,
    time_stamping: bool = True,
) -> bytes:
    """The DER ``TBSCertificate`` (v3) that the issuer's key signs for :func:`certificate`.

    ``subject`` and ``issuer`` are asn1crypto name dicts (``{"common_name": ...,
    "organization_name": ...}``); without ``issuer`` (and ``issuer_public_key_info``) the
    certificate is self-signed. Extensions (:func:`_extensions`): subjectKeyIdentifier,
    authorityKeyIdentifier, basicConstraints, keyUsage and, for a TSA, extendedKeyUsage
    id-kp-timeStamping (critical, RFC 3161 §2.3). A CA (``is_ca``) gets basicConstraints cA
    (critical) and keyUsage keyCertSign + cRLSign.
    """
    signature_hash(signature_algorithm)
    if serial <= 0 or serial.bit_length() > MAX_NONCE_BITS:
        raise TspError("a certificate serial is a positive integer of at most 160 bits")
    if not_before >= not_after:
        raise TspError("not_before must come before not_after")
    subject_name = x509.Name.build(dict(subject))
    issuer_name = subject_name if issuer is None else x509.Name.build(dict(issuer))
    authority_key = key_identifier(issuer_public_key_info or public_key_info)
    extensions = _extensions(
        public_key_info, is_ca=is_ca, time_stamping=time_stamping, authority_key=authority_key
    )
    tbs = x509.TbsCertificate(
        {
            "version": "v3",
            "serial_number": serial,
            "signature": {"algorithm": signature_algorithm},
            "issuer": issuer_name,
            "validity": {
                "not_before": time_choice(x509.Time, "general_time", not_before),
                "not_after": time_choice(x509.Time, "general_time", not_after),
            },
            "subject": subject_name,
            "subject_public_key_info": keys.PublicKeyInfo.load(public_key_info),
            "extensions": extensions,
        }
    )
    return bytes(tbs.dump())


def certificate(tbs_der: bytes, signature_algorithm: str, signature: bytes) -> bytes:
    """The DER ``Certificate``: ``tbs_der`` and the issuer's ``signature`` over it."""
    tbs = x509.TbsCertificate.load(tbs_der, strict=True)
    if tbs["signature"]["algorithm"].native != signature_algorithm:
        raise TspError("the signature algorithm differs from the one in the TBSCertificate")
    cert = x509.Certificate(
        {
            "tbs_certificate": tbs,
            "signature_algorithm": {"algorithm": signature_algorithm},
            "signature_value": signature,
        }
    )
    return bytes(cert.dump())


def certification_request_info(
    public_key_info: bytes, subject: Mapping[str, str], *, time_stamping: bool = True
) -> bytes:
    """The DER ``CertificationRequestInfo`` (PKCS#10) that the key signs.

    It asks (extensionRequest) for the TSA extensions of :func:`tbs_certificate`: keyUsage,
    extendedKeyUsage id-kp-timeStamping and basicConstraints cA false; the CA adds its own key
    identifiers.
    """
    extensions = _extensions(public_key_info, is_ca=False, time_stamping=time_stamping)
    info = csr.CertificationRequestInfo(
        {
            "version": "v1",
            "subject": x509.Name.build(dict(subject)),
            "subject_pk_info": keys.PublicKeyInfo.load(public_key_info),
            "attributes": [{"type": "extension_request", "values": [extensions]}],
        }
    )
    return bytes(info.dump())


def certification_request(info_der: bytes, signature_algorithm: str, signature: bytes) -> bytes:
    """The DER ``CertificationRequest``: ``info_der`` and the key's ``signature`` over it."""
    signature_hash(signature_algorithm)
    request = csr.CertificationRequest(
        {
            "certification_request_info": csr.CertificationRequestInfo.load(info_der, strict=True),
            "signature_algorithm": {"algorithm": signature_algorithm},
            "signature": signature,
        }
    )
    return bytes(request.dump())


def pem(der: bytes, label: str) -> str:
    """``der`` armored as PEM under ``label`` (``CERTIFICATE``, ``CERTIFICATE REQUEST``...)."""
    return str(asn1_pem.armor(label, der).decode("ascii"))


def _extensions(
    public_key_info: bytes,
    *,
    is_ca: bool,
    time_stamping: bool,
    authority_key: bytes | None = None,
) -> list[dict[str, object]]:
    extensions: list[dict[str, object]] = [
        {
            "extn_id": "basic_constraints",
            "critical": is_ca,
            "extn_value": {"ca": is_ca},
        },
        {
            "extn_id": "key_usage",
            "critical": True,
            "extn_value": (
                {"key_cert_sign", "crl_sign"} if is_ca else {"digital_signature", "non_repudiation"}
            ),
        },
    ]
    if time_stamping and not is_ca:
        extensions.append(
            {"extn_id": "extended_key_usage", "critical": True, "extn_value": ["time_stamping"]}
        )
    if authority_key is not None:
        extensions.append(
            {
                "extn_id": "key_identifier",
                "critical": False,
                "extn_value": key_identifier(public_key_info),
            }
        )
        extensions.append(
            {
                "extn_id": "authority_key_identifier",
                "critical": False,
                "extn_value": {"key_identifier": authority_key},
            }
        )
    return extensions


def load_certificate(der: bytes) -> x509.Certificate:
    """A DER certificate, parsed whole (`TspError` if it is not one)."""
    try:
        cert = x509.Certificate.load(der, strict=True)
        _ = cert.native
    except ValueError as exc:
        raise TspError(f"not a DER certificate: {exc}") from exc
    return cert


def parse_chain(data: bytes) -> list[bytes]:
    """The certificates (DER) of a PEM chain; `TspError` if it holds anything else or a
    certificate that cannot be read."""
    if not asn1_pem.detect(data):
        raise TspError("not PEM certificates")
    chain: list[bytes] = []
    try:
        for label, _headers, der in asn1_pem.unarmor(data, multiple=True):
            if label != "CERTIFICATE":
                raise TspError(f"it holds a {label}, not only certificates")
            cert = x509.Certificate.load(der, strict=True)
            _ = cert.native  # asn1crypto parses lazily
            chain.append(bytes(der))
    except TspError:
        raise
    except ValueError as exc:
        raise TspError(f"a certificate cannot be read: {exc}") from None
    if not chain:
        raise TspError("it holds no certificate")
    return chain


def subject_of(certificate_der: bytes) -> x509.Name:
    """The subject of a certificate (the TSA's name in its tokens)."""
    return cached_certificate(certificate_der).subject


@functools.lru_cache(maxsize=8)
def cached_certificate(der: bytes) -> x509.Certificate:
    """`load_certificate`, once per certificate (a TSA signs every token with the same one)."""
    return load_certificate(der)
