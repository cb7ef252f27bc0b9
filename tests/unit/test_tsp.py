"""Tests of RFC 3161 time-stamping formats (the modules of formats.tsp) against real clients.

``cryptography`` stands in for the agent: it makes the keys and signs the prehashed bytes the
module hands out, nothing else. Requests come from ``openssl ts -query``; the responses built
here must pass ``openssl ts -verify`` and the ``rfc3161-client`` verifier (sigstore's).
"""

from __future__ import annotations

import hashlib
import random
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from asn1crypto import algos, cms, core
from asn1crypto import tsp as asn1_tsp
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from formats.tsp.algorithms import HASH_ALGORITHMS, ecdsa_signature, signature_hash
from formats.tsp.certificates import (
    certificate,
    certification_request,
    certification_request_info,
    ec_public_key_info,
    pem,
    rsa_public_key_info,
    tbs_certificate,
)
from formats.tsp.errors import TspError
from formats.tsp.request import TimeStampRequest, parse_request
from formats.tsp.response import FAILURES, Rejection, granted, rejection
from formats.tsp.response import TimeStampResp as TspTimeStampResp
from formats.tsp.token import parse_token, signed_attributes, signed_data
from formats.tsp.token import token as make_token
from formats.tsp.tstinfo import TokenFields, tst_info

POLICY = "1.3.6.1.4.1.99999.1.1"
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
DATA = b"stampd time-stamp test data\n"

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


# --- the agent stand-in -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys() -> dict[str, PrivateKey]:
    return {
        "p256": ec.generate_private_key(ec.SECP256R1()),
        "p384": ec.generate_private_key(ec.SECP384R1()),
        "rsa3072": rsa.generate_private_key(public_exponent=65537, key_size=3072),
        "ca": ec.generate_private_key(ec.SECP256R1()),
    }


def algorithm(key: PrivateKey) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return "sha384_ecdsa" if key.curve.name == "secp384r1" else "sha256_ecdsa"
    return "sha256_rsa"


def spki(key: PrivateKey) -> bytes:
    public = key.public_key()
    if isinstance(public, ec.EllipticCurvePublicKey):
        point = public.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return ec_public_key_info(public.curve.name, point)
    numbers = public.public_numbers()
    return rsa_public_key_info(numbers.n, numbers.e)


def sign(key: PrivateKey, data: bytes) -> bytes:
    """What an agent does: sign a hash it is given, never the data."""
    name = signature_hash(algorithm(key))
    digest = hashlib.new(name, data).digest()
    prehashed = utils.Prehashed(hashes.SHA384() if name == "sha384" else hashes.SHA256())
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = utils.decode_dss_signature(key.sign(digest, ec.ECDSA(prehashed)))
        return ecdsa_signature(r, s)
    return key.sign(digest, padding.PKCS1v15(), prehashed)


def make_certificate(
    key: PrivateKey,
    subject: dict[str, str],
    *,
    serial: int,
    issuer_key: PrivateKey | None = None,
    issuer: dict[str, str] | None = None,
    is_ca: bool = False,
) -> bytes:
    signer = issuer_key or key
    tbs = tbs_certificate(
        spki(key),
        subject,
        serial=serial,
        not_before=NOW - timedelta(days=1),
        not_after=NOW + timedelta(days=3650),
        signature_algorithm=algorithm(signer),
        issuer=issuer,
        issuer_public_key_info=spki(issuer_key) if issuer_key else None,
        is_ca=is_ca,
    )
    return certificate(tbs, algorithm(signer), sign(signer, tbs))


@dataclass
class Tsa:
    key: PrivateKey
    chain: list[bytes]  # the TSA certificate first
    anchor: bytes  # what the verifier trusts

    def token(
        self, request: TimeStampRequest, *, gen_time: datetime = NOW, serial: int = 42
    ) -> bytes:
        fields = TokenFields(
            policy=POLICY,
            hash_algorithm=request.hash_algorithm,
            digest=request.digest,
            serial=serial,
            gen_time=gen_time,
            accuracy_seconds=1,
            nonce=request.nonce,
            tsa_name=asn1_x509.Certificate.load(self.chain[0]).subject,
        )
        info = tst_info(fields)
        attributes = signed_attributes(
            info, self.chain[0], digest_algorithm=signature_hash(algorithm(self.key))
        )
        return signed_data(
            info,
            attributes,
            sign(self.key, attributes),
            algorithm(self.key),
            self.chain,
            include_certificates=request.cert_req,
        )


