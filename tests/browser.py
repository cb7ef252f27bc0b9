"""A real browser for the web pages' tests: Debian's Chromium (``/usr/bin/chromium``, installed
by tests/sysdeps.sh) driven by Playwright; no browser is downloaded. A test that needs it fails
when it is missing, naming the package.

Also the web pages' npm packages (web/node_modules, installed by ``make test`` from
web/package-lock.json): axe-core for the accessibility check.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "web" / "node_modules"
# What keeps a headless Chromium off the network it would otherwise call at start.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--hide-scrollbars"]


def node_module(path: str) -> Path:
    """A file of web/node_modules, or a failed test naming how to install them."""
    f = NODE_MODULES / path
    assert f.exists(), f"{f} is missing: run `make web/node_modules/.installed` (npm ci in web/)"
    return f


# The one Playwright and Chromium of this test process. Every module that imports `browser`
# gets a session fixture of its own, but Playwright's sync API allows one instance per thread:
# the first to ask starts it, the last to finish stops it.
_shared: dict[str, Any] = {}


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium per test process; each test opens its own context."""
    if not _shared:
        from playwright.sync_api import sync_playwright

        exe = shutil.which("chromium")
        assert exe, "Debian's chromium is required for this test (make test installs it: " \
                    "apt-get install chromium)"
        p = sync_playwright().start()
        try:
            b = p.chromium.launch(executable_path=exe, args=FLAGS, headless=True)
        except BaseException:
            p.stop()
            raise
        _shared.update(playwright=p, browser=b, users=0)
    _shared["users"] += 1
    try:
        yield _shared["browser"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0:
            try:
                _shared["browser"].close()
            finally:
                _shared["playwright"].stop()
                _shared.clear()


def axe_violations(page: Any, impacts: tuple[str, ...] = ("serious", "critical")) -> list[Any]:
    """axe-core's violations of ``impacts`` on the page as it is now (axe-core from npm,
    injected into the page by the test, not served by stampd)."""
    page.add_script_tag(content=node_module("axe-core/axe.min.js").read_text())
    result = page.evaluate("async () => await axe.run(document)")
    return [v for v in result["violations"] if v["impact"] in impacts]
