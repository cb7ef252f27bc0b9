"""Bad input over real HTTP: the expected 4xx, a plain-text reason, and no journal row."""

from __future__ import annotations

import http.client
import select
import socket
import sqlite3
import urllib.parse
from collections.abc import Iterator

import pytest

from tests.helpers import Server, seed_data_dir, start_server

C = "0123456789abcdef0123456789abcdef01234567"
T = "89abcdef0123456789abcdef0123456789abcdef"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("errors") / "data")
    s = start_server(data, workers=1, extra_env={"STAMPD_BODY_TIMEOUT": "1.5",
                                                 "STAMPD_KEEPALIVE_TIMEOUT": "2"})
    yield s
    s.stop()


def journal_rows(server: Server) -> int:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return int(db.execute("select count(*) from stamps").fetchone()[0])


def post(server: Server, body: bytes, ctype: str | None = FORM,
         headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    h = dict(headers or {})
    if ctype is not None:
        h["Content-Type"] = ctype
    conn.request("POST", "/", body=body, headers=h)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return r.status, text, dict(r.getheaders())


def form(**fields: str) -> bytes:
    return urllib.parse.urlencode(fields).encode()


def multipart(fields: dict[str, str], file: bool = False) -> tuple[bytes, str]:
    boundary = "----stampdtestboundary"
    parts = []
    for name, value in fields.items():
        disp = f'form-data; name="{name}"' + ('; filename="x.txt"' if file else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n{value}\r\n")
    body = "".join(parts) + f"--{boundary}--\r\n"
    return body.encode(), f"multipart/form-data; boundary={boundary}"


BAD_FORMS = {
    "invalid hex": form(request="stamp-tag-v1", commit="z" * 40, tagname="t"),
    "uppercase hex": form(request="stamp-tag-v1", commit=C.upper(), tagname="t"),
    "39 chars": form(request="stamp-tag-v1", commit=C[:39], tagname="t"),
    "41 chars": form(request="stamp-tag-v1", commit=C + "a", tagname="t"),
    "newline in commit": form(request="stamp-tag-v1", commit=C + "\n", tagname="t"),
    "newline in tagname": form(request="stamp-tag-v1", commit=C, tagname="t\nobject x"),
    "dotdot tagname": form(request="stamp-tag-v1", commit=C, tagname="a..b"),
    "101-char tagname": form(request="stamp-tag-v1", commit=C, tagname="a" * 101),
    "unknown request": form(request="stamp-everything-v1", commit=C),
    "missing request": form(commit=C, tagname="t"),
    "missing commit": form(request="stamp-tag-v1", tagname="t"),
    "missing tagname": form(request="stamp-tag-v1", commit=C),
    "missing tree": form(request="stamp-branch-v1", commit=C),
    "bad parent": form(request="stamp-branch-v1", commit=C, tree=T, parent="x"),
    "duplicate field": b"request=stamp-tag-v1&commit=" + C.encode() + b"&commit="
    + C.encode() + b"&tagname=t",
    "non-utf8 escape": b"request=stamp-tag-v1&commit=%ff&tagname=t",
    "non-ascii body": "request=stamp-tag-v1&tagname=\u00e9".encode(),
}


@pytest.mark.parametrize("name", sorted(BAD_FORMS))
def test_bad_fields_406(server: Server, name: str) -> None:
    before = journal_rows(server)
    status, text, headers = post(server, BAD_FORMS[name])
    assert status == 406, text
    assert headers["content-type"].startswith("text/plain")
    assert text.strip() and len(text) < 200
    assert journal_rows(server) == before


@pytest.mark.parametrize("ctype", ["text/plain", "application/json", "application/xml", None])
def test_wrong_content_type_415(server: Server, ctype: str | None) -> None:
    before = journal_rows(server)
    status, _, _ = post(server, form(request="stamp-tag-v1", commit=C, tagname="t"), ctype)
    assert status == 415
    assert journal_rows(server) == before


def test_oversized_body_413(server: Server) -> None:
    before = journal_rows(server)
    body = form(request="stamp-tag-v1", commit=C, tagname="t", pad="x" * 2000)
    status, _, _ = post(server, body)
    assert status == 413
    assert journal_rows(server) == before


def raw_exchange(server: Server, request: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if length and len(rest) >= length[0]:
                    break
        return b"".join(chunks)


def test_chunked_without_length_411(server: Server) -> None:
    before = journal_rows(server)
    body = form(request="stamp-tag-v1", commit=C, tagname="t")
    req = (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: " + FORM.encode()
           + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
           + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    answer = raw_exchange(server, req)
    assert answer.startswith(b"HTTP/1.1 411 "), answer[:100]
    assert journal_rows(server) == before


def test_lying_content_length_times_out_408(server: Server) -> None:
    """A Content-Length larger than the body: answered within the body timeout, nothing kept."""
    before = journal_rows(server)
    body = form(request="stamp-tag-v1", commit=C, tagname="t")
    req = (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: " + FORM.encode()
           + f"\r\nContent-Length: {len(body) + 50}\r\n\r\n".encode() + body)
    answer = raw_exchange(server, req, timeout=15)  # only the body timeout answers 408
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
    assert journal_rows(server) == before


def test_idle_connection_is_closed(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        assert s.recv(1) == b""  # the server hangs up on its own (else recv times out)


def test_unknown_get_request_406(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/?request=get-private-key-v1")
    assert conn.getresponse().status == 406


def test_public_key(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/?request=get-public-key-v1")
    r = conn.getresponse()
    assert r.status == 200
    assert r.getheader("content-type") == "application/pgp-keys"
    text = r.read().decode()
    assert text == (server.data_dir / "keys" / "pubkey.asc").read_text()
    assert "PRIVATE" not in text


@pytest.mark.parametrize(
    "fields",
    [
        {"request": "stamp-tag-v1", "commit": C, "tagname": "a..b"},
        {"request": "stamp-tag-v1", "commit": C.upper(), "tagname": "t"},
        {"request": "stamp-nothing-v1"},
    ],
)
def test_multipart_bad_fields_406(server: Server, fields: dict[str, str]) -> None:
    before = journal_rows(server)
    body, ctype = multipart(fields)
    status, _, _ = post(server, body, ctype)
    assert status == 406
    assert journal_rows(server) == before


def test_multipart_file_upload_406(server: Server) -> None:
    before = journal_rows(server)
    body, ctype = multipart({"request": "stamp-tag-v1", "commit": C, "tagname": "t"}, file=True)
    status, _, _ = post(server, body, ctype)
    assert status == 406
    assert journal_rows(server) == before


def test_malformed_multipart_406(server: Server) -> None:
    before = journal_rows(server)
    status, _, _ = post(server, b"--nope\r\ngarbage", "multipart/form-data; boundary=zzz")
    assert status == 406
    assert journal_rows(server) == before


def test_multipart_accepted(server: Server) -> None:
    """zeitgitterd crashes on multipart bodies; we stamp them."""
    before = journal_rows(server)
    body, ctype = multipart({"request": "stamp-tag-v1", "commit": C, "tagname": "mp"})
    status, text, headers = post(server, body, ctype)
    assert status == 200, text
    assert headers["content-type"] == "application/x-git-object"
    assert text.startswith(f"object {C}\ntype commit\ntag mp\ntagger ")
    assert journal_rows(server) == before + 1


def test_slow_headers_are_cut_off(server: Server) -> None:
    """Headers dribbled a byte at a time do not keep a connection open past the timeout (2 s
    here): it is closed before they are all sent (a byte each 0.25 s, some 20 s in all). (No
    clock is read: a server cutting late on a loaded machine still cuts before the end.)"""
    request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: " + FORM.encode() + b"\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        closed = False
        for byte in request:
            try:
                s.sendall(bytes([byte]))
                # (the server's FIN, maybe after an answer: readable, then read to the end)
                if select.select([s], [], [], 0.25)[0]:
                    while s.recv(65536):
                        pass
                    closed = True
            except OSError:
                closed = True
            if closed:
                break
        assert closed, "the connection stayed open while its headers were dribbled"