def make_tsa(keys: dict[str, PrivateKey], kind: str, shape: str) -> Tsa:
    key = keys[kind]
    if shape == "self-signed":
        cert = make_certificate(key, {"common_name": "stampd test TSA"}, serial=7)
        return Tsa(key, [cert], cert)
    ca_name = {"common_name": "stampd test CA", "organization_name": "stampd"}
    ca = make_certificate(keys["ca"], ca_name, serial=1, is_ca=True)
    cert = make_certificate(
        key,
        {"common_name": "stampd test TSA", "organization_name": "stampd"},
        serial=2,
        issuer_key=keys["ca"],
        issuer=ca_name,
    )
    return Tsa(key, [cert, ca], ca)


# --- real clients -----------------------------------------------------------------------------


def openssl(*args: str | Path, cwd: Path, check: bool = True) -> str:
    result = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    if check and result.returncode != 0:
        raise AssertionError(f"openssl {args} failed: {result.stdout}{result.stderr}")
    return result.stdout + result.stderr


def openssl_query(tmp_path: Path, *options: str) -> bytes:
    (tmp_path / "data").write_bytes(DATA)
    openssl("ts", "-query", "-data", "data", *options, "-out", "q.tsq", cwd=tmp_path)
    return (tmp_path / "q.tsq").read_bytes()


class TimeStampResp(core.Sequence):
    """RFC 3161's TimeStampResp (asn1crypto's makes the token mandatory)."""

    _fields = [
        ("status", asn1_tsp.PKIStatusInfo),
        ("time_stamp_token", cms.ContentInfo, {"optional": True}),
    ]


def request_der(**changes: object) -> bytes:
    """A TimeStampReq built independently, for the cases openssl will not write."""
    value: dict[str, object] = {
        "version": 1,
        "message_imprint": {
            "hash_algorithm": {"algorithm": "sha256"},
            "hashed_message": hashlib.sha256(DATA).digest(),
        },
        "nonce": 12345,
        "cert_req": True,
    }
    value.update(changes)
    return bytes(asn1_tsp.TimeStampReq(value).dump())


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["p256", "p384", "rsa3072"])
def test_public_key_info_is_what_cryptography_writes(
    keys: dict[str, PrivateKey], kind: str
) -> None:
    key = keys[kind]
    expected = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert spki(key) == expected


@pytest.mark.parametrize("shape", ["self-signed", "ca"])
@pytest.mark.parametrize("kind", ["p256", "p384", "rsa3072"])
def test_certificates_verify_and_carry_the_tsa_extensions(
    keys: dict[str, PrivateKey], kind: str, shape: str, tmp_path: Path
) -> None:
    tsa = make_tsa(keys, kind, shape)
    cert = x509.load_der_x509_certificate(tsa.chain[0])
    anchor = x509.load_der_x509_certificate(tsa.anchor)
    cert.verify_directly_issued_by(anchor)
    extensions = cert.extensions
    eku = extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert eku.critical and list(eku.value) == [x509.ExtendedKeyUsageOID.TIME_STAMPING]
    usage = extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and usage.value.content_commitment
    assert not usage.value.key_cert_sign
    assert not extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    ski = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    aki = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert (
        aki.key_identifier == x509.SubjectKeyIdentifier.from_public_key(anchor.public_key()).digest
    )
    if shape == "ca":
        constraints = anchor.extensions.get_extension_for_class(x509.BasicConstraints)
        assert constraints.critical and constraints.value.ca
        assert anchor.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign

    (tmp_path / "anchor.pem").write_text(pem(tsa.anchor, "CERTIFICATE"))
    (tmp_path / "tsa.pem").write_text(pem(tsa.chain[0], "CERTIFICATE"))
    out = openssl(
        "verify", "-purpose", "timestampsign", "-CAfile", "anchor.pem", "tsa.pem", cwd=tmp_path
    )
    assert "tsa.pem: OK" in out


