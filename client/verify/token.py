"""RFC 3161 time-stamp responses and tokens, their certificates, and where a ``--log`` publishes
their imprint.

An RFC 3161 time-stamp response (``.tsr``) or bare token (a DER file: the first byte tells it
from a receipt's text) is checked offline with ``cryptography``: one SignerInfo whose signature
over the signed attributes verifies with the signer certificate (from the token, or from
``--chain`` when the request had no ``certReq``), contentType id-ct-TSTInfo, messageDigest the
hash of the TSTInfo, signingCertificateV2 naming that certificate, the certificate's critical
timeStamping EKU and validity at ``genTime``, the ``tsa`` name (if any) its subject, and -- with
``--data``/``--file`` or ``--digest`` -- the imprint. With ``--chain`` the certificate must chain
(each link's signature checked) to a certificate of that file, all of which are trusted, as
``openssl ts -verify -CAfile`` has it; without it the token is "cannot check". With ``--log`` (a
log clone or its URL, audited as ``stampd audit`` does) the first main commit whose
``digests.log`` holds the imprint is named, with its earliest peer stamp.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2
from asn1crypto import algos, cms, core, x509
from asn1crypto import parser as asn1_parser
from asn1crypto import pem as asn1_pem

from client.audit.auditor import audit
from client.audit.errors import COMMIT_SCHEDULE, AuditError, EmptyLog, TargetError
from client.audit.report import MAIN_CHECK, PeerStamp
from client.audit.repository import URL, local_copy, open_repository, read_blob
from client.verify.errors import CannotCheck, Invalid, Malformed, NotLogged
from client.verify.inputs import file_digest, iso
from formats.tsp.algorithms import HASH_ALGORITHMS
from formats.tsp.certificates import load_certificate
from formats.tsp.errors import TspError
from formats.tsp.response import TimeStampResp
from formats.tsp.token import parse_token
from formats.tsp.tstinfo import TokenFields

if TYPE_CHECKING:  # imported where used: cryptography is needed for RFC 3161 tokens only
    from cryptography.hazmat.primitives import hashes


MAX_TOKEN = 1024 * 1024
MAX_CHAIN = 1024 * 1024
MAX_PATH = 8  # certificates from the TSA's up to an anchor
TOKEN_SUFFIXES = (".tsr", ".tst", ".token", ".der", ".p7s")
DER_SEQUENCE = 0x30
_OID_TAG = 0x06
# PKIStatus values with a token (RFC 3161 §2.4.2): granted, grantedWithMods.
_GRANTED = ("granted", "granted_with_mods")


@dataclass(frozen=True)
class Anchor:
    """How the signer certificate was tied to ``--chain``: the certificates from the signer's
    up (each one's signature checked with the next one's key), and the one found in
    ``--chain`` (None: not anchored)."""

    path: tuple[str, ...]  # subjects, the signer's first
    anchor: str | None


@dataclass(frozen=True)
class TokenResult:
    container: str  # "TimeStampResp" or "token"
    fields: TokenFields
    signature_algorithm: str
    signer: str  # subject of the signer certificate
    signer_sha256: str
    certificate_origin: str  # "the token" or "--chain FILE"
    anchor: Anchor | None  # None: no --chain given
    checked: str | None  # what the imprint was compared with, if anything

    @property
    def imprint(self) -> str:
        return f"{self.fields.hash_algorithm} {self.fields.digest.hex()}"


@dataclass(frozen=True)
class LogResult:
    target: str
    commit: str
    number: int | None
    time: int
    fingerprint: str | None  # the server key that signed the log
    stamp: PeerStamp | None  # the earliest peer stamp covering the commit
    problems: int  # audit failures elsewhere in the log (not about this commit or before it)


def is_token(data: bytes, target: str) -> bool:
    """Whether the bytes read from ``target`` are meant as an RFC 3161 response or token (DER
    starts with a SEQUENCE; receipts are ASCII text) rather than a receipt."""
    return (data[:1] == bytes([DER_SEQUENCE])
            or target.lower().endswith(TOKEN_SUFFIXES))


def unwrap_token(data: bytes) -> tuple[bytes, str]:
    """(the token, a ``ContentInfo``; "TimeStampResp" or "token"): a ``TimeStampResp`` (what
    ``curl`` saves from a TSA) is told from a bare token by its first element, a
    ``PKIStatusInfo`` SEQUENCE rather than the ContentInfo's OID."""
    if len(data) > MAX_TOKEN:
        raise Malformed(f"larger than {MAX_TOKEN} bytes: not a time-stamp response or token")
    try:
        _, _, _, _, contents, trailer = asn1_parser.parse(data, strict=True)
    except ValueError:
        raise Malformed("not DER: not a time-stamp response (.tsr) or token") from None
    if data[:1] != bytes([DER_SEQUENCE]) or trailer:
        raise Malformed("not a DER SEQUENCE: not a time-stamp response (.tsr) or token")
    if contents[:1] == bytes([_OID_TAG]):
        return data, "token"
    if contents[:1] != bytes([DER_SEQUENCE]):
        raise Malformed("neither a TimeStampResp nor a token (ContentInfo)")
    try:
        response = TimeStampResp.load(data, strict=True)
        status = response["status"]
        state = status["status"].native
        texts = status["status_string"].native or []
        failures = sorted(status["fail_info"].native or ())
        token = response["time_stamp_token"]
        der = None if isinstance(token, core.Void) else bytes(token.dump())
    except ValueError as e:
        raise Malformed(f"not a TimeStampResp: {e}") from None
    if state not in _GRANTED:
        why = "; ".join(texts) or "no reason given"
        fail = f" (failInfo {', '.join(failures)})" if failures else ""
        raise Malformed(f"the TSA refused the request: status {state}{fail}: {why[:200]}; "
                        "the response holds no token")
    if der is None:
        raise Malformed(f"the response has status {state} but holds no token")
    return der, "TimeStampResp"


