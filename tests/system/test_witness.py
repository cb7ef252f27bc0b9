"""stampd as a witness (docs/witness.md): a real ``stampd serve`` (one worker holding the
witness key in its own ssh-agent) fed ``add-checkpoint`` requests over HTTP by a log the test
makes with ``cryptography``. Cosignatures are verified with ``cryptography`` on the message the
spec defines (c2sp.org/tlog-cosignature), not with stampd's verifier; after each refusal the
state the witness keeps (its monitoring endpoint) is unchanged."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.client
import shutil
import socket
import struct
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from formats.note import ED25519_COSIGNATURE, VerifierKey
from formats.sshsig import SshPublicKey
from formats.tlog.witness import MAX_REQUEST_BYTES, AddCheckpoint
from tests.helpers import Server, WitnessedLog, run_stampd, seed_data_dir, start_server, wait_for

LOG = WitnessedLog("example.org/log-a", leaves=40)
OTHER = WitnessedLog("example.org/log-b", leaves=8)  # a log the witness was not told of
NAME = "witness.example/w1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(seed_data_dir(tmp_path_factory.mktemp("witness") / "data"), workers=1,
                     extra_env={"STAMPD_WITNESS_FOR": LOG.vkey, "STAMPD_WITNESS_NAME": NAME})
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


def request(server: Server, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    conn.close()
    return out


def add(server: Server, body: bytes) -> tuple[int, dict[str, str], bytes]:
    return request(server, "POST", "/add-checkpoint", body)


def stored(server: Server, log: WitnessedLog = LOG) -> tuple[int, bytes]:
    status, _, body = request(server, "GET",
                              f"/{hashlib.sha256(log.origin.encode()).hexdigest()}/checkpoint")
    return status, body


def witness_key(server: Server) -> VerifierKey:
    status, headers, body = request(server, "GET", "/tlog/witness-vkey")
    assert status == 200 and headers["content-type"].startswith("text/plain"), body
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    return VerifierKey.parse(body.decode().strip())


def check_cosignature(server: Server, size: int, answer: bytes) -> int:
    """The cosignature line's timestamp, once it verifies (``cryptography``, the spec's
    message: the header line, ``time <t>``, then the checkpoint's body)."""
    key = witness_key(server)
    assert key.sig_type == ED25519_COSIGNATURE and key.name == NAME
    line = answer.decode()
    assert line.endswith("\n") and line.count("\n") == 1
    assert line.startswith(f"\u2014 {NAME} ")
    blob = base64.b64decode(line.rsplit(" ", 1)[1])
    assert struct.unpack(">I", blob[:4])[0] == key.key_id
    (timestamp,) = struct.unpack(">Q", blob[4:12])
    body = LOG.checkpoint(size).split(b"\n\n")[0] + b"\n"
    message = b"cosignature/v1\ntime %d\n" % timestamp + body
    Ed25519PublicKey.from_public_bytes(key.public_key).verify(blob[12:], message)
    return int(timestamp)


def test_a_chain_of_checkpoints_is_cosigned_and_stored(server: Server) -> None:
    assert stored(server)[0] == 404  # nothing cosigned yet
    old = 0
    for size in (3, 3, 10, 17, 32):
        status, headers, body = add(server, LOG.request(old, size))
        assert status == 200, body
        assert headers["content-type"].startswith("text/plain")
        assert check_cosignature(server, size, body) > 1_700_000_000
        # the log's signature, then ours (written just after the answer)
        wait_for(functools.partial(lambda b: stored(server)[1].endswith(b), body),
                 what="the cosigned note stored")
        status, note = stored(server)
        assert status == 200
        assert note == LOG.checkpoint(size) + body
        old = size


def state_unchanged(server: Server, before: bytes) -> None:
    assert stored(server) == (200, before)


@pytest.fixture
def before(server: Server) -> bytes:
    status, note = stored(server)
    if status == 404:
        assert add(server, LOG.request(0, 5))[0] == 200
        status, note = stored(server)
    assert status == 200
    return note


def known_size(server: Server) -> int:
    note = stored(server)[1]
    return int(note.split(b"\n")[1])


def test_unknown_origin_404(server: Server, before: bytes) -> None:
    status, _, _ = add(server, OTHER.request(0, 4))
    assert status == 404
    state_unchanged(server, before)
    assert stored(server, OTHER)[0] == 404


def test_bad_or_missing_log_signature_403(server: Server, before: bytes) -> None:
    n = known_size(server)
    impostor = WitnessedLog(LOG.origin, leaves=40)  # same origin, another key
    assert add(server, impostor.request(n, n + 2))[0] == 403
    # the right key's name and id, but a signature of another text
    good = LOG.checkpoint(n + 2)
    other = LOG.checkpoint(n + 3)
    forged = good.split(b"\n\n")[0] + b"\n\n" + other.split(b"\n\n")[1]
    assert add(server, LOG.request(n, n + 2, checkpoint=forged))[0] == 403
    state_unchanged(server, before)