@pytest.mark.parametrize(
    ("nonce", "cert_req"), [(True, True), (True, False), (False, True), (False, False)]
)
@pytest.mark.parametrize("shape", ["self-signed", "ca"])
@pytest.mark.parametrize("kind", ["p256", "p384", "rsa3072"])
def test_openssl_and_rfc3161_client_verify_the_response(
    keys: dict[str, PrivateKey],
    kind: str,
    shape: str,
    nonce: bool,
    cert_req: bool,
    tmp_path: Path,
) -> None:
    tsa = make_tsa(keys, kind, shape)
    options = ["-sha256"] + ([] if nonce else ["-no_nonce"]) + (["-cert"] if cert_req else [])
    request = parse_request(openssl_query(tmp_path, *options), policy=POLICY)
    assert request.hash_algorithm == "sha256"
    assert request.digest == hashlib.sha256(DATA).digest()
    assert request.cert_req is cert_req
    assert (request.nonce is not None) is nonce
    token = tsa.token(request)
    response = granted(token)
    # The response as built the plain way around the token (whose own bytes are the plain
    # way's: test_token_is_byte_for_byte_the_straightforward_one; dump(force=True) here
    # encoded the token again, 0.5 s of CPU per case, in asn1crypto's quadratic re-encoding).
    assert response == TspTimeStampResp(
        {"status": {"status": "granted"}, "time_stamp_token": cms.ContentInfo.load(token)}
    ).dump()
    (tmp_path / "r.tsr").write_bytes(response)
    (tmp_path / "anchor.pem").write_text(pem(tsa.anchor, "CERTIFICATE"))
    (tmp_path / "tsa.pem").write_text(pem(tsa.chain[0], "CERTIFICATE"))

    text = openssl("ts", "-reply", "-in", "r.tsr", "-text", cwd=tmp_path)
    assert "Status: Granted." in text
    assert f"Policy OID: {POLICY}" in text
    assert "Time stamp: Jun  1 12:00:00 2025 GMT" in text
    assert "TSA: DirName:" in text

    # A client that asked for the certificate trusts only the anchor; one that did not must
    # bring the TSA certificate itself (-untrusted): openssl finds no signer otherwise.
    untrusted = [] if cert_req else ["-untrusted", "tsa.pem"]
    for against in (["-data", "data"], ["-queryfile", "q.tsq"]):
        out = openssl(
            "ts",
            "-verify",
            *against,
            "-in",
            "r.tsr",
            "-CAfile",
            "anchor.pem",
            *untrusted,
            cwd=tmp_path,
        )
        assert "Verification: OK" in out
    if not cert_req:
        out = openssl(
            "ts",
            "-verify",
            "-data",
            "data",
            "-in",
            "r.tsr",
            "-CAfile",
            "anchor.pem",
            cwd=tmp_path,
            check=False,
        )
        assert "signer certificate not found" in out

    import rfc3161_client

    decoded = rfc3161_client.decode_timestamp_response(response)
    builder = rfc3161_client.VerifierBuilder(
        policy_id=x509.ObjectIdentifier(POLICY),
        roots=[x509.load_der_x509_certificate(tsa.anchor)],
        intermediates=[x509.load_der_x509_certificate(c) for c in tsa.chain[1:]],
        tsa_certificate=None if cert_req else x509.load_der_x509_certificate(tsa.chain[0]),
        nonce=request.nonce,
    )
    assert builder.build().verify_message(decoded, DATA)


def test_token_parses_back_and_signs_the_very_attributes(keys: dict[str, PrivateKey]) -> None:
    tsa = make_tsa(keys, "p256", "ca")
    request = parse_request(request_der(), policy=POLICY)
    gen_time = NOW.replace(microsecond=250000)
    token = tsa.token(request, gen_time=gen_time, serial=2**159 + 1)

    parsed = parse_token(token)
    assert parsed.fields.policy == POLICY
    assert parsed.fields.digest == hashlib.sha256(DATA).digest()
    assert parsed.fields.serial == 2**159 + 1
    assert parsed.fields.gen_time == gen_time
    assert parsed.fields.nonce == 12345
    assert parsed.fields.accuracy_seconds == 1
    assert parsed.fields.tsa_name == asn1_x509.Certificate.load(tsa.chain[0]).subject
    assert sorted(parsed.certificates) == sorted(tsa.chain)  # a SET OF, so DER-sorted
    assert tst_info(parsed.fields) == parsed.tst_info
    assert b"20250601120000.25Z" in parsed.tst_info

    signer = cms.ContentInfo.load(token)["content"]["signer_infos"][0]
    attributes = signer["signed_attrs"]
    assert b"\x31" + attributes.dump()[1:] == signed_attributes(parsed.tst_info, tsa.chain[0])
    assert signer["signed_attrs"].native  # and asn1crypto reads them back
    ess = attributes[2]["values"][0]["certs"][0]
    assert ess["cert_hash"].native == hashlib.sha256(tsa.chain[0]).digest()
    assert ess.dump()[2:4] == b"\x04\x20"  # hashAlgorithm omitted: SHA-256 is the default