def _hash_name(algorithm: algos.DigestAlgorithm) -> str:
    name = str(algorithm["algorithm"].native)
    if name not in HASH_ALGORITHMS and name != "sha224":
        raise Invalid(f"unsupported digest algorithm {name}")
    return name


def _crypto_hash(name: str) -> hashes.HashAlgorithm:
    from cryptography.hazmat.primitives import hashes

    known: dict[str, hashes.HashAlgorithm] = {
        "sha1": hashes.SHA1(), "sha224": hashes.SHA224(), "sha256": hashes.SHA256(),
        "sha384": hashes.SHA384(), "sha512": hashes.SHA512()}
    if name not in known:
        raise Invalid(f"unsupported hash algorithm {name}")
    return known[name]


def _require_cryptography() -> None:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        raise CannotCheck("checking RFC 3161 tokens needs the Python package 'cryptography' "
                          "(pip install 'cryptography>=42')") from None


def verify_signature(cert_der: bytes, signature: bytes, data: bytes,
                     algorithm: algos.SignedDigestAlgorithm, digest_name: str) -> None:
    """Check ``signature`` over ``data`` with the key of ``cert_der``; `Invalid` otherwise."""
    from cryptography import x509 as cx509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa

    key = cx509.load_der_x509_certificate(cert_der).public_key()
    kind = algorithm.signature_algo
    try:
        hash_name = algorithm.hash_algo
    except ValueError:  # rsassa_pkcs1v15, ecdsa... without a hash in the name
        hash_name = digest_name
    try:
        if kind == "ecdsa" and isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(_crypto_hash(hash_name)))
        elif kind == "rsassa_pkcs1v15" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), _crypto_hash(hash_name))
        elif kind == "rsassa_pss" and isinstance(key, rsa.RSAPublicKey):
            params = algorithm["parameters"]
            mgf_hash = params["mask_gen_algorithm"]["parameters"]["algorithm"].native
            key.verify(signature, data,
                       padding.PSS(padding.MGF1(_crypto_hash(mgf_hash)),
                                   int(params["salt_length"].native)),
                       _crypto_hash(params["hash_algorithm"]["algorithm"].native))
        elif ((kind == "ed25519" and isinstance(key, ed25519.Ed25519PublicKey))
              or (kind == "ed448" and isinstance(key, ed448.Ed448PublicKey))):
            key.verify(signature, data)
        else:
            raise Invalid(f"signature algorithm {algorithm['algorithm'].native} does not fit "
                          f"the certificate's {type(key).__name__.removesuffix('PublicKey')} "
                          "key, or is not supported")
    except InvalidSignature:
        raise Invalid("the signature over the signed attributes does not verify with the "
                      "signer certificate's key") from None
    except (UnsupportedAlgorithm, ValueError, KeyError, TypeError) as e:
        raise Invalid(f"the signature cannot be checked: {e}") from None


