"""`make clean` removes only what can be rebuilt; the data (keys, journal, log) goes only with
`make clean-data`, which says what it deletes and asks first."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

MAKEFILE = ROOT / "Makefile"


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.fail("make is required for this test")
    return subprocess.run(["make", "-f", str(MAKEFILE), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)


def test_make_clean_never_touches_the_data() -> None:
    r = make("-n", "clean")
    assert r.returncode == 0, r.stderr
    assert ".venv" in r.stdout
    # (``keys`` as a word: the data's keys directory, not the source package ``keystore``)
    for data in (r"\bvar\b", r"\bkeys\b", r"sqlite3", r"log\.git", r"DATA"):
        assert not re.search(data, r.stdout), (data, r.stdout)


def test_make_clean_data_asks_and_refuses_without_a_terminal(tmp_path: Path) -> None:
    keys = tmp_path / "var" / "keys"
    keys.mkdir(parents=True)
    (keys / "secret-key.asc").write_text("secret")
    r = make("clean-data", cwd=tmp_path)
    assert r.returncode != 0
    assert "var/keys" in r.stdout and "cannot be rebuilt" in r.stdout
    assert "refused: no terminal to ask; run make clean-data CONFIRM=yes" in r.stderr
    assert (keys / "secret-key.asc").read_text() == "secret"
    r = make("clean-data", "CONFIRM=yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "var").exists()