def test_fractional_gen_time_reaches_openssl(keys: dict[str, PrivateKey], tmp_path: Path) -> None:
    tsa = make_tsa(keys, "p256", "self-signed")
    request = parse_request(openssl_query(tmp_path, "-sha512", "-cert"), policy=POLICY)
    token = tsa.token(request, gen_time=NOW.replace(microsecond=120000))
    (tmp_path / "r.tsr").write_bytes(granted(token))
    (tmp_path / "anchor.pem").write_text(pem(tsa.anchor, "CERTIFICATE"))
    text = openssl("ts", "-reply", "-in", "r.tsr", "-text", cwd=tmp_path)
    assert "Time stamp: Jun  1 12:00:00.12 2025 GMT" in text
    assert "Hash Algorithm: sha512" in text
    out = openssl(
        "ts",
        "-verify",
        "-queryfile",
        "q.tsq",
        "-in",
        "r.tsr",
        "-CAfile",
        "anchor.pem",
        cwd=tmp_path,
    )
    assert "Verification: OK" in out


def test_signing_time_attribute_is_optional(keys: dict[str, PrivateKey]) -> None:
    cert = make_tsa(keys, "p256", "self-signed").chain[0]
    info = b"\x30\x00"
    plain = cms.CMSAttributes.load(signed_attributes(info, cert))
    timed = cms.CMSAttributes.load(signed_attributes(info, cert, signing_time=NOW))
    late = cms.CMSAttributes.load(
        signed_attributes(info, cert, signing_time=NOW.replace(year=2051))
    )
    assert [a["values"][0].name for a in late if a["type"].native == "signing_time"] == [
        "generalized_time"
    ]
    with pytest.raises(TspError):
        signed_attributes(info, cert, signing_time=NOW.replace(tzinfo=None))
    assert len(plain) == 3
    assert {a["type"].native for a in timed} == {
        "content_type",
        "message_digest",
        "signing_certificate_v2",
        "signing_time",
    }
    for when, attributes in [(None, plain), (NOW, timed), (NOW.replace(year=2051), late)]:
        digest = hashlib.sha256(info).digest()
        assert _straightforward_attributes(cert, digest, when).dump() == attributes.dump()


def test_signed_data_refuses_attributes_of_another_tst_info(keys: dict[str, PrivateKey]) -> None:
    tsa = make_tsa(keys, "p256", "self-signed")
    request = parse_request(request_der(), policy=POLICY)
    fields = TokenFields(POLICY, "sha256", request.digest, 1, NOW)
    info = tst_info(fields)
    other = tst_info(TokenFields(POLICY, "sha256", request.digest, 2, NOW))
    attributes = signed_attributes(other, tsa.chain[0])
    with pytest.raises(TspError, match="messageDigest"):
        signed_data(
            info, attributes, b"sig", "sha256_ecdsa", tsa.chain, include_certificates=True
        )
    with pytest.raises(TspError, match="messageDigest"):  # hashed for P-384, signed as P-256
        signed_data(
            info,
            signed_attributes(info, tsa.chain[0], digest_algorithm="sha384"),
            b"sig",
            "sha256_ecdsa",
            tsa.chain,
            include_certificates=True,
        )
    with pytest.raises(TspError):
        signed_data(info, attributes, b"sig", "sha1_rsa", tsa.chain, include_certificates=True)


def test_token_fields_are_checked() -> None:
    digest = bytes(32)
    with pytest.raises(TspError, match="UTC"):
        TokenFields(POLICY, "sha256", digest, 1, datetime(2025, 1, 1))
    with pytest.raises(TspError, match="UTC"):
        TokenFields(POLICY, "sha256", digest, 1, NOW.astimezone(timezone(timedelta(hours=2))))
    with pytest.raises(TspError, match="length"):
        TokenFields(POLICY, "sha256", bytes(20), 1, NOW)
    with pytest.raises(TspError, match="nonce"):
        TokenFields(POLICY, "sha256", digest, 1, NOW, nonce=-1)
    with pytest.raises(TspError, match="serial"):
        TokenFields(POLICY, "sha256", digest, 2**160, NOW)


