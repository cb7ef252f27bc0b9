"""Hardening over real HTTP: unparsable and ambiguous requests are refused with an exact 4xx,
leave no journal row and no traceback in the log; tag names git refuses are refused; every
answer carries ``X-Content-Type-Options: nosniff``, the status page a strict CSP; the database
file is private."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import shutil
import socket
import sqlite3
import stat
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Server

C = "0123456789abcdef0123456789abcdef01234567"
H256 = hashlib.sha256(b"hardening").hexdigest()
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
PROBLEM = "application/problem+json"
CSP = ("default-src 'none'; style-src 'sha256-{}'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")


def journal_rows(server: Server) -> int:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return int(db.execute("select count(*) from stamps").fetchone()[0])


def request(server: Server, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes, http.client.HTTPMessage]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read(), r.headers
    finally:
        conn.close()


def raw(server: Server, head: list[str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send a request with exactly these header lines (duplicates kept) and read the answer
    until the server closes the connection."""
    req = "\r\n".join([*head, "Connection: close", "", ""]).encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(req)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    top, _, rest = answer.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, rest


def no_traceback(server: Server) -> None:
    log = server.log_path.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, server.log()


def tag_form(tagname: str) -> bytes:
    return urllib.parse.urlencode({"request": "stamp-tag-v1", "commit": C,
                                   "tagname": tagname}).encode()


# --- unparsable bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"[" * 999, b'{"sha256":' + b"[" * 985,
                                  b"[" * 400 + b"]" * 400],
                         ids=["arrays", "in an object", "closed arrays"])
def test_nested_json_is_400_without_traceback(live_server: Server, body: bytes) -> None:
    before = journal_rows(live_server)
    status, answer, headers = request(live_server, "POST", "/v1/stamps", body,
                                      {"Content-Type": JSON})
    assert status == 400, answer
    assert headers["content-type"] == PROBLEM
    assert json.loads(answer)["status"] == 400
    assert journal_rows(live_server) == before
    no_traceback(live_server)


def test_duplicate_json_key_is_400(live_server: Server) -> None:
    before = journal_rows(live_server)
    body = json.dumps({"sha256": H256}).encode()[:-1] + b', "sha256": "' + H256.encode() + b'"}'
    status, answer, headers = request(live_server, "POST", "/v1/stamps", body,
                                      {"Content-Type": JSON})
    assert status == 400, answer
    assert headers["content-type"] == PROBLEM
    assert "more than once" in json.loads(answer)["detail"]
    assert journal_rows(live_server) == before


# --- duplicated headers ------------------------------------------------------------------------


def two_types(path: str, body: bytes) -> list[str]:
    return [f"POST {path} HTTP/1.1", "Host: x", f"Content-Type: {FORM}",
            "Content-Type: multipart/form-data; boundary=x", f"Content-Length: {len(body)}"]


def two_lengths(path: str, body: bytes, second: int) -> list[str]:
    return [f"POST {path} HTTP/1.1", "Host: x", f"Content-Type: {FORM}",
            f"Content-Length: {len(body)}", f"Content-Length: {second}"]


@pytest.mark.parametrize(("path", "body", "want"), [
    ("/", tag_form("t"), 406),
    ("/v1/stamps", f"sha256={H256}".encode(), 400),
], ids=["zeitgitter", "v1"])
def test_two_content_types_refused(live_server: Server, path: str, body: bytes,
                                   want: int) -> None:
    before = journal_rows(live_server)
    status, headers, answer = raw(live_server, two_types(path, body), body)
    assert status == want, answer
    assert b"Content-Type" in answer and b"more than once" in answer
    assert headers["x-content-type-options"] == "nosniff"
    assert journal_rows(live_server) == before


@pytest.mark.parametrize("path", ["/", "/v1/stamps"])
@pytest.mark.parametrize("same", [True, False], ids=["same", "differing"])
def test_two_content_lengths_refused(live_server: Server, path: str, same: bool) -> None:
    body = tag_form("t") if path == "/" else f"sha256={H256}".encode()
    before = journal_rows(live_server)
    status, _, answer = raw(live_server, two_lengths(path, body, len(body) if same else 3),
                            body)
    # llhttp (uvicorn's parser) refuses two Content-Length headers itself; stampd's own check
    # (`content_type`) refuses them too, with the front end's bad-request status.
    assert status in (400, 406 if path == "/" else 400), answer
    assert journal_rows(live_server) == before
    no_traceback(live_server)


# --- tag names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tagname", ["a.lock", "a.", "v1.0.", "x.lock.", "a.b.lock"])
def test_tag_names_git_refuses_are_406(live_server: Server, tagname: str) -> None:
    before = journal_rows(live_server)
    status, answer, headers = request(live_server, "POST", "/", tag_form(tagname),
                                      {"Content-Type": FORM})
    assert status == 406, answer
    assert headers["content-type"].startswith("text/plain")
    assert b"'.lock'" in answer
    assert journal_rows(live_server) == before


def test_tag_name_near_the_rules_is_stamped(live_server: Server) -> None:
    status, answer, headers = request(live_server, "POST", "/", tag_form("a.lock.b-LOCK"),
                                      {"Content-Type": FORM})
    assert status == 200, answer
    assert b"\ntag a.lock.b-LOCK\n" in answer
    assert headers["x-content-type-options"] == "nosniff"


# --- response headers --------------------------------------------------------------------------

