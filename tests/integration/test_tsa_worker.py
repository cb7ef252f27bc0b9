"""RFC 3161 on the worker side, with real gpg-agents and ssh-agents: the start-up check makes
the TSA key's self-signed certificate (`workers.tsa.ensure_certificate` through
`workers.worker.check_key`), a real `OpenPgpSigner` or `SshSigner` answers timestamp jobs, and
``openssl ts -verify`` accepts the tokens."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from formats import sexp
from formats.jobs import TimestampJob
from formats.keys import KeySpec
from formats.tsp.algorithms import ecdsa_signature
from formats.tsp.response import granted
from formats.tsp.token import parse_token
from keystore.keyset import TSA_CHAIN_FILE, ensure_extra_keys, key_dir
from tests.helpers import agent_home
from workers import tsa
from workers.agents.gpg import GpgAgent
from workers.agents.ssh import SshAgent
from workers.config import DispatchConfig, WorkerConfig
from workers.loop import sign, sign_many
from workers.signer import OpenPgpSigner, SshSigner
from workers.worker import check_key, load_signer

SUBJECT = "stampd TSA at http://127.0.0.1:8080/"
POLICY = "1.2.3.4.1"


@pytest.fixture
def home() -> Iterator[Path]:
    """A short private home for the agents; no agent may outlive the test."""
    with agent_home("ts") as path:
        yield path


def _key(keys: Path, algo: str, fmt: str = "openpgp") -> tuple[Path, str]:
    spec = KeySpec(fmt, algo)
    ensure_extra_keys(keys, [spec], "stampd test <t@stampd.invalid>", None)
    return key_dir(keys, spec), spec.id


def _config(home: Path, directory: Path, key_id: str, subject: str | None = SUBJECT
            ) -> WorkerConfig:
    fmt = "ssh" if key_id.startswith("ssh-") else "openpgp"
    return WorkerConfig("check:1:0", home, directory,
                        DispatchConfig("socket", socket=home / "unused.sock"), key_id=key_id,
                        format=fmt, tsa_subject=subject, tsa_days=30)


def _openssl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize(("fmt", "algo"), [("openpgp", "nistp256"), ("openpgp", "rsa3072"),
                                          ("ssh", "ecdsa-p256")])
def test_tsa_key_certificate_and_tokens(tmp_path: Path, home: Path, fmt: str, algo: str) -> None:
    directory, key_id = _key(tmp_path / "keys", algo, fmt)
    chain_file = directory / TSA_CHAIN_FILE
    started = time.monotonic()
    check_key(_config(home, directory, key_id))
    made = chain_file.read_bytes()
    check_key(_config(home, directory, key_id, "another name"))
    assert chain_file.read_bytes() == made, "an existing chain is kept"
    checks = time.monotonic() - started

    text = _openssl("x509", "-in", str(chain_file), "-noout", "-text")
    assert text.returncode == 0, text.stderr
    assert "X509v3 Extended Key Usage: critical" in text.stdout
    assert "Time Stamping" in text.stdout
    assert "CA:FALSE" in text.stdout
    cert = x509.load_pem_x509_certificate(made)
    cert.verify_directly_issued_by(cert)
    assert cert.subject.rfc4514_string() == f"CN={SUBJECT},O=stampd"

    agent = SshAgent(home) if fmt == "ssh" else GpgAgent(home)
    agent.start()
    try:
        signer, _fingerprint = load_signer(agent, _config(home, directory, key_id))
        assert isinstance(signer, SshSigner if fmt == "ssh" else OpenPgpSigner)
        assert signer.chain == tsa.read_chain(directory)
        # The agent's public key (READKEY; the SSH public key) is the certificate's.
        spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
        assert signer.tsa_key().public_key_info == spki
        if isinstance(signer, OpenPgpSigner):
            assert sexp.public_key(signer.conn.read_key(signer.key.keygrip)) == spki

        digest = hashlib.sha256(b"some data\n").hexdigest()
        for n, cert_req in enumerate((True, False)):
            job = TimestampJob("sha256", digest, 1000 + n, int(time.time()), POLICY,
                               accuracy=1, nonce=str((1 << 70) + n), cert_req=cert_req)
            result = sign(signer, 5, job.to_dict())
            assert result.error is None and result.object is not None
            token = base64.b64decode(result.object)
            parsed = parse_token(token)
            assert parsed.fields.nonce == (1 << 70) + n and parsed.fields.serial == 1000 + n
            assert len(parsed.certificates) == (1 if cert_req else 0)
            response = tmp_path / f"r{n}.tsr"
            response.write_bytes(granted(token))
            untrusted = [] if cert_req else ["-untrusted", str(chain_file)]
            verified = _openssl("ts", "-verify", "-digest", digest, "-in", str(response),
                                "-CAfile", str(chain_file), *untrusted)
            assert verified.returncode == 0, verified.stdout + verified.stderr
            assert "Verification: OK" in verified.stdout
            if not cert_req:  # without the certificate openssl cannot find the signer
                alone = _openssl("ts", "-verify", "-digest", digest, "-in", str(response),
                                 "-CAfile", str(chain_file))
                assert alone.returncode != 0

        # Several jobs arriving together are signed in one agent round trip; a malformed one
        # among them is refused alone.
        batch = [TimestampJob("sha256", digest, 2000 + n, int(time.time()), POLICY,
                              accuracy=1, nonce=str(n), cert_req=bool(n % 2)).to_dict()
                 for n in range(4)]
        batch.insert(2, {**batch[0], "digest": "00"})
        results = sign_many(signer, [{**job, "id": 10 + n} for n, job in enumerate(batch)])
        assert [r.id for r in results] == [10, 11, 12, 13, 14]
        assert results[2].object is None and "malformed job" in str(results[2].error)
        for n, result in enumerate(r for i, r in enumerate(results) if i != 2):
            assert result.error is None and result.object is not None
            token = base64.b64decode(result.object)
            assert parse_token(token).fields.serial == 2000 + n
            response = tmp_path / f"b{n}.tsr"
            response.write_bytes(granted(token))
            verified = _openssl("ts", "-verify", "-digest", digest, "-in", str(response),
                                "-CAfile", str(chain_file), "-untrusted", str(chain_file))
            assert "Verification: OK" in verified.stdout, verified.stdout + verified.stderr

        # Without a chain the signer refuses timestamp jobs.
        bare = SshSigner.__new__(SshSigner) if fmt == "ssh" else \
            OpenPgpSigner.__new__(OpenPgpSigner)
        refused = sign(bare, 6, job.to_dict())
        assert refused.object is None and "this key has no TSA certificate" in str(refused.error)
    finally:
        agent.stop()
    print(f"{fmt}:{algo}: two start-up checks in {checks:.2f}s")


def test_a_chain_of_another_key_stops_the_check(tmp_path: Path, home: Path) -> None:
    mine, mine_id = _key(tmp_path / "a", "nistp256")
    other, other_id = _key(tmp_path / "b", "nistp256")
    check_key(_config(home, other, other_id))
    shutil.copy(other / TSA_CHAIN_FILE, mine / TSA_CHAIN_FILE)
    with pytest.raises(tsa.TsaError) as caught:
        check_key(_config(home, mine, mine_id))
    assert str(mine / TSA_CHAIN_FILE) in caught.value.message
    assert "is for another key" in caught.value.message

    # A worker of that key does not start with it either.
    agent = GpgAgent(home)
    agent.start()
    try:
        with pytest.raises(tsa.TsaError, match="is for another key"):
            load_signer(agent, _config(home, mine, mine_id))
    finally:
        agent.stop()


@pytest.mark.parametrize("curve", ["p256", "p384"])
def test_ssh_agent_signatures_become_der_ecdsa(tmp_path: Path, home: Path, curve: str) -> None:
    """ssh-agent hashes what it signs (SHA-256 for P-256, SHA-384 for P-384) and answers an
    SSH signature blob; the TSA key turns its (r, s) into the DER ECDSA-Sig-Value that X.509
    and CMS carry, which `cryptography` verifies with the key of the ssh public key file."""
    directory, _key_id = _key(tmp_path / "keys", f"ecdsa-{curve}", "ssh")
    public = serialization.load_ssh_public_key((directory / "id.pub").read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    agent = SshAgent(home)
    agent.start()
    try:
        with agent.connect() as conn:
            key = tsa.ssh_agent_key(agent.add_key(directory / "id"), conn)
            assert key.public_key_info == public.public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            digest = hashes.SHA256() if curve == "p256" else hashes.SHA384()
            assert key.algorithm == f"{digest.name}_ecdsa"
            data = b"\x31\x05signed attributes" * 20
            signatures = {key.signature(data) for _ in range(2)}
            assert len(signatures) == 2  # ECDSA: a fresh nonce each time
            for der in signatures:
                assert der == ecdsa_signature(*utils.decode_dss_signature(der))
                public.verify(der, data, ec.ECDSA(digest))
                with pytest.raises(InvalidSignature):
                    public.verify(der, data + b"!", ec.ECDSA(digest))
    finally:
        agent.stop()


@pytest.mark.parametrize("fmt", ["openpgp", "ssh"])
def test_an_ed25519_key_cannot_be_the_tsa_key(tmp_path: Path, home: Path, fmt: str) -> None:
    directory, key_id = _key(tmp_path / "keys", "ed25519", fmt)
    with pytest.raises(tsa.TsaError, match="cannot be a TSA key"):
        check_key(_config(home, directory, key_id))
    assert not (directory / TSA_CHAIN_FILE).exists()
    check_key(_config(home, directory, key_id, subject=None))  # as a plain key it signs