def test_parse_token_refuses_what_is_not_a_token() -> None:
    for der in (b"", b"\x30\x00", b"garbage", rejection("badAlg", "no")):
        with pytest.raises(TspError):
            parse_token(der)


def test_certification_request_is_signed_and_asks_for_the_tsa_extensions(
    keys: dict[str, PrivateKey], tmp_path: Path
) -> None:
    for kind in ("p256", "rsa3072"):
        key = keys[kind]
        info = certification_request_info(
            spki(key), {"common_name": "stampd TSA", "organization_name": "stampd"}
        )
        der = certification_request(info, algorithm(key), sign(key, info))
        request = x509.load_der_x509_csr(der)
        assert request.is_signature_valid
        assert request.subject.rfc4514_string() == "CN=stampd TSA,O=stampd"
        eku = request.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        assert eku.critical and list(eku.value) == [x509.ExtendedKeyUsageOID.TIME_STAMPING]
        assert request.extensions.get_extension_for_class(x509.KeyUsage).critical
        (tmp_path / "req.pem").write_text(pem(der, "CERTIFICATE REQUEST"))
        assert "verify OK" in openssl("req", "-in", "req.pem", "-verify", "-noout", cwd=tmp_path)


def test_key_material_is_checked() -> None:
    with pytest.raises(TspError):
        ec_public_key_info("secp256r1", b"\x02" + bytes(32))  # compressed
    with pytest.raises(TspError):
        ec_public_key_info("secp521r1", b"\x04" + bytes(132))
    with pytest.raises(TspError):
        ecdsa_signature(0, 1)
    assert ecdsa_signature(1, 2**255) == (b"\x30\x26\x02\x01\x01\x02\x21\x00\x80" + bytes(31))


# --- rejections -------------------------------------------------------------------------------


def rejected(der: bytes, **options: object) -> Rejection:
    with pytest.raises(Rejection) as caught:
        parse_request(der, policy=POLICY, **options)  # type: ignore[arg-type]
    return caught.value


def test_request_with_policy_nonce_and_extension_is_read() -> None:
    extension = {"extn_id": "1.2.3.4", "critical": False, "extn_value": b"x"}
    request = parse_request(
        request_der(req_policy=POLICY, nonce=2**160 - 1, extensions=[extension]), policy=POLICY
    )
    assert request == TimeStampRequest(
        "sha256", hashlib.sha256(DATA).digest(), POLICY, 2**160 - 1, True
    )
    assert parse_request(request_der(nonce=0), policy=POLICY).nonce == 0


def test_sha1_is_refused_unless_allowed(tmp_path: Path) -> None:
    der = openssl_query(tmp_path, "-sha1")
    assert rejected(der).failure == "badAlg"
    request = parse_request(der, policy=POLICY, allow_sha1=True)
    assert request.hash_algorithm == "sha1" and request.digest == hashlib.sha1(DATA).digest()


def test_openssl_policy_request(tmp_path: Path) -> None:
    assert (
        parse_request(openssl_query(tmp_path, "-tspolicy", POLICY), policy=POLICY).policy
        == POLICY
    )
    assert rejected(openssl_query(tmp_path, "-tspolicy", "1.2.3.4")).failure == "unacceptedPolicy"


@pytest.mark.parametrize(
    ("der", "failure"),
    [
        (request_der(version=2), "badRequest"),
        (request_der(version=0), "badRequest"),
        (
            request_der(
                message_imprint={
                    "hash_algorithm": {"algorithm": "md5"},
                    "hashed_message": bytes(16),
                }
            ),
            "badAlg",
        ),
        (
            request_der(
                message_imprint={
                    "hash_algorithm": {"algorithm": "sha256"},
                    "hashed_message": bytes(20),
                }
            ),
            "badDataFormat",
        ),
        (
            request_der(
                message_imprint={
                    "hash_algorithm": {"algorithm": "sha512"},
                    "hashed_message": bytes(32),
                }
            ),
            "badDataFormat",
        ),
        (request_der(req_policy="1.2.3.4"), "unacceptedPolicy"),
        (
            request_der(extensions=[{"extn_id": "1.2.3.4", "critical": True, "extn_value": b""}]),
            "unacceptedExtension",
        ),
        (request_der(nonce=-1), "badDataFormat"),
        (request_der(nonce=2**160), "badDataFormat"),
        (request_der() + b"\x00", "badDataFormat"),
        (request_der()[:-1], "badDataFormat"),
        (b"", "badDataFormat"),
        (b"garbage", "badDataFormat"),
        (b"\x30\x00", "badDataFormat"),
        (bytes(TimeStampResp({"status": {"status": "granted"}}).dump()), "badDataFormat"),
    ],
)
def test_bad_requests_are_rejected(der: bytes, failure: str) -> None:
    assert rejected(der).failure == failure


