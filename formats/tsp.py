"""Pure construction of RFC 3161 time-stamp requests, tokens, responses and TSA certificates.

An RFC 3161 time-stamping authority (TSA) answers a ``TimeStampReq`` (a hash of the client's
data) with a ``TimeStampResp`` holding a token: a CMS ``SignedData`` (RFC 5652) whose content is
a ``TSTInfo`` (the hash, the time, a serial and the policy). Everything around the one
private-key operation is public data, so this module builds and parses it without any I/O, in
the order a TSA needs it:

* :func:`parse_request` checks a request and returns a :class:`TimeStampRequest`, or raises
  :class:`Rejection`, which :func:`rejection` turns into the ``TimeStampResp`` to send back;
* :func:`tst_info` encodes a :class:`TokenFields` as ``TSTInfo``;
* :func:`signed_attributes` is what the key must sign: the DER ``SET OF`` signed attributes
  (contentType, messageDigest, signingCertificateV2 as RFC 5816 asks), to be hashed with
  :func:`signature_hash` of the signature algorithm and signed (RFC 5652 §5.4);
* :func:`signed_data` wraps the signature into the token (a ``ContentInfo``), and
  :func:`granted` into the response; :func:`ecdsa_signature` turns an ECDSA ``(r, s)`` into the
  DER ``ECDSA-Sig-Value`` that CMS carries;
* :func:`parse_token` reads a token back (for verification tools).

The TSA certificate is made the same way, from a key an agent holds: :func:`ec_public_key_info`
or :func:`rsa_public_key_info`, then :func:`tbs_certificate` (what the issuer's key signs) and
:func:`certificate`; or :func:`certification_request_info` and :func:`certification_request`
for a PKCS#10 request to an outside CA. :func:`pem` armors any of them.

Signature algorithms are named as asn1crypto names them: ``sha256_ecdsa`` (P-256 keys),
``sha384_ecdsa`` (P-384 keys) and ``sha256_rsa`` (RSASSA-PKCS1-v1_5). The signer hashes the
data with the hash :func:`signature_hash` names, and the SignerInfo's digestAlgorithm (and so
the messageDigest attribute) uses that same hash.

All DER is built and parsed with asn1crypto, never by hand. Like OpenSSL, asn1crypto writes the
SHA-2 AlgorithmIdentifiers with NULL parameters (RFC 5754 §2 says to accept both forms).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from asn1crypto import algos, cms, core, csr, keys, tsp, x509
from asn1crypto import pem as asn1_pem
from rfc3161_client import _rust as rfc3161_rust

__all__ = [
    "FAILURES",
    "HASH_ALGORITHMS",
    "SIGNATURE_ALGORITHMS",
    "ParsedToken",
    "Rejection",
    "TimeStampRequest",
    "TimeStampResp",
    "TokenFields",
    "TspError",
    "certificate",
    "certification_request",
    "certification_request_info",
    "ec_public_key_info",
    "ecdsa_signature",
    "granted",
    "key_identifier",
    "load_certificate",
    "parse_request",
    "parse_token",
    "pem",
    "rejection",
    "rsa_public_key_info",
    "signature_hash",
    "signed_attributes",
    "signed_data",
    "subject_of",
    "tbs_certificate",
    "token",
    "tst_info",
]

#: Message-imprint hash algorithms: name → (dotted OID, digest length).
HASH_ALGORITHMS: Mapping[str, tuple[str, int]] = {
    "sha1": ("1.3.14.3.2.26", 20),
    "sha256": ("2.16.840.1.101.3.4.2.1", 32),
    "sha384": ("2.16.840.1.101.3.4.2.2", 48),
    "sha512": ("2.16.840.1.101.3.4.2.3", 64),
}
_HASH_BY_OID = {oid: name for name, (oid, _) in HASH_ALGORITHMS.items()}

#: Signature algorithms we produce: name → the hash the signer applies to what it signs.
SIGNATURE_ALGORITHMS: Mapping[str, str] = {
    "sha256_ecdsa": "sha256",
    "sha384_ecdsa": "sha384",
    "sha256_rsa": "sha256",
}

#: PKIFailureInfo names (RFC 3161 §2.4.2) → asn1crypto's bit names.
FAILURES: Mapping[str, str] = {
    "badAlg": "bad_alg",
    "badRequest": "bad_request",
    "badDataFormat": "bad_data_format",
    "timeNotAvailable": "time_not_available",
    "unacceptedPolicy": "unaccepted_policy",
    "unacceptedExtension": "unaccepted_extensions",
    "addInfoNotAvailable": "add_info_not_available",
    "systemFailure": "system_failure",
}

#: RFC 3161 asks for a large random nonce; 160 bits is as large as we take.
MAX_NONCE_BITS = 160

_CURVE_POINT_LENGTHS = {"secp256r1": 65, "secp384r1": 97}
_UTC_TIME_LIMIT = datetime(2050, 1, 1, tzinfo=UTC)  # RFC 5280 §4.1.2.5


class TimeStampResp(core.Sequence):
    """``TimeStampResp`` with the token OPTIONAL, as RFC 3161 has it.

    asn1crypto 1.5's ``tsp.TimeStampResp`` makes ``timeStampToken`` mandatory, so it can neither
    write nor read a rejection.
    """

    _fields = [
        ("status", tsp.PKIStatusInfo),
        ("time_stamp_token", cms.ContentInfo, {"optional": True}),
    ]


class TspError(ValueError):
    """Bad input to a builder, or a token that cannot be read."""


class Rejection(ValueError):
    """A request the TSA refuses; :func:`rejection` makes the response to send back.

    ``failure`` is the RFC 3161 PKIFailureInfo name (a key of :data:`FAILURES`), ``text`` a
    sentence for the client's statusString. It carries no HTTP status: RFC 3161 answers a
    rejection inside a normal response.
    """

    def __init__(self, failure: str, text: str) -> None:
        if failure not in FAILURES:
            raise TspError(f"unknown PKIFailureInfo {failure!r}")
        super().__init__(f"{failure}: {text}")
        self.failure = failure
        self.text = text


@dataclass(frozen=True)
class TimeStampRequest:
    """A checked ``TimeStampReq``: what the client wants stamped and how."""

    hash_algorithm: str
    digest: bytes
    policy: str | None
    nonce: int | None
    cert_req: bool


@dataclass(frozen=True)
class TokenFields:
    """The content of a ``TSTInfo``.

    ``gen_time`` must be an aware datetime in UTC; it is encoded as GeneralizedTime with its
    microseconds as a fraction without trailing zeros (none at all for a whole second), as
    RFC 3161 §2.4.2 allows. Callers that want whole seconds pass a time with
    ``microsecond=0``. ``tsa_name`` (an ``asn1crypto.x509.Name``) is put in ``tsa`` as a
    directoryName.
    """

    policy: str
    hash_algorithm: str
    digest: bytes
    serial: int
    gen_time: datetime
    accuracy_seconds: int | None = None
    nonce: int | None = None
    tsa_name: x509.Name | None = None

    def __post_init__(self) -> None:
        if self.hash_algorithm not in HASH_ALGORITHMS:
            raise TspError(f"unknown hash algorithm {self.hash_algorithm!r}")
        if len(self.digest) != HASH_ALGORITHMS[self.hash_algorithm][1]:
            raise TspError(f"a {self.hash_algorithm} digest has the wrong length")
        if self.serial < 0 or self.serial.bit_length() > MAX_NONCE_BITS:
            raise TspError("the serial must be a non-negative integer of at most 160 bits")
        if self.gen_time.utcoffset() != timedelta(0):
            raise TspError("gen_time must be an aware datetime in UTC")
        if self.accuracy_seconds is not None and self.accuracy_seconds < 0:
            raise TspError("accuracy must not be negative")
        if self.nonce is not None and (self.nonce < 0 or self.nonce.bit_length() > MAX_NONCE_BITS):
            raise TspError("the nonce must be a non-negative integer of at most 160 bits")


@dataclass(frozen=True)
class ParsedToken:
    """A token read back by :func:`parse_token`: its TSTInfo and the certificates it embeds."""

    fields: TokenFields
    tst_info: bytes
    certificates: list[bytes]


# --- requests and responses -------------------------------------------------------------------


def parse_request(der: bytes, *, policy: str, allow_sha1: bool = False) -> TimeStampRequest:
    """Check a DER ``TimeStampReq`` (RFC 3161 §2.4.1) for a TSA whose policy is ``policy``.

    Raises :class:`Rejection` — and nothing else, whatever the bytes — when the request is not
    DER or has trailing bytes (badDataFormat), is not version 1 (badRequest), uses a hash other
    than SHA-256/384/512 (or SHA-1 when ``allow_sha1``) (badAlg), has hash parameters other than
    absent or NULL, a digest of the wrong length or a negative or over-160-bit nonce
    (badDataFormat), asks for another policy (unacceptedPolicy) or carries a critical extension
    (unacceptedExtension). Non-critical extensions are ignored.
    """
    fields = _read_request(bytes(der))
    try:
        return _check_request(fields, policy=policy, allow_sha1=allow_sha1)
    except Rejection:
        raise
    except Exception as exc:  # untrusted input: any parser surprise is a rejection
        raise Rejection("badDataFormat", "the request is not a valid TimeStampReq") from exc


@dataclass(frozen=True)
class _RequestFields:
    """What `_check_request` judges of a ``TimeStampReq`` (read one of two ways)."""

    version: int
    hash_oid: str
    hash_parameters_ok: bool  # absent or NULL
    digest: bytes
    policy: str | None
    nonce: int | None
    cert_req: bool
    critical_extension: str | None  # the OID of the first one


def _read_request(der: bytes) -> _RequestFields:
    """The fields of a request that is one DER ``TimeStampReq``, else a `Rejection`.

    Most requests are read by rfc3161-client's parser (Rust, the one sigstore uses; 7 us): it
    takes DER only, with nothing after it, and a SHA-1/SHA-2 algorithm only with absent or NULL
    parameters, but no extensions. Whatever it does not take, and any other algorithm, is read
    the long way (160 us): asn1crypto, which takes BER too, so its parse is encoded again and
    compared with the bytes.
    """
    try:
        r = rfc3161_rust.parse_timestamp_request(der)
        imprint = r.message_imprint
        hash_oid = imprint.hash_algorithm.dotted_string
        # Other algorithms' parameters are not checked there; the long way refuses what
        # asn1crypto cannot read as badDataFormat, before they are judged badAlg.
        if hash_oid in _HASH_BY_OID:
            return _RequestFields(
                version=int(r.version), hash_oid=hash_oid,
                hash_parameters_ok=True, digest=bytes(imprint.message),
                policy=None if r.policy is None else r.policy.dotted_string,
                nonce=None if r.nonce is None else int(r.nonce), cert_req=bool(r.cert_req),
                critical_extension=None)
    except Exception:  # not DER, or a form it does not know (extensions): the long way
        pass
    try:
        request = tsp.TimeStampReq.load(der, strict=True)
        _ = request.native  # asn1crypto parses lazily: force every field now
        canonical = request.dump(force=True)
    except Exception as exc:  # untrusted input: any parser error is a rejection
        raise Rejection("badDataFormat", "the request is not a DER TimeStampReq") from exc
    if canonical != der:
        raise Rejection("badDataFormat", "the request is not in DER")
    try:
        algorithm = request["message_imprint"]["hash_algorithm"]
        return _RequestFields(
            version=int(request["version"]), hash_oid=algorithm["algorithm"].dotted,
            hash_parameters_ok=isinstance(algorithm["parameters"], core.Void | core.Null),
            digest=request["message_imprint"]["hashed_message"].native,
            policy=request["req_policy"].dotted if request["req_policy"].native else None,
            nonce=request["nonce"].native, cert_req=bool(request["cert_req"].native),
            critical_extension=next((e["extn_id"].dotted for e in request["extensions"] or ()
                                     if e["critical"].native), None))
    except Exception as exc:
        raise Rejection("badDataFormat", "the request is not a valid TimeStampReq") from exc


def _check_request(request: _RequestFields, *, policy: str, allow_sha1: bool
                   ) -> TimeStampRequest:
    if request.version != 1:
        raise Rejection("badRequest", "only version 1 requests are supported")

    name = _HASH_BY_OID.get(request.hash_oid)
    if name is None or (name == "sha1" and not allow_sha1):
        raise Rejection("badAlg", "the hash algorithm must be SHA-256, SHA-384 or SHA-512")
    if not request.hash_parameters_ok:  # decoding checks it too
        raise Rejection("badDataFormat", "the hash algorithm parameters must be absent or NULL")
    if len(request.digest) != HASH_ALGORITHMS[name][1]:
        raise Rejection("badDataFormat", f"a {name} digest is {HASH_ALGORITHMS[name][1]} bytes")

    if request.policy is not None and request.policy != policy:
        raise Rejection("unacceptedPolicy", f"this TSA only stamps under policy {policy}")

    nonce = request.nonce
    if nonce is not None and (nonce < 0 or nonce.bit_length() > MAX_NONCE_BITS):
        raise Rejection("badDataFormat", "the nonce must be non-negative and at most 160 bits")

    if request.critical_extension is not None:
        raise Rejection("unacceptedExtension",
                        f"critical extension {request.critical_extension} is not supported")

    return TimeStampRequest(
        hash_algorithm=name,
        digest=request.digest,
        policy=request.policy,
        nonce=nonce,
        cert_req=request.cert_req,
    )


def rejection(failure: str, text: str) -> bytes:
    """The DER ``TimeStampResp`` that refuses a request: status rejection, ``text``, ``failure``."""
    if failure not in FAILURES:
        raise TspError(f"unknown PKIFailureInfo {failure!r}")
    response = TimeStampResp(
        {
            "status": {
                "status": "rejection",
                "status_string": [text],
                "fail_info": {FAILURES[failure]},
            }
        }
    )
    return bytes(response.dump())


def granted(token: bytes) -> bytes:
    """The DER ``TimeStampResp`` with status granted that carries ``token`` (a ContentInfo,
    DER, as `token` makes it): the response's contents are the constant status and the token
    as they are (building the response from a loaded token took 85 us; this takes 3)."""
    return bytes(TimeStampResp(contents=_granted_status() + token).dump())


@functools.lru_cache(maxsize=1)
def _granted_status() -> bytes:
    return bytes(tsp.PKIStatusInfo({"status": "granted"}).dump())


# --- the token --------------------------------------------------------------------------------


def tst_info(fields: TokenFields) -> bytes:
    """The DER ``TSTInfo`` (version 1, ordering omitted, i.e. false) for ``fields``."""
    try:
        return _tst_info(fields)
    except (TypeError, ValueError) as exc:
        raise TspError(f"cannot encode the TSTInfo: {exc}") from exc


def _tst_info(fields: TokenFields) -> bytes:
    """The DER ``TSTInfo`` of ``fields``: the parts every token of a TSA shares (version,
    policy, imprint algorithm, accuracy, the TSA's name) as `_der` keeps them, the others
    encoded as the type the schema gives them (ordering, false, is left out as its default)."""
    parts = [
        _der(tsp.Version, "v1"),
        _der(core.ObjectIdentifier, fields.policy),
        _sequence(_digest_algorithm(fields.hash_algorithm),  # MessageImprint
                  core.OctetString(fields.digest).dump()),
        core.Integer(fields.serial).dump(),
        core.GeneralizedTime(fields.gen_time).dump(),
    ]
    if fields.accuracy_seconds is not None:
        parts.append(_accuracy(fields.accuracy_seconds))
    if fields.nonce is not None:
        parts.append(core.Integer(fields.nonce).dump())
    if fields.tsa_name is not None:
        name = fields.tsa_name  # (one read from a token is still tagged as its directoryName)
        untagged = name.untag() if name.explicit or name.implicit else name
        parts.append(_tsa_name(untagged.dump()))
    return _sequence(*parts)


def signature_hash(signature_algorithm: str) -> str:
    """The hashlib name of the hash the signer applies for ``signature_algorithm``."""
    try:
        return SIGNATURE_ALGORITHMS[signature_algorithm]
    except KeyError:
        raise TspError(f"unsupported signature algorithm {signature_algorithm!r}") from None


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
    return _set_of_contents(_signed_attributes(digest, certificate_der, signing_time))


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
        when = _time(cms.Time, "generalized_time", signing_time)
        attributes.append(_attribute("signing_time", when.dump()))
    return b"".join(sorted(attributes))


def _attribute(kind: str, value_der: bytes) -> bytes:
    """A ``CMSAttribute`` of type ``kind`` (asn1crypto's name) with the one value given."""
    return _sequence(_der(cms.CMSAttributeType, kind), _set_of(value_der))


# The parts of every token that are the same for a certificate (or an algorithm, a policy) are
# encoded once and kept as DER bytes (`_der` and the caches below). The parts that change from
# token to token (imprint, serial, genTime, nonce, messageDigest, signature) are each encoded
# by the asn1crypto type of their field (`core.Integer(serial).dump()`...). Each constructed
# level is a generic asn1crypto value of its tag whose contents are its children's DER joined
# (`_sequence`, `_set_of`; asn1crypto's implicit or explicit tagging where the schema tags
# it), so asn1crypto still writes every tag and length and the schema's order and optional
# fields are kept here, by hand. Why not fill asn1crypto's schema classes (tsp.TSTInfo,
# cms.SignerInfo...): setting a field converts, checks, tags and deep-copies the value, and a
# value as built is encoded again each time its parent asks. build_token took 5.3 ms with every
# part built from native values in one tree, 0.52 ms with the constant parts loaded back from
# their DER into the schema classes (some 1,950 Python calls a token), and about 0.12 ms built
# as here (some 440 calls, most of them in the `dump` of each level; `python -m
# bench.build_token`, whose fake signer's `ecdsa_signature`, made the same way, is counted
# in). test_tsp.py holds the tokens byte for byte to ones built the plain way, from native
# values.


def _sequence(*parts: bytes, **tagging: int) -> bytes:
    """The DER ``SEQUENCE`` of the DER ``parts`` (``tagging``: its implicit or explicit tag)."""
    return bytes(core.Sequence(contents=b"".join(parts), **tagging).dump())


def _set_of(*parts: bytes) -> bytes:
    """The DER ``SET OF`` the DER ``parts``, sorted as DER (and asn1crypto) sort them."""
    return _set_of_contents(b"".join(sorted(parts)))


def _set_of_contents(contents: bytes, **tagging: int) -> bytes:
    """The DER ``SET OF`` whose contents are ``contents``, elements already in order
    (``tagging`` as `_sequence`)."""
    return bytes(core.SetOf(contents=contents, **tagging).dump())


@functools.lru_cache(maxsize=32)
def _der(kind: type[core.Asn1Value], value: object) -> bytes:
    """The DER of a simple value (an OID, a version) from its native value, once."""
    return bytes(kind(value).dump())


@functools.lru_cache(maxsize=8)
def _accuracy(seconds: int) -> bytes:
    return bytes(tsp.Accuracy({"seconds": seconds}).dump())


@functools.lru_cache(maxsize=8)
def _tsa_name(name_der: bytes) -> bytes:
    """The TSTInfo's ``tsa [0] EXPLICIT GeneralName`` (a directoryName) of a DER Name."""
    name = x509.GeneralName(name="directory_name", value=x509.Name.load(name_der))
    return bytes(name.retag({"explicit": 0}).dump())


@functools.cache
def _content_type_tst_info() -> bytes:
    return bytes(cms.CMSAttribute({"type": "content_type", "values": ["tst_info"]}).dump())


@functools.lru_cache(maxsize=8)
def _signing_certificate_v2_attribute(certificate_der: bytes) -> bytes:
    """The signingCertificateV2 attribute naming ``certificate_der``: the same for every
    token of a certificate, and the costliest part to encode."""
    cert = _certificate(certificate_der)
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
    cert = _certificate(certificate_der)
    return bytes(cms.SignerIdentifier(
        name="issuer_and_serial_number",
        value={"issuer": cert.issuer, "serial_number": cert.serial_number}).dump())


@functools.lru_cache(maxsize=8)
def _certificate_set(chain: tuple[bytes, ...]) -> bytes:
    """The SignedData's ``certificates [0] IMPLICIT CertificateSet`` holding ``chain``."""
    certificates = cms.CertificateSet([cms.CertificateChoices(name="certificate",
                                                              value=_certificate(der))
                                       for der in chain])
    return bytes(certificates.retag({"implicit": 0}).dump())


@functools.lru_cache(maxsize=8)
def _digest_algorithms(name: str) -> bytes:
    return bytes(cms.DigestAlgorithms([{"algorithm": name}]).dump())


@functools.lru_cache(maxsize=8)
def _digest_algorithm(name: str) -> bytes:
    return bytes(algos.DigestAlgorithm({"algorithm": name}).dump())


@functools.lru_cache(maxsize=8)
def _signature_algorithm(name: str) -> bytes:
    return bytes(algos.SignedDigestAlgorithm({"algorithm": name}).dump())


def subject_of(certificate_der: bytes) -> x509.Name:
    """The subject of a certificate (the TSA's name in its tokens)."""
    return _certificate(certificate_der).subject


@functools.lru_cache(maxsize=8)
def _certificate(der: bytes) -> x509.Certificate:
    """`load_certificate`, once per certificate (a TSA signs every token with the same one)."""
    return load_certificate(der)


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
    are DER ``ECDSA-Sig-Value`` (:func:`ecdsa_signature`).
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
    signer_info = _sequence(
        _der(cms.CMSVersion, "v1"),
        _sid(chain[0]),
        _digest_algorithm(digest_algorithm),
        _set_of_contents(attributes, implicit=0),  # signedAttrs: as signed, retagged
        _signature_algorithm(signature_algorithm),
        core.OctetString(signature).dump(),
    )
    encap_content_info = _sequence(_der(cms.ContentType, "tst_info"),
                                   core.OctetString(tst_info_der, explicit=0).dump())
    parts = [_der(cms.CMSVersion, "v3"), _digest_algorithms(digest_algorithm), encap_content_info]
    if include_certificates:
        parts.append(_certificate_set(chain))
    parts.append(_set_of(signer_info))  # SignerInfos
    return _sequence(_der(cms.ContentType, "signed_data"),  # ContentInfo
                     _sequence(*parts, explicit=0))


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
        return _set_of_contents(self.attributes)

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


def ecdsa_signature(r: int, s: int) -> bytes:
    """The DER ``ECDSA-Sig-Value`` (``SEQUENCE { r, s }``) for an ECDSA signature."""
    if r <= 0 or s <= 0:
        raise TspError("ECDSA r and s must be positive")
    return _sequence(core.Integer(r).dump(), core.Integer(s).dump())  # as algos.DSASignature


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
        fields = _token_fields(tst)
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


def _token_fields(tst: tsp.TSTInfo) -> TokenFields:
    if int(tst["version"]) != 1:
        raise TspError("the TSTInfo is not version 1")
    name = _HASH_BY_OID.get(tst["message_imprint"]["hash_algorithm"]["algorithm"].dotted)
    if name is None:
        raise TspError("the TSTInfo uses an unknown hash algorithm")
    accuracy = tst["accuracy"].native
    tsa = tst["tsa"]
    return TokenFields(
        policy=tst["policy"].dotted,
        hash_algorithm=name,
        digest=tst["message_imprint"]["hashed_message"].native,
        serial=tst["serial_number"].native,
        gen_time=tst["gen_time"].native.astimezone(UTC),
        accuracy_seconds=accuracy.get("seconds") if accuracy else None,
        nonce=tst["nonce"].native,
        tsa_name=tsa.chosen if tsa.native is not None and tsa.name == "directory_name" else None,
    )


# --- certificates -----------------------------------------------------------------------------


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
                "not_before": _time(x509.Time, "general_time", not_before),
                "not_after": _time(x509.Time, "general_time", not_after),
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


def _time(choice: type[core.Choice], generalized: str, moment: datetime) -> core.Choice:
    """``moment`` as UTCTime before 2050 and GeneralizedTime from then on (RFC 5280 §4.1.2.5,
    RFC 5652 §11.3), in whole seconds; ``generalized`` is the choice's name for the latter."""
    if moment.utcoffset() != timedelta(0):
        raise TspError("times must be aware datetimes in UTC")
    moment = moment.replace(microsecond=0)
    if moment < _UTC_TIME_LIMIT:
        return choice(name="utc_time", value=moment)
    return choice(name=generalized, value=moment)


def load_certificate(der: bytes) -> x509.Certificate:
    """A DER certificate, parsed whole (`TspError` if it is not one)."""
    try:
        cert = x509.Certificate.load(der, strict=True)
        _ = cert.native
    except ValueError as exc:
        raise TspError(f"not a DER certificate: {exc}") from exc
    return cert