EVERY_KIND = [
    ("GET", "/", None, {}),
    ("GET", "/", None, {"Accept": "text/html"}),
    ("GET", "/?request=get-public-key-v1", None, {}),
    ("GET", "/?request=nonsense", None, {}),
    ("POST", "/", tag_form("a."), {"Content-Type": FORM}),
    ("POST", "/", tag_form("nosniff"), {"Content-Type": FORM}),  # a stamp: 200
    ("POST", "/", b"x", {"Content-Type": "text/plain"}),
    ("POST", "/v1/stamps", f"sha256={H256}".encode(), {"Content-Type": FORM}),
    ("POST", "/v1/stamps", b"sha256=<script>", {"Content-Type": FORM}),
    ("GET", f"/v1/stamps/sha256/{'0' * 64}", None, {}),
    ("GET", "/v1/keys", None, {}),
    ("GET", "/healthz", None, {}),
    ("GET", "/readyz", None, {}),
    ("GET", "/metrics", None, {}),
    ("GET", "/log.git/info/refs", None, {}),
    ("GET", "/no/such/page", None, {}),
    ("DELETE", "/", None, {}),
]


@pytest.mark.parametrize(("method", "path", "body", "headers"), EVERY_KIND,
                         ids=[f"{m} {p} {i}" for i, (m, p, _, _) in enumerate(EVERY_KIND)])
def test_every_answer_is_nosniff(live_server: Server, method: str, path: str,
                                 body: bytes | None, headers: dict[str, str]) -> None:
    status, answer, got = request(live_server, method, path, body, headers)
    assert status < 500, answer
    assert got.get_all("x-content-type-options") == ["nosniff"], (status, dict(got))


def test_status_page_csp(live_server: Server) -> None:
    status, page, headers = request(live_server, "GET", "/", None, {"Accept": "text/html"})
    assert status == 200 and headers["content-type"].startswith("text/html")
    styles = re.findall(rb"<style>(.*?)</style>", page, re.S)
    assert len(styles) == 1
    digest = base64.b64encode(hashlib.sha256(styles[0]).digest()).decode()
    assert headers["content-security-policy"] == CSP.format(digest)
    assert headers["x-frame-options"] == "DENY"
    # The policy allows nothing the page does not need: no script, no style attribute, no
    # external asset, no frame.
    assert b"<script" not in page and b" style=" not in page
    assert b"<img" not in page and b"<iframe" not in page


def test_status_page_csp_blocks_nothing_in_chromium(live_server: Server, tmp_path: Path
                                                    ) -> None:
    """A real browser renders the page under its policy without a violation (a wrong style
    hash, for one, is reported on the console: "... The action has been blocked.")."""
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is required for this test (.ci/run installs it)"
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update",
                        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
                        "--v=0", "--dump-dom", live_server.url],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and "stampd timestamping server" in r.stdout, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if "Content Security Policy" in line
                or "blocked" in line], console


def test_plain_root_has_no_page_policy(live_server: Server) -> None:
    """The CSP belongs to the HTML page; the plain answers only carry nosniff."""
    _, _, headers = request(live_server, "GET", "/")
    assert "content-security-policy" not in headers


# --- the database file -------------------------------------------------------------------------


def test_database_files_are_0600(live_server: Server) -> None:
    """`stampd serve` created the journal: it and its WAL files are private to the owner."""
    path: Path = live_server.data_dir / "stampd.sqlite3"
    status, _, _ = request(live_server, "POST", "/v1/stamps", f"sha256={H256}".encode(),
                           {"Content-Type": FORM})
    assert status == 200  # the journal is written, so its WAL files exist
    files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files}
    assert modes == {f.name: "0o600" for f in files}


# --- answers written straight to the connection ----------------------------------------------


def _read_answer(f: Any) -> tuple[str, dict[str, str], bytes]:
    status = f.readline().decode("latin-1").strip()
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        assert name.lower() not in headers, f"header {name} twice"
        headers[name.lower()] = value.strip()
    return status, headers, f.read(int(headers["content-length"]))


def test_pipelined_stamps_are_answered_in_order_then_http10_closes(live_server: Server) -> None:
    """The hot path writes its answers itself: two stamps and a refusal pipelined on one
    keep-alive connection get their answers in order, each with one Content-Length and the
    server's own headers, and the connection stays open; an HTTP/1.0 request is answered with
    ``connection: close`` and the connection is closed."""

    def post(tagname: str, version: str = "1.1") -> bytes:
        body = tag_form(tagname)
        return (f"POST / HTTP/{version}\r\nHost: x\r\nContent-Type: {FORM}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as s:
        f = s.makefile("rb")
        s.sendall(post("piped-1") + post("bad..name") + post("piped-2"))
        answers = [_read_answer(f) for _ in range(3)]
        assert [a[0] for a in answers] == ["HTTP/1.1 200 OK", "HTTP/1.1 406 Not Acceptable",
                                           "HTTP/1.1 200 OK"]
        for (_, headers, body), name in zip(answers, ["piped-1", None, "piped-2"], strict=True):
            assert headers["x-content-type-options"] == "nosniff"
            assert "date" in headers and "connection" not in headers
            if name is not None:
                assert headers["content-type"] == "application/x-git-object"
                assert f"\ntag {name}\n".encode() in body and body.endswith(
                    b"-----END PGP SIGNATURE-----\n")
        s.sendall(post("piped-3", "1.0"))
        status, headers, body = _read_answer(f)
        assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close"
        assert b"\ntag piped-3\n" in body
        assert f.read() == b""  # closed by the server
    no_traceback(live_server)
