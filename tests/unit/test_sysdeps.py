"""`tests/sysdeps.sh` (the first step of `make test`) installs what is missing quietly: one line
says what it installs, and nothing more is printed unless apt fails.

The script runs here with a ``PATH`` of stand-ins (this machine's packages are not touched): an
``apt-get`` that records how it was called and, like apt with needrestart installed, makes
needrestart's noise after an install unless ``NEEDRESTART_SUSPEND`` is set; a ``sudo`` that resets
the environment as sudo's ``env_reset`` does; an ``id`` of an unprivileged user.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

SYSDEPS = ROOT / "tests" / "sysdeps.sh"

APT_GET = """#!/bin/sh
printf 'apt-get %s | DEBIAN_FRONTEND=%s NEEDRESTART_SUSPEND=%s\n' "$*" \
    "${DEBIAN_FRONTEND-}" "${NEEDRESTART_SUSPEND-}" >>"$APT_LOG"
case " $* " in *" -qq "*) ;; *) echo "Reading package lists..." ;; esac
case "$*" in *install*)
    [ -n "${NEEDRESTART_SUSPEND-}" ] || { echo "Scanning processes..." >&2;
                                          echo "No services need to be restarted."; }
    [ "${DEBIAN_FRONTEND-}" = noninteractive ] || echo "debconf: unable to initialize frontend" >&2
    [ "${FAIL-}" = 1 ] && { echo "E: Unable to locate package chromium" >&2; exit 100; } ;;
esac
exit 0
"""
SUDO = """#!/bin/sh
[ "$1" = -n ] && shift
[ "$*" = true ] && exit 0
exec /usr/bin/env -i PATH="$PATH" APT_LOG="$APT_LOG" FAIL="${FAIL-}" "$@"
"""
ID = """#!/bin/sh
echo 1000
"""


def run_sysdeps(tmp_path: Path, fail: bool = False) -> tuple[subprocess.CompletedProcess[str],
                                                             list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("apt-get", APT_GET), ("sudo", SUDO), ("id", ID)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("env",):  # (what the script uses besides; none of the packages' commands)
        real = shutil.which(tool)
        if real is None:
            pytest.fail(f"{tool} is required for this test")
        (bin_dir / tool).symlink_to(real)
    log = tmp_path / "apt.log"
    env = {"PATH": str(bin_dir), "APT_LOG": str(log), "FAIL": "1" if fail else "",
           "HOME": str(tmp_path)}
    r = subprocess.run(["/bin/sh", str(SYSDEPS)], capture_output=True, text=True, env=env,
                       timeout=60, check=False, stdin=subprocess.DEVNULL)
    return r, log.read_text().splitlines() if log.exists() else []


def test_packages_are_installed_with_one_line_and_no_noise(tmp_path: Path) -> None:
    r, calls = run_sysdeps(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith("installing the packages the tests need: gnupg ")
    assert r.stdout.count("\n") == 1, r.stdout
    assert [c.split(" | ")[0].split()[:2] for c in calls] == [["apt-get", "-qq"]] * 2, calls
    assert "update" in calls[0] and "install -y gnupg" in calls[1]
    for call in calls:  # (passed through sudo, which resets the environment)
        assert call.endswith("| DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1"), call


def test_a_failed_install_shows_what_apt_said(tmp_path: Path) -> None:
    r, calls = run_sysdeps(tmp_path, fail=True)
    assert r.returncode == 1
    assert "E: Unable to locate package chromium" in r.stderr
    assert r.stderr.rstrip("\n").splitlines()[-1].startswith(
        "make test: apt-get install failed (above); install them with: sudo apt-get install -y "
    ), r.stderr
    assert calls[-1].startswith("apt-get -qq -o DPkg::Lock::Timeout=300 install -y gnupg ")
