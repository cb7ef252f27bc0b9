"""The start-up check of a key (`workers.worker.check_key`): one test signature through a real
agent, verified against the key's public key file; and the check of the programs stampd runs
(`workers.agents.programs`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from keystore.keyset import KeyUnusable, SshKeyStore
from tests.broken_keys import corrupt_armor, corrupt_ssh_key, wrong_secret
from tests.helpers import (
    TEST_FPR,
    TEST_SECRET_KEY,
    agent_home,
    seed_data_dir,
)
from workers.agents.programs import GNUPG, OPENSSH, ProgramError, parse_version, require
from workers.config import DispatchConfig, WorkerConfig
from workers.worker import check_key


@pytest.fixture
def home() -> Iterator[Path]:
    """A short private home for the check's agent; no agent may outlive the check."""
    with agent_home("kc") as path:
        yield path


def config(home: Path, key_dir: Path, key_id: str = "primary",
           fmt: str = "openpgp") -> WorkerConfig:
    return WorkerConfig("check:1:0", home, key_dir,
                        DispatchConfig("socket", socket=home / "unused.sock"), key_id=key_id,
                        format=fmt)  # type: ignore[arg-type]


def test_a_good_key_passes(tmp_path: Path, home: Path) -> None:
    keys = seed_data_dir(tmp_path / "d") / "keys"
    assert check_key(config(home, keys), clock=lambda: 1_795_400_000.0) == TEST_FPR


def test_a_corrupt_key_file_is_named(tmp_path: Path, home: Path) -> None:
    keys = seed_data_dir(tmp_path / "d") / "keys"
    corrupt_armor(keys / "secret-key.asc")
    with pytest.raises(KeyUnusable) as caught:
        check_key(config(home, keys))
    assert caught.value.key_id == "primary"
    assert str(keys / "secret-key.asc") in caught.value.message
    assert "\n" not in caught.value.message and "restore" in caught.value.message


def test_a_secret_key_that_does_not_match_its_public_key(tmp_path: Path, home: Path) -> None:
    """It imports, has the right fingerprint and gpg-agent signs with it: only the signature,
    checked against pubkey.asc, shows it."""
    keys = seed_data_dir(tmp_path / "d") / "keys"
    (keys / "secret-key.asc").write_text(wrong_secret(TEST_SECRET_KEY.read_text()))
    with pytest.raises(KeyUnusable) as caught:
        check_key(config(home, keys))
    assert "does not verify with the public key" in caught.value.message
    assert str(keys / "pubkey.asc") in caught.value.message


def _ssh_key(directory: Path) -> SshKeyStore:
    store = SshKeyStore(directory)
    store.ensure("ed25519", "stampd test")
    return store


def test_ssh_keys(tmp_path: Path, home: Path) -> None:
    store = _ssh_key(tmp_path / "ssh-ed25519")
    fingerprint = check_key(config(home, store.dir, "ssh-ed25519", "ssh"))
    assert fingerprint == store.public_key().fingerprint

    # The public key file of another key: caught before anything is signed.
    other = _ssh_key(tmp_path / "other")
    shutil.copy(other.public_key_file, store.public_key_file)
    with pytest.raises(KeyUnusable, match="holds another key than"):
        check_key(config(home, store.dir, "ssh-ed25519", "ssh"))

    corrupt_ssh_key(other.private_key_file)
    with pytest.raises(KeyUnusable) as caught:
        check_key(config(home, other.dir, "ssh-ed25519", "ssh"))
    assert str(other.private_key_file) in caught.value.message
    assert "remove ssh:ed25519 from STAMPD_EXTRA_KEYS" in caught.value.message


def test_ssh_signatures_are_checked_against_the_public_key(tmp_path: Path) -> None:
    """`SshKeyStore.verify` (ssh-keygen -Y verify) accepts ssh-keygen's own signature and
    refuses it for a changed message."""
    import subprocess

    store = _ssh_key(tmp_path / "k")
    message = tmp_path / "m"
    message.write_bytes(b"stampd key check\n")
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-n", "git", "-f",
                    str(store.private_key_file), str(message)], check=True, timeout=60,
                   capture_output=True)
    signature = (tmp_path / "m.sig").read_text()
    store.verify(b"stampd key check\n", signature, "git")
    from keystore.store import KeyStoreError

    with pytest.raises(KeyStoreError, match="does not verify"):
        store.verify(b"another message\n", signature, "git")


# -- programs ----------------------------------------------------------------------------------

def _fake(bindir: Path, name: str, output: str) -> None:
    script = bindir / name
    script.write_text(f"#!/bin/sh\necho '{output}'\n")
    script.chmod(0o755)


def test_installed_programs_are_recent_enough() -> None:
    require([*GNUPG, *OPENSSH])


def test_parse_version() -> None:
    assert parse_version(b"gpg (GnuPG) 2.2.40\nlibgcrypt 1.10.1\n") == (2, 2, 40)
    assert parse_version(b"OpenSSH_9.2p1 Debian-2+deb12u6, OpenSSL 3.0.19\n") == (9, 2)
    assert parse_version(b"no version here") is None


def test_missing_and_old_programs_are_one_line(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    with pytest.raises(ProgramError) as caught:
        require(GNUPG, env)
    assert caught.value.message == ("gpg is not installed (not on PATH): stampd needs GnuPG "
                                    "2.2.8 or later; install it, e.g. `apt-get install gnupg`")
    _fake(tmp_path, "gpg", "gpg (GnuPG) 2.1.18")
    with pytest.raises(ProgramError, match=r"gpg \(.*\) is GnuPG 2\.1\.18, too old: stampd "
                       r"needs GnuPG 2\.2\.8 or later"):
        require(GNUPG, env)
    # OpenSSH's tools print no release: ssh -V's is theirs.
    for name in ("ssh-agent", "ssh-add", "ssh-keygen"):
        _fake(tmp_path, name, "usage")
    require(OPENSSH, env)  # no ssh: the release is unknown, which is not too old
    _fake(tmp_path, "ssh", "OpenSSH_7.4p1, OpenSSL 1.0.2k-fips")
    with pytest.raises(ProgramError, match=r"is OpenSSH 7\.4, too old.*openssh-client"):
        require(OPENSSH, env)