_NAME_KEYS = {"common_name": "CN", "organization_name": "O", "organizational_unit_name": "OU",
              "country_name": "C", "state_or_province_name": "ST", "locality_name": "L"}


def name_text(name: x509.Name) -> str:
    """A distinguished name as ``CN=..., O=...``: the most specific part first, as RFC 4514
    writes it."""
    parts = []
    for rdn in reversed(list(name.chosen)):
        parts.append("+".join(f"{_NAME_KEYS.get(atv['type'].native, atv['type'].dotted)}="
                              f"{atv['value'].native}" for atv in rdn))
    return ", ".join(parts)


def _load_certificate(der: bytes, origin: str) -> x509.Certificate:
    try:
        return load_certificate(der)
    except TspError as e:
        raise Malformed(f"a certificate in {origin} cannot be read: {e}") from None


def read_chain(path: Path) -> list[bytes]:
    """The DER certificates of a PEM file (any number of CERTIFICATE blocks) or of one DER
    certificate."""
    try:
        data = path.read_bytes()[:MAX_CHAIN + 1]
    except OSError as e:
        raise Malformed(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_CHAIN:
        raise Malformed(f"{path} is larger than {MAX_CHAIN} bytes: not a certificate chain")
    ders: list[bytes] = []
    if asn1_pem.detect(data):
        try:
            ders = [der for label, _, der in asn1_pem.unarmor(data, multiple=True)
                    if label == "CERTIFICATE"]
        except ValueError as e:
            raise Malformed(f"{path}: bad PEM: {e}") from None
    elif data[:1] == bytes([DER_SEQUENCE]):
        ders = [data]
    if not ders:
        raise Malformed(f"{path} holds no certificate (PEM or DER)")
    for der in ders:
        _load_certificate(der, str(path))
    return ders


def _extension(cert: x509.Certificate, name: str) -> x509.Extension | None:
    return next((e for e in cert["tbs_certificate"]["extensions"] or ()
                 if e["extn_id"].native == name), None)


def check_tsa_certificate(cert: x509.Certificate, gen_time: datetime) -> None:
    """RFC 3161 §2.3: extendedKeyUsage id-kp-timeStamping alone, critical; a keyUsage (if
    any) that allows signatures; valid at the token's time."""
    eku = _extension(cert, "extended_key_usage")
    if eku is None:
        raise Invalid("the signer certificate has no extendedKeyUsage: not a TSA certificate "
                      "(RFC 3161 §2.3 asks for id-kp-timeStamping, critical)")
    if eku["extn_value"].native != ["time_stamping"]:
        raise Invalid(f"the signer certificate's extendedKeyUsage is "
                      f"{', '.join(eku['extn_value'].native)}, not id-kp-timeStamping alone")
    if not eku["critical"].native:
        raise Invalid("the signer certificate's extendedKeyUsage timeStamping is not critical "
                      "(RFC 3161 §2.3)")
    usage = cert.key_usage_value
    if usage is not None and not {"digital_signature", "non_repudiation"} & usage.native:
        raise Invalid("the signer certificate's keyUsage allows no signatures")
    _valid_at(cert, gen_time, "the signer certificate")


def _valid_at(cert: x509.Certificate, moment: datetime, what: str) -> None:
    validity = cert["tbs_certificate"]["validity"]
    not_before, not_after = validity["not_before"].native, validity["not_after"].native
    if not not_before <= moment <= not_after:
        raise Invalid(f"{what} ({name_text(cert.subject)}) is valid from "
                      f"{not_before:%Y-%m-%dT%H:%M:%SZ} to {not_after:%Y-%m-%dT%H:%M:%SZ}, "
                      f"not at the token's time {moment:%Y-%m-%dT%H:%M:%SZ}")


def _is_ca(cert: x509.Certificate) -> bool:
    usage = cert.key_usage_value
    return bool(cert.ca) and (usage is None or "key_cert_sign" in usage.native)


def anchor_certificate(signer: bytes, chain: Sequence[bytes], pool: Sequence[bytes],
                       gen_time: datetime) -> Anchor:
    """Tie ``signer`` to a certificate of ``chain`` (the trusted ``--chain``: like
    ``openssl -CAfile``, every certificate in it is trusted): walk up from the signer
    through issuers found in ``chain`` or ``pool`` (the token's certificates), checking each
    certificate's signature with its issuer's key, the issuer's basicConstraints cA (and
    keyCertSign) and its validity at the token's time. Anchored when a certificate of the
    path is in ``chain``. `Invalid` when a link does not verify."""
    from cryptography import x509 as cx509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

    trusted = set(chain)
    candidates = list(dict.fromkeys([*chain, *pool]))
    path: list[str] = []
    anchor: str | None = None
    current = signer
    seen: set[bytes] = set()
    while len(path) < MAX_PATH and current not in seen:
        seen.add(current)
        cert = _load_certificate(current, "the chain")
        path.append(name_text(cert.subject))
        if current in trusted and anchor is None:
            anchor = name_text(cert.subject)
        if cert.self_issued:
            issuer_der = current
        else:
            issuers = [d for d in candidates if d != current
                       and _load_certificate(d, "the chain").subject == cert.issuer]
            if not issuers:
                break
            issuer_der = issuers[0]
        issuer = _load_certificate(issuer_der, "the chain")
        try:
            cx509.load_der_x509_certificate(current).verify_directly_issued_by(
                cx509.load_der_x509_certificate(issuer_der))
        except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm) as e:
            if issuer_der == current:
                if anchor is not None:
                    break  # a trusted certificate need not verify itself (openssl neither)
                raise Invalid(f"the self-signed certificate {name_text(cert.subject)} "
                              f"does not verify: {e or 'bad signature'}") from None
            raise Invalid(f"the certificate {name_text(cert.subject)} does not verify with "
                          f"the key of its issuer {name_text(issuer.subject)}: "
                          f"{e or 'bad signature'}") from None
        if issuer_der == current:
            break
        if not _is_ca(issuer):
            raise Invalid(f"{name_text(issuer.subject)} issued "
                          f"{name_text(cert.subject)}, but is not a CA certificate")
        _valid_at(issuer, gen_time, "the issuer certificate")
        current = issuer_der
    return Anchor(tuple(path), anchor)


