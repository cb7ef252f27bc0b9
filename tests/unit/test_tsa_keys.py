"""A TSA key's public key from gpg-agent's READKEY answer (`formats.sexp.public_key`),
and the parts of `workers.tsa` that need no agent: which keys may be TSA keys, the chain file,
self-signed certificates, imported chains and tokens, signed here with software keys."""

from __future__ import annotations

import base64
import re
import stat
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from asn1crypto import algos
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa, utils

from formats import openpgp, sexp
from formats.jobs import TimestampJob
from formats.keys import KeySpec
from formats.tsp.certificates import certificate, tbs_certificate
from formats.tsp.certificates import pem as armor
from formats.tsp.token import parse_token
from keystore.keyset import TSA_CHAIN_FILE
from workers import tsa
from workers.config import ConfigError, DispatchConfig, PoolConfig, WorkerConfig

# READKEY answers of a real gpg-agent (GnuPG 2.2.40, libgcrypt 1.10.1) for keys made with
# `gpg --quick-gen-key UID nistp256|nistp384|rsa2048`.
READKEY_NISTP256 = bytes.fromhex(
    "2831303a7075626c69632d6b657928333a65636328353a637572766531303a4e49535420502d3235362928313a71"
    "36353a0446e3b5d22da7fc042c4deae9c0b77418209b55ba83326df594f9dcb2209c7ebb7747170542fed1815770"
    "3ac3ac689bf1f7ba0b489cdd41dd9fe82e5699770137292929"
)
READKEY_NISTP384 = bytes.fromhex(
    "2831303a7075626c69632d6b657928333a65636328353a637572766531303a4e49535420502d3338342928313a71"
    "39373a04a5696b3ce418f0b2b0e6d16fbea772b5042503bb192ff2e51af0e18a4694264f4737d45588e9c86dab94"
    "5e8d9b1806b01e03a6730f1057da142f3ebdebbfaf6ff70c26dbbb90eeba8f4475942d96484fee4f0192c499d4e3"
    "3e5f06eec4001fd6292929"
)
READKEY_RSA2048 = bytes.fromhex(
    "2831303a7075626c69632d6b657928333a72736128313a6e3235373a00aef59339c1a02304d628bdcf51067cc1be"
    "a154b34b939a589910e3373b69f22cf3fbb54f6498b6c45809802fa5f40bd65b47d81dfec406d3eda3ad23e54986"
    "5b55c1b80bd84526407ccb8e0b7135279b215021ffdd69239ff1acdb9f56ed236c8b4926ec42db2604b914d1dea4"
    "6b8d3aa2d15f2300b231cf4dd55750863bbfcf62666ace29287c1af39c7673761f450fa3739bd9d227f68c8fa24e"
    "991efe92a39039c6fc256f98f22bc5d9e180d1c628f5006a70559ae8d41064a8f7dcf5e10a4b97b7aa0878a9906d"
    "0b62cdf65f71e9b2175dfe536ddec370ea3226bc135600db1f272a5732a2779bbfa1d3ff9fffc1636687ee4650c9"
    "ebfee1fc07dfd402b12928313a65333a010001292929"
)


@pytest.mark.parametrize(("answer", "curve"), [(READKEY_NISTP256, ec.SECP256R1),
                                                (READKEY_NISTP384, ec.SECP384R1)])
def test_ecdsa_public_keys(answer: bytes, curve: type[ec.EllipticCurve]) -> None:
    point = sexp.parse_canonical_sexp(answer)[1][2][1]  # type: ignore[index]
    for spelling in (answer, answer.replace(b"10:NIST P-", b"8:nistp")):
        key = serialization.load_der_public_key(sexp.public_key(spelling))
        assert isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, curve)
        assert key.public_bytes(serialization.Encoding.X962,
                                serialization.PublicFormat.UncompressedPoint) == point


def test_rsa_public_keys() -> None:
    key = serialization.load_der_public_key(sexp.public_key(READKEY_RSA2048))
    assert isinstance(key, rsa.RSAPublicKey)
    assert key.key_size == 2048 and key.public_numbers().e == 65537


@pytest.mark.parametrize(("answer", "why"), [
    (b"(10:public-key(3:ecc(5:curve7:Ed25519)(5:flags5:eddsa)(1:q33:@" + b"\1" * 32 + b")))",
     "unsupported curve 'Ed25519'"),
    (READKEY_NISTP256.replace(b"NIST P-256", b"NIST P-384"), "not an uncompressed secp384r1"),
    (b"(10:public-key(3:dsa(1:p1:\x01)))", "unsupported public-key algorithm 'dsa'"),
    (b"(7:sig-val(3:rsa(1:s1:\x01)))", "not a public-key"),
    (b"(10:public-key(3:rsa(1:n1:\x05)))", "lacks the parameter 'e'"),
    (READKEY_RSA2048[:-3], "truncated"),
])
def test_unusable_public_keys(answer: bytes, why: str) -> None:
    with pytest.raises(sexp.SexpError, match=why):
        sexp.public_key(answer)