def test_hash_parameters_absent_null_or_nothing_else() -> None:
    sha256 = bytes(core.ObjectIdentifier("2.16.840.1.101.3.4.2.1").dump())

    def with_algorithm(der: bytes) -> bytes:
        imprint = {
            "hash_algorithm": algos.DigestAlgorithm.load(der),
            "hashed_message": hashlib.sha256(DATA).digest(),
        }
        return request_der(message_imprint=imprint)

    absent = with_algorithm(b"\x30\x0b" + sha256)  # the RFC 5754 form
    assert parse_request(absent, policy=POLICY).hash_algorithm == "sha256"
    assert absent != request_der()
    octets = with_algorithm(b"\x30\x0d" + sha256 + b"\x04\x00")
    assert rejected(octets).failure == "badDataFormat"


def test_ber_is_rejected() -> None:
    good = request_der()
    # certReq TRUE as 0x01 (BER, not DER), and the DEFAULT FALSE written out.
    assert rejected(good.replace(b"\x01\x01\xff", b"\x01\x01\x01")).failure == "badDataFormat"
    explicit_false = good.replace(b"\x01\x01\xff", b"\x01\x01\x00")
    assert rejected(explicit_false).failure == "badDataFormat"
    # A long-form length where a short one fits.
    long_form = b"\x30\x81" + good[1:]
    assert rejected(long_form).failure == "badDataFormat"


@pytest.mark.parametrize(
    ("failure", "openssl_text"),
    [
        ("badAlg", "unrecognized or unsupported algorithm identifier"),
        ("badRequest", "transaction not permitted or supported"),
        ("badDataFormat", "the data submitted has the wrong format"),
        ("timeNotAvailable", "the TSA's time source is not available"),
        ("unacceptedPolicy", "the requested TSA policy is not supported by the TSA"),
        ("unacceptedExtension", "the requested extension is not supported by the TSA"),
        ("systemFailure", "the request cannot be handled due to system failure"),
    ],
)
def test_rejection_response(failure: str, openssl_text: str, tmp_path: Path) -> None:
    der = rejection(failure, f"refused: {failure}")
    response = TimeStampResp.load(der, strict=True)
    assert response.dump(force=True) == der
    status = response["status"]
    assert status["status"].native == "rejection"
    assert status["status_string"].native == [f"refused: {failure}"]
    assert status["fail_info"].native == {FAILURES[failure]}
    assert not response["time_stamp_token"].native
    (tmp_path / "rej.tsr").write_bytes(der)
    text = openssl("ts", "-reply", "-in", "rej.tsr", "-text", cwd=tmp_path)
    assert "Status: Rejected." in text
    assert f"Status description: refused: {failure}" in text
    assert openssl_text in text

    import rfc3161_client

    assert rfc3161_client.decode_timestamp_response(der).status == 2


def test_rejection_refuses_unknown_failures() -> None:
    with pytest.raises(TspError):
        rejection("teapot", "no")
    with pytest.raises(TspError):
        Rejection("teapot", "no")


