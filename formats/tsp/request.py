"""RFC 3161 requests (§2.4.1): :func:`parse_request` checks a DER ``TimeStampReq`` and returns
a :class:`TimeStampRequest`, or raises `formats.tsp.response.Rejection`, which
`formats.tsp.response.rejection` turns into the ``TimeStampResp`` to send back."""

from __future__ import annotations

from dataclasses import dataclass

from asn1crypto import core, tsp
from rfc3161_client import _rust as rfc3161_rust

from formats.tsp.algorithms import HASH_ALGORITHMS, HASH_BY_OID, MAX_NONCE_BITS
from formats.tsp.response import Rejection

__all__ = ["TimeStampRequest", "parse_request"]


@dataclass(frozen=True)
class TimeStampRequest:
    """A checked ``TimeStampReq``: what the client wants stamped and how."""

    hash_algorithm: str
    digest: bytes
    policy: str | None
    nonce: int | None
    cert_req: bool


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
        if hash_oid in HASH_BY_OID:
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

    name = HASH_BY_OID.get(request.hash_oid)
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