def _attribute(attributes: cms.CMSAttributes, name: str) -> list[Any]:
    """The values of the signed attribute ``name``; `Invalid` if it occurs more than once."""
    found = [a for a in attributes if a["type"].native == name]
    if len(found) > 1:
        raise Invalid(f"the signed attribute {name} occurs {len(found)} times")
    return list(found[0]["values"]) if found else []


def _find_signer(sid: cms.SignerIdentifier, candidates: Sequence[bytes]) -> bytes | None:
    for der in candidates:
        cert = _load_certificate(der, "the token")
        if sid.name == "issuer_and_serial_number":
            if (cert.issuer == sid.chosen["issuer"]
                    and cert.serial_number == sid.chosen["serial_number"].native):
                return der
        elif cert.key_identifier == sid.chosen.native:
            return der
    return None


def _check_signing_certificate(attributes: cms.CMSAttributes, signer_der: bytes,
                               signer: x509.Certificate) -> None:
    """signingCertificateV2 (RFC 5816; or the older signingCertificate, SHA-1) names exactly
    the signer certificate: its first ESSCertID's hash and, if given, issuer and serial."""
    v2 = _attribute(attributes, "signing_certificate_v2")
    v1 = _attribute(attributes, "signing_certificate")
    if not v2 and not v1:
        raise Invalid("the token has no signingCertificateV2 (or signingCertificate) "
                      "attribute (RFC 3161 §2.4.1, RFC 5816)")
    ids = (v2 or v1)[0]["certs"]
    if not len(ids):
        raise Invalid("the signingCertificate attribute names no certificate")
    first = ids[0]
    hash_name = first["hash_algorithm"]["algorithm"].native if v2 else "sha1"
    if hash_name not in hashlib.algorithms_available:
        raise Invalid(f"unsupported ESSCertIDv2 hash {hash_name}")
    if first["cert_hash"].native != hashlib.new(hash_name, signer_der).digest():
        raise Invalid(f"the {hash_name} in signingCertificate{'V2' if v2 else ''} is not the "
                      "signer certificate's: the token names another certificate")
    serial = first["issuer_serial"]
    if serial.native is not None:
        names = [n.chosen for n in serial["issuer"] if n.name == "directory_name"]
        if (serial["serial_number"].native != signer.serial_number
                or (names and names[0] != signer.issuer)):
            raise Invalid("the issuerSerial in signingCertificate is not the signer "
                          "certificate's")


