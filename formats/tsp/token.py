"""The token: a CMS ``SignedData`` (RFC 5652) over a ``TSTInfo``, built up to its one
private-key operation and finished with the signature, and read back.

* :func:`signed_attributes` is what the key must sign: the DER ``SET OF`` signed attributes
  (contentType, messageDigest, signingCertificateV2 as RFC 5816 asks), to be hashed with
  `formats.tsp.algorithms.signature_hash` of the signature algorithm and signed (RFC 5652 §5.4);
* :func:`signed_data` wraps the signature into the token (a ``ContentInfo``); :func:`token`
  and :func:`prepare_token` (several prepared, one agent round trip signs them all) do both;
* :func:`parse_token` reads a token back (for verification tools).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from asn1crypto import algos, cms, core, tsp, x509

from formats.tsp.algorithms import SIGNATURE_ALGORITHMS, signature_hash
from formats.tsp.certificates import cached_certificate
from formats.tsp.der import (
    digest_algorithm_identifier,
    encoded,
    sequence,
    set_of,
    set_of_contents,
    time_choice,
)
from formats.tsp.errors import TspError
from formats.tsp.tstinfo import TokenFields, tst_info, tst_info_fields

__all__ = [
    "ParsedToken",
    "UnsignedToken",
    "parse_token",
    "prepare_token",
    "signed_attributes",
    "signed_data",
    "token",
]


@dataclass(frozen=True)
class ParsedToken:
    """A token read back by :func:`parse_token`: its TSTInfo and the certificates it embeds."""

    fields: TokenFields
    tst_info: bytes
    certificates: list[bytes]


def signed_attributes(
    tst_info_der: bytes,
    certificate_der: bytes,
    *,
    digest_algorithm: str = "sha256",
    signing_time: datetime | None = None,
) -> bytes:
    """The DER ``SET OF Attribute`` that the TSA key signs (RFC 5652 §5.4, RFC 5816).

    contentType id-ct-TSTInfo; messageDigest, the ``digest_algorithm`` hash of the TSTInfo;
    signingCertificateV2 with one ESSCertIDv2 (SHA-256 of the certificate, the default and so
    omitted hash algorithm, and its issuerSerial); signingTime if given. The bytes returned keep
    the SET tag: hash them with :func:`signature_hash` of the signature algorithm, sign that
    hash, and pass the same bytes to :func:`signed_data`.
    """
    if digest_algorithm not in SIGNATURE_ALGORITHMS.values():
        raise TspError(f"unsupported digest algorithm {digest_algorithm!r}")
    digest = hashlib.new(digest_algorithm, tst_info_der).digest()
    return set_of_contents(_signed_attributes(digest, certificate_der, signing_time))


def _signed_attributes(message_digest: bytes, certificate_der: bytes,
                       signing_time: datetime | None = None) -> bytes:
    """The contents of the signed attributes' ``SET OF``: the attributes' DER, sorted as DER
    (and asn1crypto) sort a SET OF; the same contents go into the SignerInfo as its
    ``signedAttrs [0] IMPLICIT``."""
    attributes = [
        _content_type_tst_info(),
        _attribute("message_digest", core.OctetString(message_digest).dump()),
        _signing_certificate_v2_attribute(certificate_der),
    ]
    if signing_time is not None:
        when = time_choice(cms.Time, "generalized_time", signing_time)
        attributes.append(_attribute("signing_time", when.dump()))
    return b"".join(sorted(attributes))


def _attribute(kind: str, value_der: bytes) -> bytes:
    """A ``CMSAttribute`` of type ``kind`` (asn1crypto's name) with the one value given."""
    return sequence(encoded(cms.CMSAttributeType, kind), set_of(value_der))


@functools.cache
def _content_type_tst_info() -> bytes:
    return bytes(cms.CMSAttribute({"type": "content_type", "values": ["tst_info"]}).dump())


@functools.lru_cache(maxsize=8)
def _signing_certificate_v2_attribute(certificate_der: bytes) -> bytes:
    """The signingCertificateV2 attribute naming ``certificate_der``: the same for every
    token of a certificate, and the costliest part to encode."""
    cert = cached_certificate(certificate_der)
    ess_cert_id = {
        "cert_hash": hashlib.sha256(certificate_der).digest(),
        "issuer_serial": {
            "issuer": [x509.GeneralName(name="directory_name", value=cert.issuer)],
            "serial_number": cert.serial_number,
        },
    }
    return bytes(cms.CMSAttribute(
        {"type": "signing_certificate_v2", "values": [{"certs": [ess_cert_id]}]}).dump())


@functools.lru_cache(maxsize=8)
def _sid(certificate_der: bytes) -> bytes:
    """The SignerIdentifier (issuerAndSerialNumber) of a certificate."""
    cert = cached_certificate(certificate_der)
    return bytes(cms.SignerIdentifier(
        name="issuer_and_serial_number",
        value={"issuer": cert.issuer, "serial_number": cert.serial_number}).dump())


@functools.lru_cache(maxsize=8)
def _certificate_set(chain: tuple[bytes, ...]) -> bytes:
    """The SignedData's ``certificates [0] IMPLICIT CertificateSet`` holding ``chain``."""
    certificates = cms.CertificateSet([cms.CertificateChoices(name="certificate",
                                                              value=cached_certificate(der))
                                       for der in chain])
    return bytes(certificates.retag({"implicit": 0}).dump())


@functools.lru_cache(maxsize=8)
def _digest_algorithms(name: str) -> bytes:
    return bytes(cms.DigestAlgorithms([{"algorithm": name}]).dump())


@functools.lru_cache(maxsize=8)
def _signature_algorithm(name: str) -> bytes:
    return bytes(algos.SignedDigestAlgorithm({"algorithm": name}).dump())


def signed_data(
    tst_info_der: bytes,
    signed_attrs_der: bytes,
    signature: bytes,
    signature_algorithm: str,
    chain: Sequence[bytes],
    *,
    include_certificates: bool,
) -> bytes:
    """The token: a DER ``ContentInfo`` holding the CMS ``SignedData`` (version 3).

    ``chain`` starts with the TSA certificate (it names the signer, by issuerAndSerialNumber)
    and may go on with its issuers; all are embedded when ``include_certificates`` (the request's
    certReq). ``signature`` is over ``signed_attrs_der`` from :func:`signed_attributes`, which
    must have been built for this ``tst_info_der`` with this algorithm's hash; ECDSA signatures
    are DER ``ECDSA-Sig-Value`` (`formats.tsp.algorithms.ecdsa_signature`).
    """
    digest_algorithm = signature_hash(signature_algorithm)
    if not chain:
        raise TspError("the chain must hold the TSA certificate")
    try:
        attributes = cms.CMSAttributes.load(signed_attrs_der, strict=True)
        digests = [
            attribute["values"][0].native
            for attribute in attributes
            if attribute["type"].native == "message_digest"
        ]
        tsp.TSTInfo.load(tst_info_der, strict=True)  # (made by `tst_info`)
    except ValueError as exc:
        raise TspError(f"cannot read the signed attributes or the TSTInfo: {exc}") from exc
    if digests != [hashlib.new(digest_algorithm, tst_info_der).digest()]:
        raise TspError(f"the messageDigest attribute is not the {digest_algorithm} of the TSTInfo")
    return _signed_data(tst_info_der, bytes(attributes.contents), signature, signature_algorithm,
                        tuple(chain), include_certificates=include_certificates)


def _signed_data(tst_info_der: bytes, attributes: bytes, signature: bytes,
                 signature_algorithm: str, chain: tuple[bytes, ...], *,
                 include_certificates: bool) -> bytes:
    """`signed_data` of parts already checked; ``attributes`` is the contents of the signed
    attributes' SET OF (`_signed_attributes`)."""
    digest_algorithm = SIGNATURE_ALGORITHMS[signature_algorithm]
    signer_info = sequence(
        encoded(cms.CMSVersion, "v1"),
        _sid(chain[0]),
        digest_algorithm_identifier(digest_algorithm),
        set_of_contents(attributes, implicit=0),  # signedAttrs: as signed, retagged
        _signature_algorithm(signature_algorithm),
        core.OctetString(signature).dump(),
    )
    encap_content_info = sequence(encoded(cms.ContentType, "tst_info"),
                                  core.OctetString(tst_info_der, explicit=0).dump())
    parts = [encoded(cms.CMSVersion, "v3"), _digest_algorithms(digest_algorithm),
             encap_content_info]
    if include_certificates:
        parts.append(_certificate_set(chain))
    parts.append(set_of(signer_info))  # SignerInfos
    return sequence(encoded(cms.ContentType, "signed_data"),  # ContentInfo
                    sequence(*parts, explicit=0))


@dataclass(frozen=True)
class UnsignedToken:
    """A token made up to its signature (`prepare_token`): the signer signs ``signed_bytes``
    (hashing them with `signature_hash` of the algorithm) and `finish` wraps the signature
    in. Several are prepared first so that one agent round trip signs them all."""

    content: bytes  # the DER TSTInfo
    attributes: bytes  # the contents of the signed attributes' SET OF
    signature_algorithm: str
    chain: tuple[bytes, ...]
    include_certificates: bool

    @property
    def signed_bytes(self) -> bytes:
        """The DER ``SET OF`` signed attributes: what the signature is over (RFC 5652 §5.4)."""
        return set_of_contents(self.attributes)

    def finish(self, signature: bytes) -> bytes:
        """The token (a DER ``ContentInfo``) with ``signature`` over `signed_bytes`."""
        return _signed_data(self.content, self.attributes, signature, self.signature_algorithm,
                            self.chain, include_certificates=self.include_certificates)


def prepare_token(fields: TokenFields, signature_algorithm: str, chain: Sequence[bytes], *,
                  include_certificates: bool) -> UnsignedToken:
    """The token of ``fields`` up to its signature: `tst_info`, and `signed_attributes` for
    ``chain[0]`` over it."""
    digest_algorithm = signature_hash(signature_algorithm)
    if not chain:
        raise TspError("the chain must hold the TSA certificate")
    content = tst_info(fields)
    attributes = _signed_attributes(hashlib.new(digest_algorithm, content).digest(), chain[0])
    return UnsignedToken(content, attributes, signature_algorithm, tuple(chain),
                         include_certificates)


def token(fields: TokenFields, signature_algorithm: str, chain: Sequence[bytes],
          sign: Callable[[bytes], bytes], *, include_certificates: bool) -> bytes:
    """The token of ``fields`` in one go: `prepare_token`, ``sign`` (the signer's signature
    over the signed attributes, as `signed_data` takes it), then `UnsignedToken.finish`; the
    same bytes as `signed_data`, without parsing back what it built itself."""
    unsigned = prepare_token(fields, signature_algorithm, chain,
                             include_certificates=include_certificates)
    return unsigned.finish(sign(unsigned.signed_bytes))


def parse_token(der: bytes) -> ParsedToken:
    """Read a token (a ``ContentInfo`` with SignedData over a TSTInfo); does not verify it.

    Raises :class:`TspError` when the bytes are not such a token.
    """
    try:
        info = cms.ContentInfo.load(der, strict=True)
        if info["content_type"].native != "signed_data":
            raise TspError("the token is not a SignedData")
        content = info["content"]
        encap = content["encap_content_info"]
        if encap["content_type"].native != "tst_info":
            raise TspError("the token does not hold a TSTInfo")
        tst = encap["content"].parsed
        raw = bytes(encap["content"].contents)
        fields = tst_info_fields(tst)
        certificates = [
            bytes(choice.chosen.dump())
            for choice in content["certificates"] or ()
            if choice.name == "certificate"
        ]
    except TspError:
        raise
    except Exception as exc:  # untrusted input: any parser error is malformed
        raise TspError(f"not a time-stamp token: {exc}") from exc
    return ParsedToken(fields=fields, tst_info=raw, certificates=certificates)
