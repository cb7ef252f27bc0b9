"""The budgets of POST /v1/manifests against real servers (docs/manifests.md, "Budgets"): the
host's hourly bytes hold across its HTTP processes, a refusal comes before the body is read
and records nothing, and manifest bytes in flight beyond the budget are refused with 503."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import select
import socket
import sqlite3
from collections.abc import Iterator

import pytest

from tests.helpers import Server, seed_data_dir, start_server, wait_for

pytestmark = pytest.mark.slow


def body(i: int, lines: int = 10) -> bytes:
    return "".join(f"{hashlib.sha256(f'{i}/{n}'.encode()).hexdigest()} *f{n}\n"
                   for n in range(lines)).encode()


SIZE = len(body(0))


def post(server: Server, data: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/v1/manifests", data,
                     {"Content-Type": "text/plain", "Connection": "close"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def manifests(server: Server) -> int:
    db = sqlite3.connect(server.data_dir / "stampd.sqlite3")
    try:
        return int(db.execute("SELECT count(*) FROM stamps WHERE kind='manifest'").fetchone()[0])
    finally:
        db.close()


def headers_only(server: Server, length: int) -> socket.socket:
    """A manifest request whose body has not come yet (one byte of it sent)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    s.sendall(b"POST /v1/manifests HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % length)
    return s


def answer(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def serving(factory: pytest.TempPathFactory, name: str, env: dict[str, str],
            api_processes: int = 1) -> Iterator[Server]:
    """A module's server (one worker, the settings ``env``), stopped when it is done."""
    srv = start_server(seed_data_dir(factory.mktemp(name) / "data"), workers=1,
                       api_processes=api_processes, extra_env=env)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two HTTP processes; the host takes 3 bodies an hour, a client any number."""
    yield from serving(tmp_path_factory, "rate",
                       {"STAMPD_MANIFEST_BYTES_PER_HOUR": str(3 * SIZE),
                        "STAMPD_MANIFEST_BYTES_PER_CLIENT_HOUR": "0"}, api_processes=2)


def test_the_hosts_hourly_bytes_hold_across_its_http_processes(limited: Server) -> None:
    statuses = []
    for i in range(6):  # each on a new connection: either HTTP process may take it
        status, headers, text = post(limited, body(i))
        statuses.append(status)
        if status == 429:
            problem = json.loads(text)
            assert headers["content-type"] == "application/problem+json"
            assert problem["status"] == 429 and "manifest bytes this hour" in problem["detail"]
            assert 1 <= int(headers["retry-after"]) <= 3600
        else:
            assert status == 200, text
    assert statuses.count(200) == 3 and statuses[:3] == [200] * 3
    assert manifests(limited) == 3  # nothing recorded of a refused one
    # Refused on its headers, before a byte of its body is read.
    s = headers_only(limited, SIZE)
    assert answer(s).startswith(b"HTTP/1.1 429 ")


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One HTTP process with room for one small manifest in flight."""
    yield from serving(tmp_path_factory, "flight",
                       {"STAMPD_MANIFEST_BYTES_IN_FLIGHT": str(SIZE + 10)})


def test_manifest_bytes_in_flight_beyond_the_budget_are_refused_with_503(
        narrow: Server) -> None:
    first = body(1)
    held = headers_only(narrow, len(first))
    held.sendall(first[:1])
    seen: list[tuple[int, dict[str, str]]] = []

    def refused() -> bool:
        status, headers, _ = post(narrow, body(2))
        seen.append((status, headers))
        return status == 503

    wait_for(refused, timeout=30, what="a 503 while a manifest is in flight")
    assert seen[-1][1]["retry-after"] == "10"
    held.sendall(first[1:])
    assert answer(held).startswith(b"HTTP/1.1 200 ")  # the one in flight is signed
    assert post(narrow, body(3))[0] == 200  # and its bytes are given back


def test_the_bytes_in_flight_are_held_until_the_answer_is_sent(narrow: Server) -> None:
    # An answer of about 7.5 MiB, more than the sockets between server and client hold, to a
    # client that reads its status line and then nothing: the server holds the signed text
    # until it is sent, so its bytes stay in flight.
    big = body(5, 100_000)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(60)
    s.connect(("127.0.0.1", narrow.port))
    s.sendall(b"POST /v1/manifests HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(big) + big)
    first = s.recv(4096)
    assert first.startswith(b"HTTP/1.1 200 ")
    status, headers, _ = post(narrow, body(6))
    assert status == 503 and headers["retry-after"] == "10"
    signed = (first + answer(s)).partition(b"\r\n\r\n")[2]
    assert b"\n# lines: 100000\n" in signed and signed.endswith(b"-----END PGP SIGNATURE-----\n")
    assert post(narrow, body(7))[0] == 200  # sent: its bytes are given back


BIG = len(body(0, 20_000))  # about 1.5 MiB: more than a frame may hold (formats.frames.MAX_FRAME)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One HTTP process with room for two 1.5 MiB manifests in flight."""
    yield from serving(tmp_path_factory, "two",
                       # (the held bodies must not time out while the third is tried)
                       {"STAMPD_MANIFEST_BYTES_IN_FLIGHT": str(2 * BIG + 10),
                        "STAMPD_BODY_TIMEOUT": "120"})



def test_manifests_beyond_the_budget_wait_for_a_503_and_the_ones_taken_are_all_signed(
        two: Server) -> None:
    # Two manifests in flight (their bodies not yet all sent) hold the budget: a third is
    # refused with 503 and Retry-After, before its body is read, and records nothing.
    bodies = [body(10 + i, 20_000) for i in range(2)]
    held = [headers_only(two, len(b)) for b in bodies]
    for s, b in zip(held, bodies, strict=True):
        s.sendall(b[: len(b) // 2])
    seen: list[tuple[int, dict[str, str]]] = []

    def refused() -> bool:
        # The refusal comes before the body is read, so the server may answer and close while
        # the body is still being sent: the send's broken pipe is expected, and the answer is
        # read after it. (http.client raised BrokenPipeError there, losing the 503.)
        third = body(12, 20_000)
        s = headers_only(two, len(third))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(third)
        try:
            head = answer(s).partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        except ConnectionResetError:
            s.close()
            return False  # the answer was lost with the connection's reset: ask again
        status = int(head[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in head[1:])}
        seen.append((status, headers))
        return status == 503

    wait_for(refused, timeout=30, what="a 503 while two manifests are in flight")
    assert seen[-1][1]["retry-after"] == "10"
    assert {status for status, _ in seen} <= {200, 503}
    # The two taken are signed in full: their lines went to the worker as raw bytes after the
    # job's frame (each manifest is larger than a frame may be), and came back signed.
    for s, b in zip(held, bodies, strict=True):
        s.sendall(b[len(b) // 2:])
    for s, b in zip(held, bodies, strict=True):
        head, _, signed = answer(s).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert signed.count(b"-----BEGIN PGP SIGNATURE-----") == 1
        assert b"\n# lines: 20000\n" in signed and b + b"-----BEGIN PGP SIGNATURE" in signed
    db = sqlite3.connect(two.data_dir / "stampd.sqlite3")
    try:
        states = db.execute("SELECT state, count(*) FROM stamps WHERE kind='manifest' "
                            "GROUP BY state").fetchall()
    finally:
        db.close()
    taken = sum(1 for status, _ in seen if status == 200)
    assert states == [("signed", 2 + taken)], states
    assert "did not answer in time" not in two.log_path.read_text()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two HTTP processes with room for one small manifest in flight between them."""
    yield from serving(tmp_path_factory, "pair",
                       {"STAMPD_MANIFEST_BYTES_IN_FLIGHT": str(SIZE + 10),
                        "STAMPD_BODY_TIMEOUT": "120"}, api_processes=2)


def test_the_bytes_in_flight_are_one_budget_for_the_hosts_http_processes(pair: Server) -> None:
    # Eight manifests on connections of their own (the kernel spreads them over the two HTTP
    # processes), each held after its headers: one is taken, whichever process has it, and
    # the seven others are refused before their bodies are read. (Each process had a share
    # of its own, and always took one manifest: two were taken, and on 16 CPUs, five
    # processes, five maximal manifests where the budget holds two.) No byte of a body is
    # sent before the answer: a refused connection closed with bytes unread is reset, and the
    # reset can come before its 503 is read.
    bodies = [body(30 + i) for i in range(8)]
    held = [headers_only(pair, len(b)) for b in bodies]
    refused: dict[int, bytes] = {}

    def seven_refused() -> bool:
        waiting = [s for i, s in enumerate(held) if i not in refused]
        for s in select.select(waiting, [], [], 0)[0]:
            refused[held.index(s)] = answer(s)
        return len(refused) >= 7

    wait_for(seven_refused, timeout=30, what="seven manifests refused, one in flight")
    assert len(refused) == 7
    for text in refused.values():
        assert text.startswith(b"HTTP/1.1 503 ") and b"in flight on this server" in text
    (taken,) = set(range(len(held))) - set(refused)
    held[taken].sendall(bodies[taken])
    assert answer(held[taken]).startswith(b"HTTP/1.1 200 ")
    assert manifests(pair) == 1