def test_nothing_but_rejection_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random and mutated requests: only a `Rejection` comes out, and the fast DER check
    (rfc3161-client's parser) reaches the verdict the long one (asn1crypto, encoded again and
    compared) reaches for every one of them."""

    def verdict(der: bytes) -> object:
        try:
            return parse_request(der, policy=POLICY, allow_sha1=bool(round_ & 1))
        except Rejection as exc:
            assert exc.failure in FAILURES
            return exc.failure

    class LongWay:
        @staticmethod
        def parse_timestamp_request(der: bytes) -> None:
            raise ValueError("the long way")

    seeds = [
        request_der(),
        request_der(
            req_policy=POLICY,
            extensions=[{"extn_id": "1.2.3.4", "critical": False, "extn_value": b"x"}],
        ),
        openssl_query(tmp_path, "-sha384", "-cert"),
        openssl_query(tmp_path, "-sha1", "-no_nonce"),
        request_der(version=2, nonce=2**170, cert_req=False),
    ]
    rng = random.Random(3161)
    for round_ in range(1500):
        seed = bytearray(rng.choice(seeds))
        mode = round_ % 5
        if mode == 0:
            der = rng.randbytes(rng.randrange(0, 120))
        elif mode == 1:
            for _ in range(rng.randrange(1, 4)):
                seed[rng.randrange(len(seed))] ^= 1 << rng.randrange(8)
            der = bytes(seed)
        elif mode == 2:
            seed[rng.randrange(len(seed))] = rng.randrange(256)
            der = bytes(seed)
        elif mode == 3:
            cut = rng.randrange(len(seed))
            der = bytes(seed[:cut] + seed[cut + 1 :]) if rng.random() < 0.5 else bytes(seed[:cut])
        else:
            at = rng.randrange(len(seed))
            der = bytes(seed[:at] + rng.randbytes(rng.randrange(1, 4)) + seed[at:])
        fast = verdict(der)
        with monkeypatch.context() as m:
            m.setattr("formats.tsp.request.rfc3161_rust", LongWay)
            assert verdict(der) == fast, der.hex()


def test_validity_after_2049_is_generalized_time(keys: dict[str, PrivateKey]) -> None:
    key = keys["p256"]
    tbs = tbs_certificate(
        spki(key),
        {"common_name": "long-lived TSA"},
        serial=9,
        not_before=NOW,
        not_after=datetime(2060, 1, 1, tzinfo=UTC),
        signature_algorithm="sha256_ecdsa",
    )
    cert = x509.load_der_x509_certificate(certificate(tbs, "sha256_ecdsa", sign(key, tbs)))
    assert cert.not_valid_after_utc == datetime(2060, 1, 1, tzinfo=UTC)
    validity = asn1_x509.TbsCertificate.load(tbs)["validity"]
    assert (validity["not_before"].name, validity["not_after"].name) == (
        "utc_time",
        "general_time",
    )
    with pytest.raises(TspError):
        certificate(tbs, "sha256_rsa", b"sig")


def _straightforward_token(fields: TokenFields, algorithm_name: str, chain: list[bytes],
                           signature: bytes, include_certificates: bool) -> bytes:
    """A token built the plain way, every part from native values in one asn1crypto tree (what
    `formats.tsp.token.token` built before its parts were encoded once and loaded back)."""
    digest_name = signature_hash(algorithm_name)
    value: dict[str, object] = {
        "version": "v1", "policy": fields.policy,
        "message_imprint": {"hash_algorithm": {"algorithm": fields.hash_algorithm},
                            "hashed_message": fields.digest},
        "serial_number": fields.serial, "gen_time": fields.gen_time,
    }
    if fields.accuracy_seconds is not None:
        value["accuracy"] = {"seconds": fields.accuracy_seconds}
    if fields.nonce is not None:
        value["nonce"] = fields.nonce
    if fields.tsa_name is not None:
        value["tsa"] = asn1_x509.GeneralName(name="directory_name", value=fields.tsa_name)
    info = asn1_tsp.TSTInfo(value)
    cert = asn1_x509.Certificate.load(chain[0])
    attributes = _straightforward_attributes(
        chain[0], hashlib.new(digest_name, info.dump()).digest())
    signed: dict[str, object] = {
        "version": "v3",
        "digest_algorithms": [{"algorithm": digest_name}],
        "encap_content_info": {"content_type": "tst_info", "content": info},
        "signer_infos": [{
            "version": "v1",
            "sid": {"issuer_and_serial_number": {"issuer": cert.issuer,
                                                 "serial_number": cert.serial_number}},
            "digest_algorithm": {"algorithm": digest_name},
            "signed_attrs": attributes,
            "signature_algorithm": {"algorithm": algorithm_name},
            "signature": signature,
        }],
    }
    if include_certificates:
        signed["certificates"] = [asn1_x509.Certificate.load(der) for der in chain]
    return bytes(cms.ContentInfo({"content_type": "signed_data",
                                  "content": cms.SignedData(signed)}).dump())


# (accuracy, nonce, certReq, the TSA's name in the token, serial, genTime, imprint hash)
TOKEN_CASES = [
    (1, 2**100 + 7, True, True, 2**64, NOW, "sha384"),
    (None, None, False, True, 2**64 + 1, NOW.replace(microsecond=1000), "sha256"),
    (0, 0, True, False, 0, NOW.replace(microsecond=2000), "sha384"),
    (1, None, True, True, 2**160 - 1, datetime(2050, 1, 1, tzinfo=UTC), "sha512"),
    (None, 2**160 - 1, False, False, 2**159 + 1,
     datetime(2099, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "sha256"),
    (30, 1, False, True, 1, datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC), "sha1"),
]


def _straightforward_attributes(certificate: bytes, message_digest: bytes,
                                signing_time: datetime | None = None) -> cms.CMSAttributes:
    """The signed attributes built the plain way, from native values (asn1crypto sorts them)."""
    cert = asn1_x509.Certificate.load(certificate)
    ess = {"cert_hash": hashlib.sha256(certificate).digest(),
           "issuer_serial": {"issuer": [asn1_x509.GeneralName(name="directory_name",
                                                               value=cert.issuer)],
                             "serial_number": cert.serial_number}}
    attributes: list[dict[str, object]] = [
        {"type": "content_type", "values": ["tst_info"]},
        {"type": "message_digest", "values": [message_digest]},
        {"type": "signing_certificate_v2", "values": [{"certs": [ess]}]},
    ]
    if signing_time is not None:
        choice = "utc_time" if signing_time.year < 2050 else "generalized_time"
        attributes.append({"type": "signing_time",
                           "values": [cms.Time(name=choice, value=signing_time)]})
    return cms.CMSAttributes(attributes)


@pytest.mark.parametrize("kind", ["p256", "p384", "rsa3072"])
def test_token_is_byte_for_byte_the_straightforward_one(keys: dict[str, PrivateKey],
                                                         kind: str) -> None:
    tsa = make_tsa(keys, kind, "ca")
    name = asn1_x509.Certificate.load(tsa.chain[0]).subject
    signature_algorithm = algorithm(tsa.key)
    signed: list[bytes] = []

    def sign_it(data: bytes) -> bytes:
        signed.append(data)
        return sign(tsa.key, data)

    for accuracy, nonce, certs, named, serial, gen_time, imprint in TOKEN_CASES:
        digest = bytes(range(HASH_ALGORITHMS[imprint][1]))
        fields = TokenFields(POLICY, imprint, digest, serial, gen_time, accuracy, nonce,
                             name if named else None)
        token = make_token(fields, signature_algorithm, tsa.chain, sign_it,
                           include_certificates=certs)
        signature = bytes(cms.ContentInfo.load(token)["content"]["signer_infos"][0]["signature"])
        assert token == _straightforward_token(fields, signature_algorithm, tsa.chain, signature,
                                               certs)
        # what was signed is what the token's signer info carries as its signed attributes
        info = tst_info(fields)
        attributes = signed_attributes(info, tsa.chain[0],
                                       digest_algorithm=signature_hash(signature_algorithm))
        assert (parse_token(token).tst_info, attributes) == (info, signed[-1])
        # and the three steps one by one make the same token
        assert signed_data(info, attributes, signature, signature_algorithm, tsa.chain,
                           include_certificates=certs) == token
        assert parse_token(token).fields == fields
    assert b"\x18\x0f20500101000000Z" in tst_info(  # GeneralizedTime, even from 2050
        TokenFields(POLICY, "sha256", bytes(32), 1, datetime(2050, 1, 1, tzinfo=UTC)))


def test_ecdsa_signature_is_the_asn1crypto_one() -> None:
    for r, s in [(1, 1), (2**255, 2**255 - 1), (2**383 + 5, 127), (128, 2**256 - 189)]:
        assert ecdsa_signature(r, s) == algos.DSASignature({"r": r, "s": s}).dump()


def test_the_pinned_fast_parser_still_reads_requests(tmp_path: Path) -> None:
    """rfc3161-client has no public parser of requests: `formats.tsp.request` calls its private
    ``_rust.parse_timestamp_request`` (7 us a request, asn1crypto's way 160 us), and
    pyproject.toml pins the release exactly. Its fallback would hide a release that changed it
    (every request then the long way, 20 times slower): here the private call itself must
    read what openssl writes into the fields the long way reads."""
    from rfc3161_client import _rust

    der = openssl_query(tmp_path, "-sha384", "-cert")
    fast = _rust.parse_timestamp_request(der)
    long = asn1_tsp.TimeStampReq.load(der)
    assert int(fast.version) == 1
    assert fast.message_imprint.hash_algorithm.dotted_string == "2.16.840.1.101.3.4.2.2"
    assert bytes(fast.message_imprint.message) == long["message_imprint"]["hashed_message"].native
    assert int(fast.nonce) == long["nonce"].native
    assert bool(fast.cert_req) is True and fast.policy is None
