"""A passphrase-protected signing key: the passphrase comes from a file, never argv."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import Server, keyring, pids_mentioning, stamp_tag, start_server, verify_stamp

PASSPHRASE = "correct horse battery staple"


def test_protected_key_signs(tmp_path: Path, server_factory: list[Server]) -> None:
    pass_file = tmp_path / "passphrase"
    pass_file.write_text(PASSPHRASE + "\n")
    pass_file.chmod(0o600)
    data = tmp_path / "data"
    server = start_server(data, workers=1,
                          extra_env={"STAMPD_PASSPHRASE_FILE": str(pass_file)})
    server_factory.append(server)
    secret = (data / "keys/secret-key.asc").read_text()
    assert "PRIVATE KEY BLOCK" in secret
    # The key on disk is protected (S2K), unlike the unprotected test key.
    import subprocess
    packets = subprocess.run(["gpg", "--list-packets", str(data / "keys/secret-key.asc")],
                             capture_output=True, text=True, timeout=60, check=False).stdout
    assert "iter+salt S2K" in packets and "protect count" in packets

    for i in range(3):
        text = stamp_tag(server, f"{i + 1:040x}")
        v = verify_stamp(text, keyring(data / "keys/pubkey.asc", tmp_path / f"g{i}"))
        assert v.created > 0
    # The passphrase never appears on any process's command line.
    assert not pids_mentioning(PASSPHRASE)
    for pid in server.worker_pids():
        assert PASSPHRASE.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert os.stat(data / "keys/secret-key.asc").st_mode & 0o777 == 0o600
