"""The packaging and the documentation stay in shape: the lock files agree with pyproject.toml
(offline; `make lock-check` recompiles them), the client's lock holds none of the server's
packages, README.md stays a front page and docs/README.md lists every page of docs/."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
TEST_LOCK = ROOT / "requirements/test.lock"
CLIENT_LOCK = ROOT / "requirements/client.lock"
SERVER_LOCK = ROOT / "requirements/server.lock"
README_MAX_LINES = 250
SERVER_ONLY = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "prometheus-client")

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def locked(path: Path) -> dict[str, tuple[Version, int]]:
    """Each package of a lock file: its pinned version and how many hashes it carries."""
    pins: dict[str, tuple[Version, int]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if m := PIN.match(line):
            name = canonicalize_name(m.group(1))
            assert name not in pins, f"{path.name}: {name} pinned twice"
            pins[name] = (Version(m.group(2)), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


def requirements(*groups: str) -> list[Requirement]:
    """The requirements of pyproject.toml: "base" (the dependencies) or an extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = []
    for group in groups:
        lines = project["dependencies"] if group == "base" else \
            project["optional-dependencies"][group]
        reqs += [r for r in map(Requirement, lines) if canonicalize_name(r.name) != "stampd"]
    return reqs


@pytest.mark.parametrize(("lock", "groups"), [(TEST_LOCK, ("base", "server", "test")),
                                              (SERVER_LOCK, ("base", "server")),
                                              (CLIENT_LOCK, ("base",))])
def test_the_lock_pins_every_requirement_within_its_range(
        lock: Path, groups: tuple[str, ...]) -> None:
    pins = locked(lock)
    for req in requirements(*groups):
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock.name} lacks {req}: run make lock"
        assert req.specifier.contains(pins[name][0], prereleases=True), \
            f"{lock.name} pins {name}=={pins[name][0]}, outside {req}: run make lock"


@pytest.mark.parametrize("lock", [TEST_LOCK, SERVER_LOCK, CLIENT_LOCK])
def test_every_locked_package_has_hashes(lock: Path) -> None:
    pins = locked(lock)
    assert pins
    assert not [name for name, (_, hashes) in pins.items() if not hashes]


def test_the_client_lock_agrees_with_the_test_lock_and_holds_no_server_package() -> None:
    client, full = locked(CLIENT_LOCK), locked(TEST_LOCK)
    differ = {n: (v, full.get(n, (None,))[0]) for n, (v, _) in client.items()
              if full.get(n, (None,))[0] != v}
    assert not differ, f"client.lock and test.lock pin these differently: {differ}"
    assert not [n for n in SERVER_ONLY if n in client]
    assert all(n in full for n in SERVER_ONLY)


def test_the_server_lock_agrees_with_the_test_lock() -> None:
    server, full = locked(SERVER_LOCK), locked(TEST_LOCK)
    differ = {n: (v, full.get(n, (None,))[0]) for n, (v, _) in server.items()
              if full.get(n, (None,))[0] != v}
    assert not differ, f"server.lock and test.lock pin these differently: {differ}"
    assert all(n in server for n in SERVER_ONLY)


def test_the_image_installs_the_server_lock_and_every_package() -> None:
    """deploy/Dockerfile copies every top-level package of the project and installs the
    server's lock (a package it lacks made an image that could not start)."""
    text = (ROOT / "deploy/Dockerfile").read_text()
    assert "-r requirements/server.lock" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}\n" in text, f"the image lacks {package}/"


def test_uvicorn_and_rfc3161_client_are_pinned_exactly() -> None:
    # server/runtime/httpproto.py subclasses uvicorn's private httptools protocol;
    # formats/tsp/request.py uses rfc3161-client's private DER parser.
    exact = {canonicalize_name(r.name): r for r in requirements("base", "server")}
    for name in ("uvicorn", "rfc3161-client"):
        assert [s.operator for s in exact[name].specifier] == ["=="], exact[name]


def test_readme_is_a_front_page() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, \
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to docs/"


def test_the_quick_start_uses_the_venvs_git_timestamp() -> None:
    """`make test` (or `make venv`) completes .venv with the test lock, which holds
    git-timestamp: the quick start puts .venv/bin on PATH (where `git timestamp` finds
    git-timestamp) instead of a `pip install` that PEP 668 refuses outside a venv."""
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("### Installing the client")]
    assert "pip install git-timestamp" not in quick
    assert 'export PATH="$PWD/.venv/bin:$PATH"' in quick and "`.venv/bin/stampd`" in quick
    assert re.search(r"^git-timestamp==", (ROOT / "requirements/test.lock").read_text(),
                     re.MULTILINE)


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs/README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#/]+\.md)(?:#[^)]*)?\)", index))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert not pages - linked, f"docs/README.md does not list {sorted(pages - linked)}"
    assert not linked - pages, f"docs/README.md links missing pages {sorted(linked - pages)}"


def test_every_setting_is_in_docs_settings() -> None:
    from server.settings import Settings

    documented = set(re.findall(r"`STAMPD_([A-Z0-9_]+)`",
                                (ROOT / "docs/settings.md").read_text()))
    missing = [n for n in Settings.model_fields if n.upper() not in documented]
    assert not missing, f"settings missing from docs/settings.md: {missing}"