def _check_imprint(fields: TokenFields, file: Path | None, digest: str | None) -> str | None:
    """What the imprint was compared with (None: nothing); `Invalid` on a mismatch."""
    algorithm, imprint = fields.hash_algorithm, fields.digest.hex()
    if file is not None:
        actual = file_digest(file, algorithm)
        if actual != imprint:
            raise Invalid(f"{algorithm} of {file} is {actual}, not the token's imprint {imprint}")
        return f"file {file}"
    if digest is not None:
        value = digest.strip().lower()
        if not re.fullmatch(r"[0-9a-f]+", value):
            raise Malformed("--digest must be hex digits")
        if len(value) != len(imprint):
            raise Invalid(f"the token's imprint is {algorithm} ({len(imprint)} hex digits); "
                          f"the digest given has {len(value)}")
        if value != imprint:
            raise Invalid(f"the token is for {algorithm} {imprint}, not {value}")
        return "the given digest"
    return None


def verify_token(data: bytes, *, chain_file: Path | None = None, file: Path | None = None,
                 digest: str | None = None) -> TokenResult:
    """Check an RFC 3161 response or token offline; raise a `VerifyError` unless it is valid.
    A result whose ``anchor`` is None (no ``--chain``) or has no anchor is valid in itself,
    but not tied to a TSA the caller trusts."""
    token_der, container = unwrap_token(data)
    try:
        parsed = parse_token(token_der)
    except TspError as e:
        raise Malformed(str(e)) from None
    _require_cryptography()
    chain = read_chain(chain_file) if chain_file is not None else []
    try:
        signed = cms.ContentInfo.load(token_der)["content"]
        infos = list(signed["signer_infos"])
    except ValueError as e:
        raise Malformed(f"not a time-stamp token: {e}") from None
    if len(infos) != 1:
        raise Invalid(f"the token has {len(infos)} signatures; RFC 3161 allows only the TSA's")
    info = infos[0]
    attributes = info["signed_attrs"]
    if isinstance(attributes, core.Void) or not len(attributes):
        raise Invalid("the token has no signed attributes (RFC 3161 §2.4.2 needs them)")
    try:
        content_type = _attribute(attributes, "content_type")
        message_digest = _attribute(attributes, "message_digest")
        digest_name = _hash_name(info["digest_algorithm"])
        signature = bytes(info["signature"].native)
        signature_algorithm = info["signature_algorithm"]
        algorithm_name = str(signature_algorithm["algorithm"].native)
        # The signature covers the DER SET OF, not the [0] IMPLICIT tag the SignerInfo uses.
        to_sign = bytes([0x31]) + bytes(attributes.dump())[1:]
        sid = info["sid"]
    except (ValueError, KeyError) as e:
        raise Malformed(f"the token's SignerInfo cannot be read: {e}") from None
    if [v.native for v in content_type] != ["tst_info"]:
        raise Invalid("the contentType attribute is not id-ct-TSTInfo")
    expected = hashlib.new(digest_name, parsed.tst_info).digest()
    if [v.native for v in message_digest] != [expected]:
        raise Invalid(f"the messageDigest attribute is not the {digest_name} of the TSTInfo: "
                      "the token's content was changed after it was signed")

    signer_der = _find_signer(sid, parsed.certificates)
    origin = "the token"
    if signer_der is None:
        signer_der = _find_signer(sid, chain)
        origin = f"--chain {chain_file}"
    if signer_der is None:
        if not parsed.certificates and chain_file is None:
            raise CannotCheck("the token holds no certificate (it was requested without "
                              "certReq, `openssl ts -query` without -cert): give the TSA's "
                              "certificate with --chain tsa.pem")
        where = "the token" + (f" or {chain_file}" if chain_file is not None else "")
        raise Invalid(f"the signer certificate is not in {where}: the token was signed by "
                      "another TSA, or --chain is another TSA's")
    signer = _load_certificate(signer_der, origin)
    verify_signature(signer_der, signature, to_sign, signature_algorithm, digest_name)
    _check_signing_certificate(attributes, signer_der, signer)
    fields = parsed.fields
    check_tsa_certificate(signer, fields.gen_time)
    if fields.tsa_name is not None and fields.tsa_name != signer.subject:
        raise Invalid(f"the token names the TSA {name_text(fields.tsa_name)}, but was "
                      f"signed by {name_text(signer.subject)}")
    anchor = None
    if chain_file is not None:
        anchor = anchor_certificate(signer_der, chain, parsed.certificates, fields.gen_time)
        if anchor.anchor is None:
            raise Invalid(f"the signer certificate ({name_text(signer.subject)}) does not "
                          f"chain to a certificate in {chain_file}: the token is another "
                          "TSA's, or --chain is")
    checked = _check_imprint(fields, file, digest)
    return TokenResult(
        container=container, fields=fields, signature_algorithm=algorithm_name,
        signer=name_text(signer.subject),
        signer_sha256=hashlib.sha256(signer_der).hexdigest(), certificate_origin=origin,
        anchor=anchor, checked=checked)


