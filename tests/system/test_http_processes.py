"""Several HTTP processes on one host (`stampd serve --api-processes 2`): they share the port,
the workers, the journal and the log, whose one writer is the holder of the log lock; metrics
and /readyz add them up. (Faults: tests/system/test_faults.py.)"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import (
    Server,
    logged_hashes,
    proc_names,
    stamp_tag,
    start_server,
    wait_for,
)
from workers.manifest_check import IN_PROCESS_MAX

STAMPS = 60


def served_by_each(server: Server) -> list[int]:
    """Stamp requests answered by each HTTP process, as /metrics shows every process's last
    report to the coordinator (up to a quarter of a second old)."""
    with urllib.request.urlopen(server.url + "metrics", timeout=10) as r:
        text = r.read().decode()
    return [int(float(m.group(1))) if (m := re.search(
        rf'^stampd_http_process_requests_total{{process="{i}"}} (\S+)$', text, re.M)) else 0
        for i in range(2)]


def metric(server: Server, name: str) -> float:
    with urllib.request.urlopen(server.url + "metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_two_http_processes_share_port_workers_journal_and_log(
        seeded_dir: Path, server_factory: list[Server]) -> None:
    server = start_server(seeded_dir, workers=1, commit_interval=1, api_processes=2)
    server_factory.append(server)
    assert len(server.http_pids()) == 2
    status, ready = server.get_json("/readyz")
    assert status == 200
    checks = ready["checks"]
    assert isinstance(checks, dict)
    assert checks["http:0"]["ok"] and checks["http:1"]["ok"], checks

    # Each stamp on a connection of its own: the kernel spreads them over both processes
    # (all 60 on one would happen once in 2**59 runs), and one worker signs for both.
    commits = [f"{i:040x}" for i in range(1, STAMPS + 1)]
    for c in commits:
        assert c in stamp_tag(server, c)
    wait_for(lambda: sum(served_by_each(server)) == STAMPS, timeout=10,
             what="both processes' reports")
    assert all(n > 0 for n in served_by_each(server)), served_by_each(server)
    # Whichever process answers /metrics adds up all of them.
    wait_for(lambda: metric(server, 'stampd_requests_total{status="200",type="tag"}')
             == STAMPS, timeout=10, what="the total in /metrics")
    assert metric(server, "stampd_http_processes") == 2

    # One journal, one log: every stamp of either process is published, by one writer.
    wait_for(lambda: set(commits) <= logged_hashes(seeded_dir), timeout=30,
             what="every stamp in the log")
    assert server.log().count("is now the log writer") == 1


def test_a_clean_stop_with_two_http_processes_is_quiet(seeded_dir: Path) -> None:
    """SIGTERM to a server with two HTTP processes: the dispatcher hanging up on the workers
    is expected then, so nothing warns. An HTTP process that dies is restarted, and its
    workers never notice: they are connected to the host's dispatcher, in the coordinator."""
    server = start_server(seeded_dir, workers=2, api_processes=2)
    try:
        stamp_tag(server, "a" * 40)
        started = server.log().count("started worker")
        os.kill(server.http_pids()[0], signal.SIGKILL)
        wait_for(lambda: "HTTP process 0 (pid" in server.log(), timeout=30,
                 what="the HTTP manager seeing its process die")
        server.wait_ready()  # restarted
        before = len(server.log_path.read_text())
        stamp_tag(server, "b" * 40)
    finally:
        code = server.stop()
    log = server.log_path.read_text()
    assert code == 0, log
    assert "closed the connection" not in log[:before], log  # (the stop's own: INFO, below)
    assert log.count("started worker") == started, log
    loud = [line for line in log[before:].splitlines()
            if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)]
    assert not loud, "\n".join(loud)


def _fds(pid: int) -> set[str]:
    fd_dir = f"/proc/{pid}/fd"
    found = set()
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"{fd_dir}/{fd}"))
    return found