def test_malformed_and_old_above_size_400(server: Server, before: bytes) -> None:
    n = known_size(server)
    for body in (b"", b"old x\n\n" + LOG.checkpoint(n + 1), b"old 1\n",
                 b"old 01\n\n" + LOG.checkpoint(n + 1),
                 b"old 0\nnot base64!\n\n" + LOG.checkpoint(1),
                 b"old 0\n\nnot a checkpoint\n"):
        status, _, answer = add(server, body)
        assert status == 400, (body, answer)
    assert add(server, LOG.request(n + 3, n + 2, proof=()))[0] == 400  # old > size
    state_unchanged(server, before)


def test_stale_or_rolled_back_old_size_409(server: Server, before: bytes) -> None:
    n = known_size(server)
    for old, new in ((n - 1, n + 1), (0, n + 1), (n + 1, n + 4)):
        status, headers, body = add(server, LOG.request(old, new))
        assert status == 409
        assert headers["content-type"] == "text/x.tlog.size"
        assert body == b"%d\n" % n
    state_unchanged(server, before)


def test_bad_proof_and_fork_422(server: Server, before: bytes) -> None:
    n = known_size(server)
    proof = LOG.proof(n, n + 6)
    bad = (bytes(32), *proof[1:])
    assert add(server, LOG.request(n, n + 6, proof=bad))[0] == 422
    # a fork: the log's own key signing another tree of the size cosigned
    forked = LOG.checkpoint(n, root=hashlib.sha256(b"another tree").digest())
    assert add(server, LOG.request(n, n, checkpoint=forked, proof=()))[0] == 422
    # and of a larger size, whose proof cannot hold
    grown = LOG.checkpoint(n + 6, root=hashlib.sha256(b"another tree").digest())
    assert add(server, LOG.request(n, n + 6, checkpoint=grown))[0] == 422
    state_unchanged(server, before)


def test_a_body_over_the_limit_413(server: Server, before: bytes) -> None:
    n = known_size(server)
    body = LOG.request(n, n + 1) + b"x" * MAX_REQUEST_BYTES
    assert add(server, body)[0] == 413
    # announced with no length: refused while it streams

    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_REQUEST_BYTES // 4096 + 2):
            yield b"y" * 4096

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/add-checkpoint", body=chunks(), encode_chunked=True,
                 headers={"Transfer-Encoding": "chunked"})
    r = conn.getresponse()
    assert r.status == 413
    conn.close()
    state_unchanged(server, before)


def test_the_witness_key_signs_no_stamp(server: Server) -> None:
    public = (server.data_dir / "keys" / "witness-ed25519" / "id.pub").read_text()
    fingerprint = SshPublicKey.from_line(public).fingerprint
    body = urllib.parse.urlencode({"request": "stamp-tag-v1", "commit": "a" * 40,
                                   "tagname": "t", "key": fingerprint}).encode()
    status, _, answer = request(server, "POST", "/", body,
                                {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 406 and b"witness key" in answer, answer


def test_request_round_trip_is_what_is_sent() -> None:
    body = LOG.request(3, 10)
    assert AddCheckpoint.parse(body).encode() == body


def test_keys_show_prints_the_witness_vkey(server: Server) -> None:
    r = run_stampd(["keys", "show", "--data-dir", server.data_dir], env=server.env,
                   cwd=Path.cwd())
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"witness key: {witness_key(server).encode()}\n" in out


def test_the_status_page_shows_the_witness_vkey(server: Server) -> None:
    status, _, page = request(server, "GET", "/", headers={"Accept": "text/html"})
    assert status == 200
    assert f'<pre id="witness-vkey">{witness_key(server).encode()}</pre>'.encode() in page


def test_a_request_too_large_gets_its_413_while_its_body_still_comes(server: Server) -> None:
    """``Connection: close`` and 4 MiB for ``/add-checkpoint`` (at most 65,536 bytes): the 413
    goes out before the body is read, and the server half-closes and drops what still comes,
    rather than closing with the body unread, which reset the connection and lost the answer
    (28 times in 40; make fuzz met it once in 10,000 requests)."""
    n = 4 << 20
    head = (f"POST /add-checkpoint HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
            f"Connection: close\r\nContent-Length: {n}\r\n\r\n").encode()
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 60, 0))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(head + b"x" * n)  # (the server may stop reading: it answered)
            sock.settimeout(60)
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except ConnectionResetError:
                raise AssertionError(f"reset: the answer lost (got {data!r})") from None
        assert data.startswith(b"HTTP/1.1 413 "), data[:200]
        assert str(MAX_REQUEST_BYTES).encode() in data.partition(b"\r\n\r\n")[2], data
