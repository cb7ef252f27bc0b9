"""RFC 3161 against a real server with one more independent client: pyHanko signs PDFs.

pyHanko asks our TSA for the signature timestamp of a PDF signature and for a PAdES document
timestamp, then validates both with its own validator, trusting the chain from `GET /tsa.pem`.
Nothing leaves loopback: the validation contexts do not fetch, and every socket connection made
in these tests is checked to be to 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import socket
import sqlite3
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from asn1crypto import keys as asn1_keys
from asn1crypto import tsp
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.helpers import Server, seed_data_dir, start_server

# pyHanko is imported where it is used, not here: every test process collects this module
# (pyhanko.sign and its validator cost ~0.35 s of CPU to import), few run its tests.
if TYPE_CHECKING:
    from pyhanko_certvalidator import ValidationContext

pytestmark = pytest.mark.slow

POLICY = "2.25.178387009458913539541377305212843591845"  # stampd's default TSA policy
CLOCK_SLACK = dt.timedelta(seconds=120)


@pytest.fixture(scope="module")
def tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(seed_data_dir(tmp_path_factory.mktemp("tsa-pyhanko") / "data"),
                          workers=1, extra_env={"STAMPD_TSA": "true"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tsa_cert(tsa: Server) -> asn1_x509.Certificate:
    with urllib.request.urlopen(tsa.url + "tsa.pem", timeout=10) as r:
        pem = r.read()
    return asn1_x509.Certificate.load(
        x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER))


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse (and record) any socket connection that is not to a loopback address, so that an
    OCSP, CRL or AIA fetch by pyHanko would fail the test instead of leaving the machine."""
    seen: list[str] = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: Any) -> None:
        if isinstance(address, tuple):
            host = str(address[0])
            seen.append(host)
            if not ipaddress.ip_address(host.split("%")[0]).is_loopback:
                raise AssertionError(f"connection to a non-loopback host: {address!r}")

    def guarded(self: socket.socket, address: Any) -> None:
        check(address)
        connect(self, address)

    def guarded_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_ex)
    yield seen


class Signer:
    """A throwaway ECDSA P-256 signer with a self-signed certificate (its own trust root)."""

    def __init__(self) -> None:
        from pyhanko.sign import signers
        from pyhanko_certvalidator.registry import SimpleCertificateStore

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pyHanko test signer")])
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(hours=1))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=True, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        self.cert = asn1_x509.Certificate.load(cert.public_bytes(serialization.Encoding.DER))
        self.pyhanko = signers.SimpleSigner(
            signing_cert=self.cert,
            signing_key=asn1_keys.PrivateKeyInfo.load(key.private_bytes(
                serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption())),
            cert_registry=SimpleCertificateStore.from_certs([self.cert]))


def context(*roots: asn1_x509.Certificate) -> ValidationContext:
    """Trust exactly ``roots``; never fetch; no revocation information is required."""
    from pyhanko_certvalidator import ValidationContext

    return ValidationContext(trust_roots=list(roots), allow_fetching=False,
                             revocation_mode="soft-fail")


def blank_pdf() -> bytes:
    from pyhanko.pdf_utils import generic
    from pyhanko.pdf_utils.writer import PdfFileWriter

    w = PdfFileWriter()
    w.insert_page(generic.DictionaryObject({
        generic.pdf_name("/Type"): generic.pdf_name("/Page"),
        generic.pdf_name("/MediaBox"): generic.ArrayObject(
            [generic.NumberObject(n) for n in (0, 0, 595, 842)]),
        generic.pdf_name("/Resources"): generic.DictionaryObject(),
    }))
    out = io.BytesIO()
    w.write(out)
    return out.getvalue()


def signed_pdf(tsa: Server, signer: Signer, path: str = "") -> bytes:
    from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
    from pyhanko.sign import signers
    from pyhanko.sign.fields import SigSeedSubFilter
    from pyhanko.sign.timestamps import HTTPTimeStamper

    out = signers.sign_pdf(
        IncrementalPdfFileWriter(io.BytesIO(blank_pdf())),
        signers.PdfSignatureMetadata(field_name="Signature1", subfilter=SigSeedSubFilter.PADES,
                                     md_algorithm="sha256"),
        signer=signer.pyhanko, timestamper=HTTPTimeStamper(tsa.url + path))
    return out.getvalue()


def document_timestamped_pdf(tsa: Server) -> bytes:
    from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
    from pyhanko.sign import signers
    from pyhanko.sign.timestamps import HTTPTimeStamper

    out = signers.PdfTimeStamper(HTTPTimeStamper(tsa.url + "tsr")).timestamp_pdf(
        IncrementalPdfFileWriter(io.BytesIO(blank_pdf())), md_algorithm="sha256")
    return out.getvalue()


