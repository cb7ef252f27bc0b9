"""The browser pages are served by stampd itself with a strict Content-Security-Policy, load
nothing from elsewhere, and run in a real Chromium (docs/web.md)."""

from __future__ import annotations

import gzip
import http.client
import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import browser  # noqa: F401  (a fixture)
from tests.helpers import Server, seed_data_dir, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(seed_data_dir(tmp_path_factory.mktemp("web") / "data"), workers=1,
                     extra_env={"STAMPD_TLOG": "true"})
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


def get(server: Server, path: str, headers: dict[str, str] | None = None
        ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("page", ["stamp", "verify"])
def test_page_headers_and_config(server: Server, page: str) -> None:
    status, headers, body = get(server, f"/{page}")
    assert status == 200, body
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self' 'wasm-unsafe-eval'" in csp
    assert ("connect-src 'none'" if page == "verify" else "connect-src 'self'") in csp
    html = body.decode()
    config = json.loads(html.split('id="stampd-config">', 1)[1].split("</script>", 1)[0])
    key = config["keys"][0]
    assert key["fingerprint"] and "BEGIN PGP PUBLIC KEY" in key["public"]
    assert config["tlog"]["vkey"].startswith(config["tlog"]["origin"] + "+")
    for name in config["assets"].values():
        status, headers, data = get(server, f"/web/{name}", {"Accept-Encoding": "gzip"})
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert "immutable" in headers["cache-control"] and gzip.decompress(data)
    assert "http://" not in html.replace(config["server"], "")  # nothing from elsewhere


def test_static_refuses_other_paths(server: Server) -> None:
    for path in ("/web/..%2fapi%2fweb.py", "/web/.hidden", "/web/nope.js", "/web/assets.json%00"):
        status, _, _ = get(server, path)
        assert status == 404, path


@pytest.mark.parametrize("page", ["stamp", "verify"])
def test_page_runs_in_chromium(server: Server, browser: Any, page: str) -> None:  # noqa: F811
    context = browser.new_context()
    try:
        tab = context.new_page()
        errors: list[str] = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        outside: list[str] = []
        tab.on("request", lambda r: outside.append(r.url)
               if not r.url.startswith(server.url) else None)
        tab.goto(server.url + page)
        tab.wait_for_selector("body[data-ready='1']", timeout=15_000)
        assert errors == [] and outside == []
        key = tab.text_content("#server-key")
        assert key and len(key) >= 40
    finally:
        context.close()


def test_status_page_fits_a_narrow_screen(server: Server, browser: Any) -> None:  # noqa: F811
    """At 320 px wide nothing pushes the page sideways (wide tables scroll on their own)."""
    context = browser.new_context(viewport={"width": 320, "height": 800})
    try:
        tab = context.new_page()
        tab.goto(server.url)
        assert tab.locator("a[href='/stamp']").count() == 1
        assert tab.evaluate("document.scrollingElement.scrollWidth") <= 320
    finally:
        context.close()
