"""The hot path's direct answers (`server.runtime.httpproto.whole_body` / `respond`) on a real
uvicorn server with stampd's protocol: the protocol hands the request's cycle to the app, a
body that arrived whole is taken without ``receive``, the answer goes out in one write with
uvicorn's default headers, and keep-alive, ``Connection: close`` and a body still arriving
(``Expect: 100-continue``) behave as through ASGI."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from server.runtime import httpproto
from server.runtime.httpproto import StampdHttpProtocol, respond, whole_body


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    direct = httpproto._cycle_of(scope) is not None
    body = whole_body(scope, 100)
    taken = b"whole"
    if body is None:  # read as ASGI does
        taken, body = b"receive", b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    await respond(scope, send, 200, [(b"x-direct", b"1" if direct else b"0"),
                                     (b"x-taken", taken)], body)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=StampdHttpProtocol,
                            loop="asyncio", lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        threading.Event().wait(0.05)
    assert server.started, "uvicorn did not start"
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(10)
    assert not thread.is_alive()


def read_answer(s: socket.socket) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One answer with a Content-Length from ``s``: status line, headers, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, "connection closed before the answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines)}
    while len(body) < int(headers[b"content-length"]):
        chunk = s.recv(4096)
        assert chunk, "connection closed in the body"
        body += chunk
    return status, headers, body


def test_a_whole_body_is_taken_and_answered_directly_on_a_kept_connection(port: int) -> None:
    # Each request is one write, so that its body arrives with its head (http.client writes
    # them apart, and then whether the body is there when the app runs is a race).
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for body in (b"one", b"two"):
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n" + body)
            status, headers, answer = read_answer(s)
            assert status.startswith(b"HTTP/1.1 200 ") and answer == body
            assert headers[b"x-direct"] == b"1" and headers[b"x-taken"] == b"whole"
            assert headers[b"content-length"] == b"3"
            assert headers.get(b"date") and b"connection" not in headers
        # the connection was kept: a third request on it is answered too
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert read_answer(s)[0].startswith(b"HTTP/1.1 200 ")


def test_connection_close_is_answered_and_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"\r\nconnection: close" in head.lower()
    assert body == b"hi"


def test_a_body_after_100_continue_goes_through_receive(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(b"later")
        data = s.recv(4096)
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"\r\n\r\nlater")
    assert b"x-taken: receive" in data