def embedded(pdf: bytes) -> Any:
    from pyhanko.pdf_utils.reader import PdfFileReader

    (sig,) = PdfFileReader(io.BytesIO(pdf)).embedded_signatures
    return sig


def assert_issued_by(tsa: Server, tst_info: tsp.TSTInfo, when: dt.datetime) -> None:
    """The token is one of ours: our policy, a journal row for its serial number holding its
    imprint and its time, and that time is the server's clock now (loosely)."""
    assert tst_info["policy"].dotted == POLICY
    gen_time = tst_info["gen_time"].native
    assert when == gen_time
    assert abs(dt.datetime.now(dt.UTC) - gen_time) < CLOCK_SLACK
    imprint = tst_info["message_imprint"]
    with sqlite3.connect(tsa.data_dir / "stampd.sqlite3") as db:
        row = db.execute("select kind, algorithm, digest, stamped_at from stamps where id = ?",
                         (tst_info["serial_number"].native,)).fetchone()
    assert row == ("tsa", imprint["hash_algorithm"]["algorithm"].native,
                   imprint["hashed_message"].native.hex(), int(gen_time.timestamp()))


def signature_tst_info(sig: Any) -> tsp.TSTInfo:
    (token,) = [a["values"][0] for a in sig.signer_info["unsigned_attrs"]
                if a["type"].native == "signature_time_stamp_token"]
    return token["content"]["encap_content_info"]["content"].parsed


@pytest.mark.parametrize("path", ["", "tsr"])
def test_a_pdf_signature_with_our_signature_timestamp_validates(
        tsa: Server, tsa_cert: asn1_x509.Certificate, loopback_only: list[str],
        path: str) -> None:
    from pyhanko.sign.validation import validate_pdf_signature
    from pyhanko.sign.validation.status import SignatureCoverageLevel

    signer = Signer()
    sig = embedded(signed_pdf(tsa, signer, path))
    status = validate_pdf_signature(sig, signer_validation_context=context(signer.cert),
                                    ts_validation_context=context(tsa_cert))
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()
    assert status.coverage == SignatureCoverageLevel.ENTIRE_FILE
    ts = status.timestamp_validity
    assert ts is not None, "pyHanko found no signature timestamp"
    assert ts.intact and ts.valid and ts.trusted, status.pretty_print_details()
    assert ts.signing_cert.sha256 == tsa_cert.sha256
    assert status.bottom_line, status.pretty_print_details()
    assert_issued_by(tsa, signature_tst_info(sig), ts.timestamp)
    assert loopback_only and set(loopback_only) == {"127.0.0.1"}


def test_a_pades_document_timestamp_validates(tsa: Server,
                                              tsa_cert: asn1_x509.Certificate) -> None:
    from pyhanko.sign.validation import validate_pdf_timestamp
    from pyhanko.sign.validation.status import SignatureCoverageLevel

    sig = embedded(document_timestamped_pdf(tsa))
    status = validate_pdf_timestamp(sig, validation_context=context(tsa_cert))
    assert status.intact and status.valid and status.trusted, status.summary()
    assert status.coverage == SignatureCoverageLevel.ENTIRE_FILE
    assert status.signing_cert.sha256 == tsa_cert.sha256
    assert_issued_by(tsa, sig.signed_data["encap_content_info"]["content"].parsed,
                     status.timestamp)


def test_timestamps_are_untrusted_without_our_certificate(tsa: Server) -> None:
    """The same validation, but trusting only the signer: the timestamps are sound but
    untrusted, and the signature's bottom line fails."""
    from pyhanko.sign.validation import validate_pdf_signature, validate_pdf_timestamp

    signer = Signer()
    sig = embedded(signed_pdf(tsa, signer))
    status = validate_pdf_signature(sig, signer_validation_context=context(signer.cert),
                                    ts_validation_context=context(signer.cert))
    assert status.intact and status.valid and status.trusted
    ts = status.timestamp_validity
    assert ts is not None and ts.intact and ts.valid
    assert not ts.trusted
    assert not status.bottom_line
    doc = validate_pdf_timestamp(embedded(document_timestamped_pdf(tsa)),
                                 validation_context=context(signer.cert))
    assert doc.intact and doc.valid and not doc.trusted


def test_a_changed_document_breaks_the_document_timestamp(
        tsa: Server, tsa_cert: asn1_x509.Certificate) -> None:
    from pyhanko.sign.validation import validate_pdf_timestamp

    pdf = document_timestamped_pdf(tsa)
    changed = pdf.replace(b"/MediaBox [ 0 0 595 842 ]", b"/MediaBox [ 0 0 595 843 ]", 1)
    assert changed != pdf
    status = validate_pdf_timestamp(embedded(changed), validation_context=context(tsa_cert))
    assert not status.intact and not status.trusted
