"""The Makefile as a newcomer meets it: `make help` (and plain `make`) lists every target with
what it does, and `make serve` builds only what serving needs, with uv's progress shown,
before the test tools that `make test` adds to the same venv (docs/development.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

MAKEFILE = ROOT / "Makefile"


def make(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.fail("make is required for this test")
    return subprocess.run(["make", "--no-print-directory", "-f", str(MAKEFILE), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)


def notes() -> dict[str, str]:
    """Each target with a ``##`` note, and the note's first sentence."""
    found: dict[str, str] = {}
    note: list[str] = []
    for line in MAKEFILE.read_text().splitlines():
        if line.startswith("## "):
            note.append(line[3:])
            continue
        target = re.match(r"([a-z][-a-z]*):", line)
        if target and note:
            text = " ".join(note)
            found[target.group(1)] = text[:text.index(". ") + 1] if ". " in text else text
        note = []
    return found


def test_every_target_has_a_note() -> None:
    phony = re.search(r"^\.PHONY:(.*?)(?<!\\)$", MAKEFILE.read_text(), re.M | re.S)
    assert phony
    targets = set(phony.group(1).replace("\\", " ").split())
    assert "help" in targets and "serve" in targets and "test" in targets
    assert targets == set(notes()), targets ^ set(notes())


def test_make_help_lists_every_target_with_its_note() -> None:
    listed = make("help")
    assert listed.returncode == 0, listed.stderr
    assert make().stdout == listed.stdout  # (what plain `make` does)
    text = " ".join(listed.stdout.split())
    for target, first in notes().items():
        assert f" {target} {' '.join(first.split())}" in text, (target, listed.stdout)
    assert all(len(line) <= 100 for line in listed.stdout.splitlines()), listed.stdout


def test_make_serve_builds_the_server_alone_with_uvs_progress(tmp_path: Path) -> None:
    """A fresh clone's `make serve` installs requirements/server.lock (hash-checked, with the uv
    that requirements/test.lock pins) and not the test tools; uv says what it does (no
    --quiet). The whole venv (`make venv`, which `make test` needs) is the same one, with
    requirements/test.lock installed over it after."""
    venv = tmp_path / "venv"
    served = make("-n", "serve", f"VENV={venv}")
    assert served.returncode == 0, served.stderr
    installs = re.findall(r"^\S*/(?:uv )?pip (?:--quiet )?install .*$", served.stdout, re.M)
    assert [i for i in installs if "-r " in i] == [
        f"{venv}/bin/uv pip install --python {venv}/bin/python --require-hashes "
        "-r requirements/server.lock"], served.stdout
    assert "grep -o '^uv==[^ ]*' requirements/test.lock" in served.stdout  # (uv's own pin)
    assert f"{venv}/bin/stampd serve" in served.stdout
    whole = make("-n", "venv", f"VENV={venv}")
    assert whole.returncode == 0, whole.stderr
    locks = re.findall(r"^\S*/uv pip install --python \S+ --require-hashes -r (\S+)$",
                       whole.stdout, re.M)
    assert locks == ["requirements/server.lock", "requirements/test.lock"], whole.stdout
    # (not uv's own lock file: uv takes .venv/.lock while it installs, and would wait forever
    # for a make that held it)
    assert "flock $(VENV)/.make-lock " in MAKEFILE.read_text()
