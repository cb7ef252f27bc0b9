"""A key that cannot sign, and programs that are missing: refused at start in one line; a key
that breaks while the server runs is reported (readiness, one warning) while the others serve.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keystore.keyset import SshKeyStore
from tests.broken_keys import corrupt_armor, corrupt_ssh_key, wrong_secret
from tests.helpers import (
    TEST_SECRET_KEY,
    KeyMaker,
    Server,
    free_port,
    seed_data_dir,
    short_tmpdir,
    stamp_tag,
    start_server,
    start_stampd,
    wait_for,
)

Started = Callable[..., tuple[int, str]]


@pytest.fixture
def run_stampd(tmp_path: Path) -> Iterator[Started]:
    """Run ``stampd ARGS`` to its end (stderr captured, INFO logging, a runtime directory of
    its own); whatever it leaves behind is killed by PID at teardown."""
    runs: list[Server] = []

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        runtime = short_tmpdir("kf")
        full = {**os.environ, "STAMPD_RUNTIME_DIR": str(runtime), "STAMPD_LOG_LEVEL": "INFO",
                **(env or {})}
        stderr = tmp_path / f"stderr-{len(runs)}"
        proc = start_stampd(args, full, stderr, stderr_only=True)
        runs.append(Server(proc, 0, tmp_path, runtime, tmp_path / "none.log", 0, full))
        code = proc.wait(timeout=120)
        return code, stderr.read_text()

    yield run
    for server in runs:
        server.stop()  # kills the command, then by PID any supervisor, worker or agent left
        assert list(server.runtime_dir.iterdir()) == [], "a worker home was left behind"
        shutil.rmtree(server.runtime_dir, ignore_errors=True)


def assert_one_line(code: int, stderr: str, *needles: str) -> None:
    assert code == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert len(stderr.splitlines()) == 1 and stderr.endswith("\n"), stderr
    for needle in needles:
        assert needle in stderr, stderr


def serve_args(data: Path) -> tuple[str, ...]:
    return ("serve", "--port", str(free_port()), "--data-dir", str(data), "--workers", "1")


@pytest.mark.parametrize("damage", ["corrupt", "another-key", "wrong-secret"])
def test_a_broken_primary_key_refuses_to_start(damage: str, tmp_path: Path, keys: KeyMaker,
                                               run_stampd: Started) -> None:
    """A corrupt file, another key's secret key (another fingerprint), a secret key that is the
    key's in all but its secret (caught by the test signature only): `stampd serve` exits 1
    with one line naming the file, having served nothing."""
    data = seed_data_dir(tmp_path / "data")
    secret = data / "keys" / "secret-key.asc"
    if damage == "corrupt":
        corrupt_armor(secret)
    elif damage == "another-key":
        shutil.copy(keys.get("ed25519").secret_file, secret)
    else:
        secret.write_text(wrong_secret(TEST_SECRET_KEY.read_text()))
    code, stderr = run_stampd(*serve_args(data))
    assert_one_line(code, stderr, "stampd serve: key primary cannot sign", str(secret),
                    "restore the key files from a backup")
    assert not (data / "run" / "serve.sock").exists()


def test_a_broken_extra_ssh_key_refuses_to_start(tmp_path: Path, run_stampd: Started) -> None:
    data = seed_data_dir(tmp_path / "data")
    store = SshKeyStore(data / "keys" / "ssh-ed25519")
    store.ensure("ed25519", "stampd test")
    corrupt_ssh_key(store.private_key_file)
    code, stderr = run_stampd(*serve_args(data), env={"STAMPD_EXTRA_KEYS": "ssh:ed25519"})
    assert_one_line(code, stderr, "key ssh-ed25519 cannot sign", str(store.private_key_file),
                    "remove ssh:ed25519 from STAMPD_EXTRA_KEYS")


def test_stampd_worker_refuses_a_broken_key(tmp_path: Path, run_stampd: Started) -> None:
    data = seed_data_dir(tmp_path / "data")
    corrupt_armor(data / "keys" / "secret-key.asc")
    code, stderr = run_stampd("worker", "--data-dir", str(data), "--workers", "1")
    assert_one_line(code, stderr, "stampd worker: key primary cannot sign",
                    str(data / "keys" / "secret-key.asc"))


def test_missing_gpg_is_one_line(tmp_path: Path, run_stampd: Started) -> None:
    data = seed_data_dir(tmp_path / "data")
    empty = tmp_path / "bin"
    empty.mkdir()
    code, stderr = run_stampd(*serve_args(data), env={"PATH": str(empty)})
    assert_one_line(code, stderr, "stampd serve: gpg is not installed", "GnuPG 2.2.8 or later",
                    "apt-get install gnupg")
    fake = empty / "gpg"
    fake.write_text("#!/bin/sh\necho 'gpg (GnuPG) 2.1.18'\n")
    fake.chmod(0o755)
    code, stderr = run_stampd(*serve_args(data), env={"PATH": str(empty)})
    assert_one_line(code, stderr, "is GnuPG 2.1.18, too old", "GnuPG 2.2.8 or later")


def test_an_extra_key_broken_while_serving(seeded_dir: Path, server_factory: list[Server]
                                           ) -> None:
    """The SSH key's file is corrupted while the server runs, and its worker dies: the key is
    reported not ready (by name) and in one warning, however often its worker is retried,
    while the primary key goes on signing; restored, it serves again."""
    server = start_server(seeded_dir, workers=1, extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519"})
    server_factory.append(server)
    server.wait_ready(workers=2)
    store = SshKeyStore(seeded_dir / "keys" / "ssh-ed25519")
    backup = store.private_key_file.read_bytes()
    corrupt_ssh_key(store.private_key_file)
    ssh_workers = server.key_workers("ssh-ed25519")
    assert len(ssh_workers) == 1
    os.kill(ssh_workers[0], signal.SIGKILL)  # its agent holds the key: it must start anew

    def log() -> str:
        return server.log_path.read_text()

    wait_for(lambda: log().count("worker 1 (key ssh-ed25519) exited with 5") >= 3, timeout=60,
             what="three attempts to load the broken key")
    status, ready = server.get_json("/readyz")
    checks: dict[str, dict[str, object]] = ready["checks"]  # type: ignore[assignment]
    assert status == 503
    assert checks["key:ssh-ed25519"]["ok"] is False
    assert "ssh-ed25519" in str(checks["key:ssh-ed25519"]["detail"])
    assert checks["key:primary"]["ok"] is True
    assert stamp_tag(server, "e" * 40).startswith("object " + "e" * 40)

    warnings = [line for line in log().splitlines()
                if " WARNING " in line and "key ssh-ed25519 cannot sign" in line]
    assert len(warnings) == 1, warnings
    assert str(store.private_key_file) in warnings[0]
    assert "Traceback" not in log()

    store.private_key_file.write_bytes(backup)
    server.wait_ready(workers=2)  # the next retry loads it (at most 30 s apart)
