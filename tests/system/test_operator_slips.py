"""Operator slips against a real server: a second server (or worker pool) on a data directory
that one serves."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    Server,
    free_port,
    run_stampd,
    seed_data_dir,
    stamp_tag,
    start_server,
)

COMMIT = "a" * 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("slips") / "data")
    server = start_server(data, workers=1)
    yield server
    server.stop()
    shutil.rmtree(server.runtime_dir, ignore_errors=True)


def stampd(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m stampd ARGS`` with the server's environment (its runtime directory: what
    it starts would be found and stopped with the server's)."""
    return run_stampd(args, env=server.env)


def test_a_second_server_on_the_same_data_dir_exits_and_the_first_serves_on(
        server: Server) -> None:
    data = str(server.data_dir)
    run_dir = server.data_dir / "run"
    before = sorted(p.name for p in run_dir.iterdir())
    second = stampd(server, "serve", "--data-dir", data, "--port", str(free_port()),
                    "--workers", "1")
    assert second.returncode == 1, second.stderr
    assert second.stderr == (f"stampd serve: stampd serve (pid {server.proc.pid}) is running "
                             f"on data directory {data}: stop it first, or give this one "
                             "another --data-dir\n")
    # A worker pool beside the server's own would join it (and one serve --no-workers
    # beside it would serve its dispatch socket): refused alike.
    worker = stampd(server, "worker", "--data-dir", data, "--workers", "1")
    assert worker.returncode == 1, worker.stderr
    assert worker.stderr == (f"stampd worker: the worker pool of stampd serve (pid "
                             f"{server.proc.pid}) is running on data directory {data}: stop it "
                             "first, or give this one another --data-dir\n")
    no_workers = stampd(server, "serve", "--no-workers", "--data-dir", data, "--port",
                        str(free_port()))
    assert no_workers.returncode == 1 and f"(pid {server.proc.pid})" in no_workers.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before  # serve.sock is still there
    assert (run_dir / "serve.lock").read_text() == f"{server.proc.pid} stampd serve\n"
    # The first serves on, and a worker that dies reconnects to it.
    assert "BEGIN PGP SIGNATURE" in stamp_tag(server, COMMIT)
    os.kill(server.worker_pids()[0], 9)
    server.wait_ready()
    assert "BEGIN PGP SIGNATURE" in stamp_tag(server, COMMIT, "t2")


def test_the_lock_is_no_child_s(server: Server) -> None:
    """Only the server holds its locks (close-on-exec): its children (worker supervisor,
    workers, agents) never inherit them, so none can outlive it holding one."""
    locks = {str(server.data_dir / "run" / name) for name in ("serve.lock", "workers.lock")}
    holders = []
    for pid in [*server.worker_pids(), *server.agent_pids()]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in locks:
                    holders.append(pid)
            except OSError:
                pass
    assert holders == []
    own = {os.readlink(f"/proc/{server.proc.pid}/fd/{fd}")
           for fd in os.listdir(f"/proc/{server.proc.pid}/fd")}
    assert locks <= own


def test_a_worker_beside_a_no_workers_server_is_allowed_once(tmp_path: Path) -> None:
    """``stampd serve --no-workers`` leaves the worker lock free for one ``stampd worker``;
    a second worker pool on the data directory is refused."""
    from server.commands import WORKERS_LOCK, DataDirLock
    from server.errors import CommandFailed

    run_dir = tmp_path / "run"
    first = DataDirLock(run_dir, WORKERS_LOCK, "stampd worker")
    first.acquire()
    try:
        second = DataDirLock(run_dir, WORKERS_LOCK, "stampd worker")
        with pytest.raises(CommandFailed, match=rf"stampd worker \(pid {os.getpid()}\)"):
            second.acquire(create=False)
        assert second.fd is None
    finally:
        first.release()
    again = DataDirLock(run_dir, WORKERS_LOCK, "stampd worker")
    again.acquire(create=False)  # free once released (the kernel frees it when one dies)
    again.release()
    absent = DataDirLock(tmp_path / "absent" / "run", WORKERS_LOCK, "stampd worker")
    absent.acquire(create=False)
    assert absent.fd is None and not (tmp_path / "absent").exists()


def test_upgrade_h2c_is_answered_as_http1_without_a_warning(server: Server) -> None:
    """HTTP/2-capable clients send ``Upgrade: h2c``: each request is answered as HTTP/1.1,
    and none adds a WARNING line to the server's log (uvicorn logged one each)."""
    import http.client

    before = server.log_path.read_text()
    headers = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c",
               "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"}
    for _ in range(50):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("GET", "/healthz", headers=headers)
            r = conn.getresponse()
            assert (r.status, r.version, r.read()) == (200, 11, b"ok\n")
        finally:
            conn.close()
    stamp_tag(server, COMMIT, "after")  # (its log lines are written by now)
    added = server.log_path.read_text()[len(before):]
    assert [line for line in added.splitlines() if "WARNING" in line] == []


def test_upgrade_h2c_requests_keep_their_body_and_their_connection(server: Server) -> None:
    """A POST with ``Upgrade: h2c`` is served with its body (llhttp stops at an upgrade
    request's headers: uvicorn served it empty, 400 "empty body"), and the connection goes on
    serving the requests that follow, upgrade or not; a chunked body with Upgrade is refused
    (stampd takes no chunked POST bodies: 411, or 400 where the parser sees it first)."""
    import hashlib
    import http.client

    upgrade = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c",
               "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"}
    digest = hashlib.sha256(b"stamped over an h2c upgrade").hexdigest()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        for _ in range(2):  # (the second on the same connection, after the first)
            conn.request("POST", "/v1/stamps", body=f"sha256={digest}",
                         headers={**upgrade, "Content-Type": "application/x-www-form-urlencoded"})
            r = conn.getresponse()
            body = r.read()
            assert r.status == 200 and f"digest: {digest}".encode() in body, body
        conn.request("GET", "/healthz", headers=upgrade)
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"ok\n")
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b"ok\n")
        conn.putrequest("POST", "/v1/stamps")
        for name, value in {**upgrade, "Transfer-Encoding": "chunked",
                            "Content-Type": "application/x-www-form-urlencoded"}.items():
            conn.putheader(name, value)
        conn.endheaders(b"4\r\nsha2\r\n0\r\n\r\n")
        r = conn.getresponse()
        assert r.status in (400, 411), r.read()  # (a body of no Content-Length: refused)
    finally:
        conn.close()


def test_a_typo_in_a_revision_creates_no_database(tmp_path: Path) -> None:
    data = tmp_path / "data"
    r = run_stampd(["db", "upgrade", "BADREV", "--data-dir", data])
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "unknown revision 'BADREV'" in r.stderr
    assert not data.exists()


@pytest.mark.parametrize("content", [None, b"not a key\n"])
def test_keys_import_of_no_key_says_so_in_one_line_and_writes_nothing(
        tmp_path: Path, content: bytes | None) -> None:
    source = tmp_path / "key.asc"
    if content is not None:
        source.write_bytes(content)
    data = tmp_path / "data"
    r = run_stampd(["keys", "import", source, "--data-dir", data])
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "\\n" not in r.stderr, r.stderr
    assert ("No such file" if content is None else "no valid OpenPGP data") in r.stderr
    assert not (data / "keys").exists()
