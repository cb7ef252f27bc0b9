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


# One Playwright and one Chromium per module, stopped when the module's tests are done: while
# a sync Playwright runs, its event loop is the thread's running loop, so every other test of
# the same process that calls asyncio.run() would fail ("cannot be called from a running
# event loop"). Two modules' fixtures are never alive at once (a second sync Playwright beside
# the first fails too): pytest tears a module's fixtures down before the next module's test.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for a module's tests; each test opens its own context."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is required for this test (make test installs it: " \
                "apt-get install chromium)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def axe_violations(page: Any, impacts: tuple[str, ...] = ("serious", "critical")) -> list[Any]:
    """axe-core's violations of ``impacts`` on the page as it is now (axe-core from npm,
    injected into the page by the test, not served by stampd)."""
    page.add_script_tag(content=node_module("axe-core/axe.min.js").read_text())
    result = page.evaluate("async () => await axe.run(document)")
    return [v for v in result["violations"] if v["impact"] in impacts]
