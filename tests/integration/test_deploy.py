"""Deployment files and documentation match the code."""

from __future__ import annotations

import re
import shutil
import subprocess

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
    documented = set(re.findall(r"`STAMPD_([A-Z_]+)`", readme))
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