def _digests_contain(repo: pygit2.Repository, commit: str, line: bytes) -> bool:
    obj = repo[commit]
    assert isinstance(obj, pygit2.Commit)
    data = read_blob(repo, obj.tree, "digests.log")
    if data is None:
        return False
    return data.startswith(line + b"\n") or b"\n" + line + b"\n" in data


def find_in_log(target: str, algorithm: str, digest: str) -> LogResult | None:
    """The first main commit of the log ``target`` (a clone or its URL, as for `stampd audit`)
    whose ``digests.log`` holds ``<algorithm> <digest>``; None if none does.

    The log is audited as `stampd audit` does (every main commit signed by the log's key,
    peer stamps verified); a failure about the commit found or any main commit before it
    makes the publication unproven (`Invalid`); failures elsewhere are only counted."""
    line = f"{algorithm} {digest}".encode()
    try:
        with local_copy(target) as path:
            report = audit(path, target=target)
            repo = open_repository(path)
            index = next((i for i, e in enumerate(report.log)
                          if _digests_contain(repo, e.commit, line)), None)
    except EmptyLog:
        raise NotLogged(f"{algorithm} {digest}: the log {target} has no commit yet "
                        f"({COMMIT_SCHEDULE}); fetch the log again after that") from None
    except TargetError as e:
        if URL.match(target):
            raise CannotCheck(f"the log: {e.message}") from None
        raise Malformed(f"--log: {e.message}") from None
    except AuditError as e:
        raise CannotCheck(f"the log {target}: {e.message}") from None
    if index is None:
        if report.failures:
            print(f"note: the log has {len(report.failures)} problem(s); run `stampd audit "
                  f"{target}`", file=sys.stderr)
        head = report.log[-1] if report.log else None
        newest = (f"its newest commit {head.commit[:12]} was made at {iso(head.time)}"
                  if head else "it has no commits")
        raise NotLogged(f"{algorithm} {digest} is in no digests.log of {target} ({newest}); "
                        "a token reaches the log with the next log commit: fetch the log "
                        "again later")
    entry = report.log[index]
    before = {e.commit for e in report.log[:index + 1]}
    bad = [f for f in report.failures
           if f.commit == entry.commit or (f.check == MAIN_CHECK and f.commit in before)]
    if bad:
        raise Invalid(f"log commit {entry.commit} holds the imprint, but the log does not "
                      f"verify up to it: {bad[0]}" + (f" (and {len(bad) - 1} more)"
                                                      if len(bad) > 1 else ""))
    return LogResult(target=target, commit=entry.commit, number=entry.number, time=entry.time,
                     fingerprint=report.fingerprint, stamp=entry.stamp,
                     problems=len(report.failures))
