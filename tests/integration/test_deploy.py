"""Deployment files and documentation match the code."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from server.settings import Settings, env_example
from tests.helpers import ROOT


def test_docker_compose_validates() -> None:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose (Debian package) is required: .ci/run installs it"
    r = subprocess.run([exe, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                       capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_env_example_is_current() -> None:
    assert (ROOT / "deploy/stampd.env").read_text() == env_example()


def test_every_setting_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"`STAMPD_([A-Z0-9_]+)`", readme))
    missing = [n for n in Settings.model_fields if n.upper() not in documented]
    assert not missing, f"settings missing from README: {missing}"


def test_systemd_units_are_hardened() -> None:
    for unit in ("stampd.service", "stampd-worker.service"):
        text = (ROOT / "deploy" / unit).read_text()
        for directive in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                          "StateDirectoryMode=0700", "User=stampd"):
            assert directive in text, f"{unit} lacks {directive}"
        assert re.search(r"^ExecStart=/usr/local/bin/stampd (serve|worker)$", text, re.M)


def test_dockerfile_runs_as_non_root() -> None:
    text = (ROOT / "deploy/Dockerfile").read_text()
    assert "\nUSER stampd\n" in text
    for pkg in ("gnupg", "openssh-client", "git"):
        assert pkg in text


def test_systemd_units_verify_and_allow_what_each_process_does(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts both units, and each unit's sandbox lets its process
    do its work: the API serves TCP and reaches peers and PostgreSQL; a worker host reaches
    PostgreSQL over TCP (database dispatch) and its agents over Unix sockets."""
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze (Debian package systemd) is required"
    for unit in ("stampd.service", "stampd-worker.service"):
        text = (ROOT / "deploy" / unit).read_text()
        families = set(re.search(r"^RestrictAddressFamilies=(.*)$", text, re.M)
                       .group(1).split())  # type: ignore[union-attr]
        assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families, f"{unit}: {families}"
        # verify needs an executable that exists here; the unit is otherwise unchanged.
        (tmp_path / unit).write_text(text.replace("/usr/local/bin/stampd", "/bin/true"))
    r = subprocess.run([exe, "verify", *(str(tmp_path / u) for u in
                                         ("stampd.service", "stampd-worker.service"))],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
