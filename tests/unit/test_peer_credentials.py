"""A peer URL with credentials (``http://ops:SECRET@host/``): they go as HTTP basic
authentication, and no error (shown on the status page, logged) names them."""

from __future__ import annotations

import base64
import http.server
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from server.errors import PeerError
from server.gitlog.peers import _http

SECRET = "s3cr3t-T0KEN"


@pytest.fixture
def refusing() -> Iterator[tuple[int, list[str | None]]]:
    """A loopback HTTP server that answers every request 500, recording its Authorization."""
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        t.join(10)


def test_a_peer_urls_credentials_go_as_a_header_and_nowhere_else(
        refusing: tuple[int, list[str | None]], caplog: pytest.LogCaptureFixture) -> None:
    port, seen = refusing
    caplog.set_level(logging.DEBUG)
    with pytest.raises(PeerError) as e:
        _http(f"http://ops:{SECRET}@127.0.0.1:{port}/", None, 10)
    assert seen == ["Basic " + base64.b64encode(f"ops:{SECRET}".encode()).decode()]
    assert e.value.message == f"HTTP 500 from http://127.0.0.1:{port}/"
    assert SECRET not in caplog.text
    # Unreachable (a port bound, not listening: refused): the error names the URL without
    # them too.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        with pytest.raises(PeerError) as e:
            _http(f"http://ops:{SECRET}@127.0.0.1:{port}/", None, 10)
    assert SECRET not in e.value.message and f"127.0.0.1:{port}" in e.value.message