def test_http_processes_are_forked_by_a_manager_that_comes_back(seeded_dir: Path) -> None:
    """The HTTP manager (named stampd-api, a child of stampd serve) forks the HTTP processes
    (stampd-http-0 and -1); none of them holds the data directory's locks, which only stampd
    serve holds. Killed with SIGKILL, the manager takes its HTTP processes with it, and
    stampd serve starts another that starts them again: stamps are answered as before."""
    server = start_server(seeded_dir, workers=1, api_processes=2)
    try:
        names = proc_names()
        tree = server.http_tree(names)
        managers = [p for p in tree if names[p][0] == "stampd-api"]
        assert len(managers) == 1 and names[managers[0]][1] == server.proc.pid, names
        assert sorted(names[p][0] for p in server.http_pids()) == ["stampd-http-0",
                                                                  "stampd-http-1"]
        locks = {str(seeded_dir.resolve() / "run" / name) for name in ("serve.lock",
                                                                        "workers.lock")}
        assert locks <= _fds(server.proc.pid)
        for pid in tree:
            assert not locks & _fds(pid), pid
        assert "a" * 40 in stamp_tag(server, "a" * 40)

        old = set(tree)
        os.kill(managers[0], signal.SIGKILL)
        wait_for(lambda: not old & set(pids_alive(old)), timeout=10,
                 what="the manager's HTTP processes gone with it")
        wait_for(lambda: len(server.http_pids()) == 2, timeout=30,
                 what="two HTTP processes again")
        server.wait_ready()
        assert not old & set(server.http_tree())
        assert "b" * 40 in stamp_tag(server, "b" * 40)
        assert f"the HTTP manager (pid {managers[0]}) exited with -9 after" \
            in server.log_path.read_text()
    finally:
        code = server.stop()
    assert code == 0, server.log()
    assert server.http_tree() == [], "an HTTP process outlived the server"


def pids_alive(pids: set[int]) -> list[int]:
    return [p for p in pids if os.path.exists(f"/proc/{p}")]


@pytest.mark.parametrize("api_processes", [1, 2])
def test_ctrl_c_in_a_terminal_is_a_quiet_stop(seeded_dir: Path, api_processes: int) -> None:
    """A terminal's Ctrl-C sends SIGINT to every process of its foreground group at once:
    ``stampd serve``, its worker supervisor and workers, its HTTP manager and HTTP processes.
    ``stampd serve`` stops the rest in order, and nothing warns. (The worker supervisor
    stopping on it by itself was taken for one that died: an ERROR, and a restart.)"""
    server = start_server(seeded_dir, workers=2, api_processes=api_processes)
    try:
        stamp_tag(server, "c" * 40)
        names = proc_names()
        pools, workers = server.signing_tree(names)
        assert pools and workers
        for pid in [server.proc.pid, *server.http_tree(names), *pools, *workers]:
            os.kill(pid, signal.SIGINT)
        server.proc.wait(timeout=60)
    finally:
        server.stop()
    loud = [line for line in server.log_path.read_text().splitlines()
            if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)]
    assert not loud, "\n".join(loud)


def _post(server: Server, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:  # (a connection of its own: the kernel picks the HTTP process)
        conn.request("POST", path, body, {"Content-Type": content_type, "Connection": "close"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_manifests_of_both_processes_and_stamps_beside_them_are_all_signed_quietly(
        seeded_dir: Path, server_factory: list[Server]) -> None:
    """Manifests taken by both HTTP processes at once, digest stamps beside them, all through
    the host's one dispatcher (docs/jobs.md, "Transports"), which keeps one worker free for
    stamps. Every answer is right, and nothing warns (a message a side did not expect drops
    the connection, with a warning)."""
    server = start_server(seeded_dir, workers=2, api_processes=2)
    server_factory.append(server)
    lines = 15_000  # ~1.1 MB each: checked in a process of its own, sent a MiB at a time
    bodies = ["".join(f"{hashlib.sha256(f'{m}/{n}'.encode()).hexdigest()} *f{n}\n"
                      for n in range(lines)).encode() for m in range(4)]
    assert all(len(b) > IN_PROCESS_MAX for b in bodies)
    digests = [hashlib.sha256(b"beside %d" % i).hexdigest() for i in range(40)]
    with ThreadPoolExecutor(16) as pool:
        signed = [pool.submit(_post, server, "/v1/manifests", b, "text/plain") for b in bodies]
        stamps = [pool.submit(_post, server, "/v1/stamps", f"sha256={d}".encode(),
                              "application/x-www-form-urlencoded") for d in digests]
        for body, answer in zip(bodies, signed, strict=True):
            status, text = answer.result()
            assert status == 200, text[:300]
            assert f"\n# lines: {lines}\n".encode() in text and body in text
            assert text.count(b"-----BEGIN PGP SIGNATURE-----") == 1
        for digest, answer in zip(digests, stamps, strict=True):
            status, text = answer.result()
            assert status == 200 and digest.encode() in text, text[:300]
    # Whichever process answers (each request on a connection of its own), it sees the
    # host's two workers, and their signatures, as the other does.
    assert {metric(server, "stampd_workers_connected") for _ in range(8)} == {2}
    loud = [line for line in server.log().splitlines()
            if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line)]
    assert not loud, "\n".join(loud)
