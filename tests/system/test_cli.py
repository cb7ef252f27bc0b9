"""The stampd command line: keys, db, and a worker pool running apart from the API."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    TEST_FPR,
    TEST_UID,
    Server,
    free_port,
    run_stampd,
    short_tmpdir,
    stamp_tag,
    start_stampd,
)


def stampd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_stampd(args, env=env, timeout=120)


def test_keys_show(seeded_dir: Path) -> None:
    r = stampd("keys", "--data-dir", str(seeded_dir), "show")
    assert r.returncode == 0, r.stderr
    assert f"fingerprint: {TEST_FPR}" in r.stdout
    assert f"user id:     {TEST_UID}" in r.stdout
    assert "algorithm:   eddsa (ed25519)" in r.stdout


def test_keys_generate_with_uid_and_refuses_to_overwrite(tmp_path: Path) -> None:
    data = tmp_path / "d"
    uid = "Example Stamper <stamper@example.invalid>"
    r = stampd("keys", "--data-dir", str(data), "generate", "--key-uid", uid)
    assert r.returncode == 0, r.stderr
    assert f"user id:     {uid}" in r.stdout
    assert oct((data / "keys/secret-key.asc").stat().st_mode & 0o777) == "0o600"
    again = stampd("keys", "--data-dir", str(data), "generate")
    assert again.returncode == 1 and "--force" in again.stderr


def test_invalid_setting_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "STAMPD_KEY_UID": "no email here"}
    r = stampd("keys", "--data-dir", str(tmp_path), "generate", env=env)
    assert r.returncode == 2
    assert "key_uid" in r.stderr


def test_db_upgrade_and_check(tmp_path: Path) -> None:
    assert stampd("db", "--data-dir", str(tmp_path), "upgrade").returncode == 0
    r = stampd("db", "--data-dir", str(tmp_path), "check")
    assert r.returncode == 0 and "schema matches" in r.stdout


def test_worker_pool_apart_from_api(seeded_dir: Path, server_factory: list[Server]) -> None:
    """`serve --no-workers` plus a separate `stampd worker` on the same data directory."""
    runtime = short_tmpdir("sw")
    env = {**os.environ, "STAMPD_RUNTIME_DIR": str(runtime)}
    port = free_port()
    log_path = seeded_dir.parent / "api.log"
    proc = start_stampd(["serve", "--no-workers", "--port", str(port), "--data-dir",
                         str(seeded_dir)], env, log_path)
    api = Server(proc, port, seeded_dir, runtime, log_path, 2, env)
    server_factory.append(api)
    pool = start_stampd(["worker", "--data-dir", str(seeded_dir), "--workers", "2"], env,
                        seeded_dir.parent / "worker.log")
    try:
        api.wait_ready(workers=2)
        assert stamp_tag(api, "c" * 40).startswith("object " + "c" * 40)
    finally:
        pool.send_signal(signal.SIGTERM)
        code = pool.wait(timeout=30)
    assert code == 0
    assert api.worker_pids() == [] and api.agent_pids() == []
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.parametrize("http", [1, 2])
def test_sigterm_stops_everything_in_order(seeded_dir: Path, server_factory: list[Server],
                                           http: int) -> None:
    """SIGTERM: exit status 0, the HTTP processes and the pool stopped (not orphaned, no
    worker restarted on the way), no process left behind."""
    import time

    from tests.helpers import stamp_tag, start_server

    server = start_server(seeded_dir, workers=2, api_processes=http)
    server_factory.append(server)
    stamp_tag(server, "d" * 40)
    workers, agents = server.worker_pids(), server.agent_pids()
    assert len(workers) == 2 and len(agents) == 2
    assert len(server.http_pids()) == (0 if http == 1 else http)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 5
    while (server.worker_pids() or server.agent_pids() or server.http_pids()) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.worker_pids() == [] and server.agent_pids() == [] \
        and server.http_pids() == []
    log = server.log()
    # One start-up line says what is served, from where, with which keys and workers.
    data = re.escape(str(seeded_dir.resolve()))
    processes = "1 HTTP process" if http == 1 else f"{http} HTTP processes"
    assert re.search(rf"serving http://127\.0\.0\.1:{server.port}/ from {data}: database "
                     rf"sqlite:///\S+stampd\.sqlite3, keys primary {TEST_FPR}, 2 workers, "
                     rf"{processes}\n", log), log[:2000]
    assert "supervisor: stopping on signal 15" in log
    assert "parent process is gone" not in log
    assert "restarting" not in log
