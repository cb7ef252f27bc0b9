"""Proof requests that wait (``GET /v1/proofs/...?wait=``) on a real `stampd serve`: they are
bounded in all and per client (503 with Retry-After beyond), a client that goes away frees its
place at once, and a waiter held up by a checkpoint that cannot be signed gets its proof as
soon as one is (docs/transparency.md, "Waiting for a proof")."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Server, seed_data_dir, start_server, wait_for
from tests.system.test_tlog import check, get, post_digest

LOG_KEY = "tlog-ed25519"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("waiters"))
    s = start_server(data, workers=1, commit_interval=3600,
                     extra_env={"STAMPD_TLOG": "on", "STAMPD_PROOF_WAITERS": "3",
                                "STAMPD_PROOF_WAITERS_PER_CLIENT": "2"})
    s.wait_ready(2)  # (the stamping key's worker and the log key's)
    yield s
    s.stop()


def metric(server: Server, name: str) -> float:
    text = get(server, "/metrics")[2].decode()
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])


def waiting(server: Server, path: str) -> socket.socket:
    """A proof request sent, its answer not read."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return s


def unknown() -> str:
    return f"/v1/proofs/git/{secrets.token_hex(20)}?wait=60"


def test_waiters_are_bounded_and_a_client_that_goes_frees_its_place(server: Server) -> None:
    first = [waiting(server, unknown()), waiting(server, unknown())]
    try:
        wait_for(lambda: metric(server, "stampd_proof_waiters") == 2, what="two waiters")
        # A third from the same client: 503 at once, with Retry-After.
        status, headers, body = get(server, unknown())
        assert status == 503, body
        assert int(headers["retry-after"]) > 0
        assert b"this client has 2 proof requests waiting" in body
        assert metric(server, "stampd_proof_waiters_refused_total") >= 1
    finally:
        for s in first:
            s.close()
    # The clients went away: their waiters end at once, not when their 60 s are up.
    wait_for(lambda: metric(server, "stampd_proof_waiters") == 0, timeout=20,
             what="the waiters of closed connections to end")
    again = waiting(server, unknown())
    try:
        wait_for(lambda: metric(server, "stampd_proof_waiters") == 1, what="a new waiter")
    finally:
        again.close()
    wait_for(lambda: metric(server, "stampd_proof_waiters") == 0, timeout=20,
             what="the last waiter to end")


def test_an_unknown_git_id_is_answered_404_when_its_wait_is_up(server: Server) -> None:
    status, _, body = get(server, f"/v1/proofs/git/{secrets.token_hex(20)}?wait=1")
    assert status == 404, body
    assert b"no stamp with the git object" in body


def test_a_waiter_gets_its_proof_once_a_stalled_checkpoint_is_signed(server: Server) -> None:
    (log_worker,) = [p for p, key in server.worker_keys(server.worker_pids()).items()
                     if key == LOG_KEY]
    os.kill(log_worker, signal.SIGSTOP)  # no checkpoint can be signed
    answers: list[tuple[int, dict[str, str], bytes]] = []
    try:
        serial = post_digest(server, secrets.token_hex(32))
        t = threading.Thread(target=lambda: answers.append(
            get(server, f"/v1/proofs/{serial}?wait=60")))
        t.start()
        wait_for(lambda: metric(server, "stampd_proof_waiters") == 1 or bool(answers),
                 what="the proof request to wait")
    finally:
        os.kill(log_worker, signal.SIGCONT)
    t.join(90)
    assert answers, "the proof request got no answer"
    status, headers, proof = answers[0]
    assert status == 200, proof
    assert headers["x-stampd-serial"] == str(serial)
    entry, index, _ = check(server, proof)
    assert entry.serial == serial and headers["x-stampd-log-index"] == str(index)


def test_a_stopping_server_answers_its_waiters_at_once(tmp_path: Path) -> None:
    """A proof request waiting when the server stops is answered then (503, ask again), rather
    than holding the stop up until its time is up (or cut off when the stop gives up)."""
    s = start_server(seed_data_dir(tmp_path / "data"), workers=1,
                     extra_env={"STAMPD_TLOG": "on"})
    try:
        s.wait_ready(2)
        answers: list[tuple[int, dict[str, str], bytes]] = []
        t = threading.Thread(target=lambda: answers.append(get(s, unknown())))
        t.start()
        wait_for(lambda: metric(s, "stampd_proof_waiters") == 1, what="the waiter")
    finally:
        code = s.stop()
    t.join(90)
    assert code == 0, s.log()
    assert answers, "the waiter got no answer"
    status, headers, body = answers[0]
    assert status == 503 and headers["retry-after"] == "1", body
    assert b"stopping" in body


def test_every_http_process_wakes_its_waiters_when_a_checkpoint_is_published(
        tmp_path: Path) -> None:
    """With two HTTP processes only one writes the log; the coordinator tells the other of each
    checkpoint. Proof requests held up by a stalled checkpoint, on connections of their own
    (the kernel spreads them over both processes), all get their proofs once it is signed."""
    s = start_server(seed_data_dir(tmp_path / "data"), workers=1, commit_interval=3600,
                     api_processes=2, extra_env={"STAMPD_TLOG": "on"})
    try:
        s.wait_ready(2)
        (log_worker,) = [p for p, key in s.worker_keys(s.worker_pids()).items()
                         if key == LOG_KEY]
        answers: list[tuple[int, dict[str, str], bytes]] = []
        threads = []
        os.kill(log_worker, signal.SIGSTOP)  # no checkpoint can be signed
        try:
            serials = [post_digest(s, secrets.token_hex(32)) for _ in range(8)]
            for serial in serials:
                t = threading.Thread(target=lambda n=serial: answers.append(
                    get(s, f"/v1/proofs/{n}?wait=60")))
                t.start()
                threads.append(t)
        finally:
            os.kill(log_worker, signal.SIGCONT)
        for t in threads:
            t.join(90)
        assert len(answers) == len(serials), "a proof request got no answer"
        assert sorted(int(h["x-stampd-serial"]) for status, h, _ in answers
                      if status == 200) == sorted(serials), [a[:2] for a in answers]
        assert "exited" not in s.log()
    finally:
        assert s.stop() == 0, s.log()
