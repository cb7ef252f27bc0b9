"""`stampd keys show` finds the data directory's keys without any environment variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats.keys import TLOG_KEY, tlog_vkey
from keystore.keyset import SshKeyStore, ensure_extra_keys, stored_key_specs
from stampd.cli import main
from tests.helpers import TEST_FPR, free_port, seed_data_dir


def test_keys_show_finds_ssh_keys_of_the_data_dir(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STAMPD_EXTRA_KEYS", raising=False)
    data = seed_data_dir(tmp_path / "data")
    assert main(["keys", "show", "--ssh", "--data-dir", str(data)]) == 1
    assert "no SSH key in" in capsys.readouterr().err
    store = SshKeyStore(data / "keys" / "ssh-ed25519")
    assert store.ensure("ed25519", "stampd test")
    assert [s.id for s in stored_key_specs(data / "keys")] == ["ssh-ed25519"]
    assert main(["keys", "show", "--ssh", "--data-dir", str(data)]) == 0
    line = capsys.readouterr().out
    key = store.public_key().to_line(comment=False)
    assert line == f'test@stampd.invalid namespaces="git,stampd" {key}\n'
    assert main(["keys", "show", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert TEST_FPR in out and "key ssh-ed25519:" in out


def test_keys_show_prints_the_log_key_and_its_verifier_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log key (STAMPD_TLOG=on) is shown with its C2SP verifier key under the log's
    origin; it is no allowed signer of stamps; a data directory that holds it shows it with
    the log off too."""
    monkeypatch.delenv("STAMPD_EXTRA_KEYS", raising=False)
    monkeypatch.setenv("STAMPD_TLOG", "on")
    data = seed_data_dir(tmp_path / "data")
    ensure_extra_keys(data / "keys", [TLOG_KEY], "stampd test", None)
    line = SshKeyStore(data / "keys" / "tlog-ed25519").public_key_file.read_text()
    assert [s.id for s in stored_key_specs(data / "keys")] == ["tlog-ed25519"]
    for tlog, origin in (("on", "127.0.0.1:8080/tlog"), ("off", "example.org/log")):
        monkeypatch.setenv("STAMPD_TLOG", tlog)
        monkeypatch.setenv("STAMPD_TLOG_ORIGIN", origin)
        assert main(["keys", "show", "--data-dir", str(data)]) == 0
        out = capsys.readouterr().out
        assert "key tlog-ed25519:" in out
        assert f"\nlog key (tlog): {tlog_vkey(origin, line)}\n" in out
    monkeypatch.delenv("STAMPD_TLOG_ORIGIN")
    assert main(["keys", "show", "--ssh", "--data-dir", str(data)]) == 1
    assert "no SSH key in" in capsys.readouterr().err


def test_export_public_gives_an_api_host_its_keys_and_no_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STAMPD_EXTRA_KEYS", raising=False)
    data = seed_data_dir(tmp_path / "data")
    SshKeyStore(data / "keys" / "ssh-ed25519").ensure("ed25519", "stampd test")
    out = tmp_path / "api" / "keys"
    assert main(["keys", "export-public", str(out), "--data-dir", str(data)]) == 0
    assert capsys.readouterr().out == f"public keys of 2 signing key(s) written to {out}\n"
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["allowed_signers", "pubkey.asc", "ssh-ed25519/id.pub"]
    for f in out.rglob("*"):
        if f.is_file():
            assert b"PRIVATE" not in f.read_bytes(), f  # no secret key material
    assert (out / "pubkey.asc").read_bytes() == (data / "keys/pubkey.asc").read_bytes()
    # The exported directory serves as an API host's keys/: the same keys, same fingerprints.
    assert main(["keys", "show", "--data-dir", str(out.parent)]) == 0
    shown = capsys.readouterr().out
    assert TEST_FPR in shown and "key ssh-ed25519:" in shown
    assert (out / "allowed_signers").read_text().startswith("test@stampd.invalid ")


def test_a_host_with_only_public_keys_never_makes_a_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 12, A1 (the part that lost stamps): an API host given only the public keys must
    serve those, never generate a key of its own; a host that signs refuses to start without
    its secret key, in one line naming the file."""
    monkeypatch.setenv("STAMPD_EXTRA_KEYS", "ssh:ed25519")
    data = seed_data_dir(tmp_path / "signer")
    SshKeyStore(data / "keys" / "ssh-ed25519").ensure("ed25519", "stampd test")
    api = tmp_path / "api"
    assert main(["keys", "export-public", str(api / "keys"), "--data-dir", str(data)]) == 0
    before = {p: p.read_bytes() for p in (api / "keys").rglob("*") if p.is_file()}
    capsys.readouterr()

    from server.commands import _prepare
    from server.settings import Settings

    _prepare(Settings(data_dir=api), signs_here=False)  # `stampd serve --no-workers`
    after = {p: p.read_bytes() for p in (api / "keys").rglob("*") if p.is_file()}
    assert after == before  # no key generated, none changed
    assert not (api / "keys" / "secret-key.asc").exists()

    port = str(free_port())
    assert main(["serve", "--port", port, "--data-dir", str(api)]) == 1  # with workers
    err = capsys.readouterr().err
    assert err == (f"stampd serve: {api}/keys/secret-key.asc is missing: this host has only "
                   "the public key (an API host runs with --no-workers); restore the secret "
                   "key to sign here\n")
    assert {p: p.read_bytes() for p in (api / "keys").rglob("*") if p.is_file()} == before


def test_a_generated_key_names_this_server_not_localhost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default user id carries the host of STAMPD_OWN_URL (else the host name), so that
    every server's key does not claim stampd@localhost; a key that exists keeps its user id."""
    monkeypatch.delenv("STAMPD_KEY_UID", raising=False)
    monkeypatch.delenv("STAMPD_EXTRA_KEYS", raising=False)
    monkeypatch.setenv("STAMPD_OWN_URL", "https://Stamp.Example.org:8443/")
    data = tmp_path / "data"
    assert main(["keys", "generate", "--data-dir", str(data)]) == 0
    uid = "stampd Timestamping Service <stampd@stamp.example.org>"
    assert f"user id:     {uid}\n" in capsys.readouterr().out
    monkeypatch.setenv("STAMPD_OWN_URL", "https://other.example.org/")
    assert main(["keys", "show", "--data-dir", str(data)]) == 0
    assert f"user id:     {uid}\n" in capsys.readouterr().out


def test_the_default_user_id_falls_back_to_localhost() -> None:
    from server.setting_values import default_uid

    assert default_uid("http://[::1]:8080/") == "stampd Timestamping Service <stampd@localhost>"
    assert default_uid("http://a_b.example/") == "stampd Timestamping Service <stampd@localhost>"
    assert default_uid(None).startswith("stampd Timestamping Service <stampd@")


def test_keys_generate_on_a_fresh_data_dir_with_the_default_keys_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the defaults (RFC 3161 and the transparency log on), `keys generate` on a new data
    directory makes the signing key and says so; the keys the server makes at its first start
    are named as not made yet, not an error."""
    for name in ("STAMPD_EXTRA_KEYS", "STAMPD_TSA", "STAMPD_TSA_KEY", "STAMPD_TLOG"):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data"
    assert main(["keys", "generate", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "fingerprint: " in out
    assert "not made yet (the server makes them at its first start): openpgp-nistp256, " \
           "tlog-ed25519" in out
    assert main(["keys", "show", "--data-dir", str(data)]) == 0
    assert "not made yet" in capsys.readouterr().out
