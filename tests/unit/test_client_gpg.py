"""client/gpg.py leans on python-gnupg's private ``GPG._collect_output`` to put a time limit on
each gpg run (python-gnupg has none); python-gnupg is pinned exactly for it, and this test fails
when the hook stops taking effect: a gpg that hangs is killed and reported in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from client import gpg
from client.gpg import GpgError, GpgHome

# Answers python-gnupg's version probe (``--list-config``) like gpg 2.2, then hangs on any
# real command.
FAKE_GPG = """#!/bin/sh
for a in "$@"; do
  if [ "$a" = "--list-config" ]; then
    echo "cfg:version:2.2.40"; exit 0
  fi
done
exec sleep 30
"""


def test_a_hanging_gpg_is_killed_and_reported(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "gpg"
    fake.parent.mkdir()
    fake.write_text(FAKE_GPG)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpg._Gpg, "timeout", 0.5)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    h = GpgHome(home)
    with pytest.raises(GpgError, match="gpg did not finish in time"):
        h.import_keys(b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
