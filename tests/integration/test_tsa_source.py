"""Where a server finds its TSA chain: the key's chain file, or the chain a worker host
registered in the database (API hosts have no key files). A real migrated SQLite database; an
injected clock instead of waiting."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from sqlalchemy.orm import Session

from formats.keys import ServedKey
from keystore.keyset import TSA_CHAIN_FILE
from server import db
from server.errors import KeyRegistryError
from server.models import SigningKey
from server.signing_keys import register_certificates, registered_certificates
from server.stamping.rfc3161 import RETRY_EVERY, TsaSource
from tests.helpers import migrated_sqlite

KEY_ID = "openpgp-nistp256"


def chain_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test TSA")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = db.make_engine(migrated_sqlite(tmp_path / "stampd.sqlite3"))
    yield engine
    engine.dispose()


def served() -> list[ServedKey]:
    return [ServedKey(KEY_ID, "openpgp", "A" * 40, "nistp256", "public", "TSA <t@localhost>")]


def source(keys_dir: Path, engine, clock: Clock) -> TsaSource:  # type: ignore[no-untyped-def]
    return TsaSource(served(), KEY_ID, keys_dir, engine, policy="1.2.3", accuracy=1,
                     allow_sha1=False, require_clock_sync=False, clock=clock)


def test_an_api_host_finds_the_chain_a_worker_host_registered(tmp_path: Path, engine) -> None:  # type: ignore[no-untyped-def]
    with Session(engine) as s, s.begin():
        s.add(SigningKey(id=KEY_ID, format="openpgp", fingerprint="A" * 40,
                         algorithm="nistp256", public="public", uid="TSA <t@localhost>",
                         is_primary=False, host="worker-1", registered_at=1))
    clock = Clock()
    tsa = source(tmp_path / "keys", engine, clock)  # no key files here
    assert tsa.get() is None  # nothing registered yet
    pem = chain_pem()
    register_certificates(engine, KEY_ID, pem)
    assert registered_certificates(engine, KEY_ID) == pem
    assert tsa.get() is None  # not looked for again so soon
    clock.now += RETRY_EVERY
    found = tsa.get()
    assert found is not None and found.chain_pem == pem and found.accuracy == 1
    assert tsa.get() is found


def test_the_chain_file_wins_and_garbage_is_not_served(tmp_path: Path, engine) -> None:  # type: ignore[no-untyped-def]
    key_dir = tmp_path / "keys" / KEY_ID
    key_dir.mkdir(parents=True)
    (key_dir / TSA_CHAIN_FILE).write_text("not a certificate\n")
    clock = Clock()
    tsa = source(tmp_path / "keys", engine, clock)
    assert tsa.get() is None
    pem = chain_pem()
    (key_dir / TSA_CHAIN_FILE).write_text(pem)
    clock.now += RETRY_EVERY
    found = tsa.get()
    assert found is not None and found.chain_pem == pem


def test_a_chain_for_an_unregistered_key_is_refused(engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KeyRegistryError, match="not registered"):
        register_certificates(engine, KEY_ID, chain_pem())