def _info(algo: int, bits: int, curve: str | None) -> openpgp.KeyInfo:
    return openpgp.KeyInfo("A" * 40, "B" * 40, algo, bits, curve, "T <t@x>")


def test_which_keys_may_be_tsa_keys() -> None:
    assert tsa.signature_algorithm_for(_info(openpgp.PK_ECDSA, 256, "nistp256")) == "sha256_ecdsa"
    assert tsa.signature_algorithm_for(_info(openpgp.PK_ECDSA, 384, "nistp384")) == "sha384_ecdsa"
    assert tsa.signature_algorithm_for(_info(openpgp.PK_RSA, 3072, None)) == "sha256_rsa"
    for info in (_info(openpgp.PK_EDDSA, 255, "ed25519"), _info(openpgp.PK_RSA, 1024, None),
                 _info(openpgp.PK_ECDSA, 256, "brainpoolP256r1"),
                 _info(openpgp.PK_DSA, 2048, None)):
        with pytest.raises(tsa.TsaError, match="TSA key is ECDSA on NIST P-256 or P-384, or RSA"):
            tsa.signature_algorithm_for(info)


# -- software keys standing in for the agent ---------------------------------------------------

_HASHES = {openpgp.H_SHA256: hashes.SHA256(), openpgp.H_SHA384: hashes.SHA384()}


def _software_key(kind: str) -> tuple[tsa.TsaKey, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey]:
    private: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    if kind == "rsa3072":
        private = rsa.generate_private_key(65537, 3072)
        info = _info(openpgp.PK_RSA, 3072, None)
    else:
        private = ec.generate_private_key(ec.SECP256R1() if kind == "nistp256" else ec.SECP384R1())
        info = _info(openpgp.PK_ECDSA, int(kind[-3:]), kind)

    def sign(algo: int, digest: bytes) -> Sequence[int]:  # what gpg-agent's PKSIGN answers
        prehashed = utils.Prehashed(_HASHES[algo])
        if isinstance(private, rsa.RSAPrivateKey):
            return [int.from_bytes(private.sign(digest, padding.PKCS1v15(), prehashed), "big")]
        der = private.sign(digest, ec.ECDSA(prehashed))
        values = algos.DSASignature.load(der).native
        return [values["r"], values["s"]]

    spki = private.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    return tsa.openpgp_key(info, spki, sign), private


@pytest.mark.parametrize("kind", ["nistp256", "nistp384", "rsa3072"])
def test_self_signed_certificate_and_token(tmp_path: Path, kind: str) -> None:
    key, _private = _software_key(kind)
    assert tsa.ensure_certificate(tmp_path, key, "stampd TSA at http://h/", 30,
                                  clock=lambda: 1_795_400_000.5)
    path = tmp_path / TSA_CHAIN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    before = path.read_bytes()
    assert not tsa.ensure_certificate(tmp_path, key, "another name", 30)
    assert path.read_bytes() == before

    cert = x509.load_pem_x509_certificate(before)
    cert.verify_directly_issued_by(cert)  # self-signed, and the signature holds
    assert cert.subject.rfc4514_string() == "CN=stampd TSA at http://h/,O=stampd"
    assert cert.serial_number >= 1 << 64
    assert int(cert.not_valid_before_utc.timestamp()) == 1_795_400_000 - 3600
    assert int(cert.not_valid_after_utc.timestamp()) == 1_795_400_000 + 30 * 86400
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert eku.critical and list(eku.value) == [x509.ExtendedKeyUsageOID.TIME_STAMPING]

    chain = tsa.read_chain(tmp_path)
    assert chain is not None
    assert tsa.check_import(key.public_key_info, before) == chain
    job = TimestampJob("sha256", "11" * 32, 7, 1_795_400_001, "1.2.3.4", accuracy=1,
                       nonce=str(1 << 100), cert_req=True)
    token = tsa.build_token(job, key, chain)
    parsed = parse_token(token)
    assert parsed.certificates == chain and parsed.fields.nonce == 1 << 100
    assert parsed.fields.tsa_name == asn1_x509.Certificate.load(chain[0]).subject
    assert base64.b64decode(base64.b64encode(token)) == token


def test_a_chain_of_another_key_is_refused(tmp_path: Path) -> None:
    key, _ = _software_key("nistp256")
    other, _ = _software_key("nistp256")
    tsa.ensure_certificate(tmp_path, other, "other", 30)
    named = re.escape(f"{tmp_path / 'tsa-chain.pem'} is for another key")
    with pytest.raises(tsa.TsaError, match=named):
        tsa.ensure_certificate(tmp_path, key, "mine", 30)
    chain_pem = (tmp_path / TSA_CHAIN_FILE).read_bytes()
    with pytest.raises(tsa.TsaError, match="not for this key"):
        tsa.check_import(key.public_key_info, chain_pem)
    (tmp_path / TSA_CHAIN_FILE).write_text("garbage\n")
    with pytest.raises(tsa.TsaError, match=r"tsa-chain\.pem: not PEM certificates"):
        tsa.read_chain(tmp_path)


