"""Issue 12, A1: hosts that sign register their public keys in the database; API hosts serve
exactly those (no key files needed), and a host whose key files disagree refuses to start."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from formats.keys import KeySpec
from keystore.keyset import SshKeyStore
from server import db
from server.commands import _prepare
from server.errors import KeyRegistryError
from server.settings import Settings
from server.signing_keys import registered, serving_keys
from stampd.cli import main
from tests.helpers import TEST_FPR, KeyMaker, seed_data_dir


@pytest.fixture
def shared_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.sqlite3'}"


def other_key_dir(tmp_path: Path, keys: KeyMaker, name: str) -> Path:
    """A data directory holding a different OpenPGP key than the test key."""
    key = keys.get("ed25519")
    return seed_data_dir(tmp_path / name, key.secret_file, key.public_file)


def test_an_api_host_without_key_files_serves_the_registered_keys(
        tmp_path: Path, shared_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAMPD_EXTRA_KEYS", "ssh:ed25519")
    signer = seed_data_dir(tmp_path / "signer")
    SshKeyStore(signer / "keys" / "ssh-ed25519").ensure("ed25519", "stampd test")
    _prepare(Settings(data_dir=signer, database_url=shared_db))  # a host that signs

    api = tmp_path / "api"
    settings = Settings(data_dir=api, database_url=shared_db)
    _prepare(settings, signs_here=False)
    assert not (api / "keys").exists() or not any((api / "keys").iterdir())  # none made
    engine = db.make_engine(shared_db)
    try:
        keys = serving_keys(settings.keys_dir, settings.extra_key_specs, "database", engine)
        assert [k.id for k in keys] == ["primary", "ssh-ed25519"]
        assert keys[0].fingerprint == TEST_FPR and keys[0].primary
        assert keys[1].public == (signer / "keys/ssh-ed25519/id.pub").read_text().split(
            " stampd")[0] + "\n"
        assert registered(engine) == keys
        # Restarting the signing host registers nothing new and changes nothing.
        _prepare(Settings(data_dir=signer, database_url=shared_db))
        assert registered(engine) == keys
    finally:
        engine.dispose()


def test_no_keys_anywhere_is_one_line(tmp_path: Path, shared_db: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    api = tmp_path / "api"
    assert main(["serve", "--no-workers", "--port", "0", "--data-dir", str(api),
                 "--database-url", shared_db]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no signing keys" in err and "stampd worker" in err
    assert not (api / "keys" / "pubkey.asc").exists()  # an API host never makes a key


def test_a_host_whose_key_differs_refuses_naming_the_key(
        tmp_path: Path, shared_db: str, capsys: pytest.CaptureFixture[str],
        keys: KeyMaker) -> None:
    first = seed_data_dir(tmp_path / "first")
    assert main(["keys", "register", "--data-dir", str(first), "--database-url",
                 shared_db]) == 0
    capsys.readouterr()
    other = other_key_dir(tmp_path, keys, "second")

    # A signing host with another primary key: `keys register` and `serve` both refuse.
    assert main(["keys", "register", "--data-dir", str(other), "--database-url",
                 shared_db]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"key primary in {other}/keys/pubkey.asc has fingerprint" in err
    assert f"the database has {TEST_FPR}" in err and str(first.resolve()) in err
    assert "--replace" in err

    # An API host whose (public) key file disagrees refuses too, before serving.
    assert main(["serve", "--no-workers", "--port", "0", "--data-dir", str(other),
                 "--database-url", shared_db]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key primary" in err and "Traceback" not in err

    # Replacing on purpose: the registry becomes the new host's keys.
    assert main(["keys", "register", "--replace", "--data-dir", str(other),
                 "--database-url", shared_db]) == 0
    engine = db.make_engine(shared_db)
    try:
        (key,) = registered(engine)
        assert key.fingerprint != TEST_FPR
        assert key.public == (other / "keys/pubkey.asc").read_text()
        with engine.connect() as conn:
            host = conn.execute(text("SELECT host FROM signing_keys")).scalar_one()
        assert host.endswith(str(other.resolve()))
    finally:
        engine.dispose()


def test_an_extra_key_nobody_registered_is_refused(tmp_path: Path, shared_db: str) -> None:
    signer = seed_data_dir(tmp_path / "signer")
    _prepare(Settings(data_dir=signer, database_url=shared_db))
    settings = Settings(data_dir=tmp_path / "api", database_url=shared_db,
                        extra_keys="ssh:ed25519")
    engine = db.make_engine(shared_db)
    try:
        with pytest.raises(KeyRegistryError, match="names ssh:ed25519"):
            serving_keys(settings.keys_dir, [KeySpec("ssh", "ed25519")], "database", engine)
    finally:
        engine.dispose()