def test_imported_chains_must_be_tsa_chains(tmp_path: Path) -> None:
    key, _ = _software_key("nistp256")
    ca, _ = _software_key("nistp256")
    ca_info = {"common_name": "CA"}
    ca_tbs = tbs_certificate(ca.public_key_info, ca_info, serial=1, not_before=_t(0),
                             not_after=_t(10), signature_algorithm="sha256_ecdsa", is_ca=True)
    ca_cert = certificate(ca_tbs, "sha256_ecdsa", ca.signature(ca_tbs))

    def issued(time_stamping: bool, issuer: dict[str, str]) -> bytes:
        tbs = tbs_certificate(key.public_key_info, {"common_name": "TSA"}, serial=2,
                              not_before=_t(0), not_after=_t(10),
                              signature_algorithm="sha256_ecdsa", issuer=issuer,
                              issuer_public_key_info=ca.public_key_info,
                              time_stamping=time_stamping)
        return certificate(tbs, "sha256_ecdsa", ca.signature(tbs))

    def pem(*certs: bytes) -> bytes:
        return "".join(armor(c, "CERTIFICATE") for c in certs).encode()

    good = issued(True, ca_info)
    def now() -> float:
        return _t(5).timestamp()

    assert tsa.check_import(key.public_key_info, pem(good, ca_cert), now) == [good, ca_cert]
    with pytest.raises(tsa.TsaError, match="extended key usage must be timeStamping"):
        tsa.check_import(key.public_key_info, pem(issued(False, ca_info)), now)
    with pytest.raises(tsa.TsaError, match="certificate 2 of the chain is not the issuer"):
        tsa.check_import(key.public_key_info, pem(issued(True, {"common_name": "X"}), ca_cert),
                         now)
    with pytest.raises(tsa.TsaError, match="not valid now"):
        tsa.check_import(key.public_key_info, pem(good), lambda: _t(11).timestamp())
    tsa.write_chain(tmp_path, [good, ca_cert])
    assert tsa.read_chain(tmp_path) == [good, ca_cert]
    request = x509.load_der_x509_csr(tsa.csr(key, "stampd TSA"))
    assert request.is_signature_valid
    assert request.subject.rfc4514_string() == "CN=stampd TSA,O=stampd"


def _t(days: int) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=days)


def test_the_pool_tells_the_tsa_key_its_subject(tmp_path: Path) -> None:
    tsa_key, other = KeySpec("openpgp", "nistp256"), KeySpec("ssh", "ed25519")
    dispatch = DispatchConfig("socket", socket=tmp_path / "s")
    pool = PoolConfig(1, tmp_path / "keys", tmp_path / "run", dispatch, (other, tsa_key),
                      tsa_key=tsa_key, tsa_subject="stampd TSA", tsa_days=7)
    assert PoolConfig.from_json(pool.to_json()) == pool
    worker = pool.worker_config("w", tmp_path / "h", tsa_key)
    assert (worker.tsa_subject, worker.tsa_days, worker.key_dir.name) == ("stampd TSA", 7,
                                                                           "openpgp-nistp256")
    assert WorkerConfig.from_json(worker.to_json()) == worker
    assert pool.worker_config("w", tmp_path / "h", other).tsa_subject is None
    assert pool.worker_config("w", tmp_path / "h").tsa_subject is None
    with pytest.raises(ConfigError, match="one of the extra keys"):
        PoolConfig(1, tmp_path, tmp_path, dispatch, (other,), tsa_key=tsa_key, tsa_subject="x")
    with pytest.raises(ConfigError, match="subject"):
        PoolConfig(1, tmp_path, tmp_path, dispatch, (tsa_key,), tsa_key=tsa_key)
    ssh_tsa = KeySpec("ssh", "ecdsa-p256")  # an SSH key may be the TSA key too
    pool = PoolConfig(1, tmp_path, tmp_path, dispatch, (ssh_tsa,), tsa_key=ssh_tsa,
                      tsa_subject="stampd TSA")
    worker = pool.worker_config("w", tmp_path / "h", ssh_tsa)
    assert (worker.format, worker.tsa_subject) == ("ssh", "stampd TSA")
    assert WorkerConfig.from_json(worker.to_json()) == worker


def test_which_settings_name_a_tsa_key() -> None:
    from server.settings import Settings

    assert Settings(tsa=True).tsa_spec == KeySpec("openpgp", "nistp256")  # as deployed so far
    for name in ("ssh:ecdsa-p256", "ssh:ecdsa-p384", "openpgp:rsa3072"):
        settings = Settings(tsa=True, tsa_key=name)
        spec = settings.tsa_spec
        assert spec is not None and f"{spec.format}:{spec.algo}" == name
        assert spec in settings.extra_key_specs  # the TSA key is one more served key
    for name in ("ssh:ed25519", "ssh:ecdsa-p521", "ssh:rsa", "openpgp:ed25519"):
        with pytest.raises(ValueError, match=r"tsa_key must be one of .*ssh:ecdsa-p256"):
            Settings(tsa=True, tsa_key=name)
