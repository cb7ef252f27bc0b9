"""The transparency log's key without agents: its spec and purpose, what the pool tells its
workers, the settings that turn it on and name the log's origin, and the requests that may not
name it."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats.keys import (
    PRIMARY,
    RFC3161,
    STAMPS,
    TLOG,
    TLOG_KEY,
    KeySpec,
    ServedKey,
    spec_of,
    with_purposes,
)
from server.errors import BadRequest
from server.settings import Settings
from server.stamping.requests import choose_key
from workers.config import ConfigError, DispatchConfig, PoolConfig, WorkerConfig

LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHbr9GGRjdkSvfQZFgYAGLqCmoJAGjOmh6e5aTkIDmqd\n"
OPENPGP = ServedKey(PRIMARY, "openpgp", "F" * 40, "eddsa (ed25519)", "pub", "K <k@v>",
                    primary=True)
SSH = ServedKey("ssh-ed25519", "ssh", "SHA256:ssh", "ssh-ed25519", LINE, "K <k@v>")
LOG = ServedKey(TLOG_KEY.id, "ssh", "SHA256:log", "ssh-ed25519", LINE, "K <k@v>")


def test_the_log_key_spec() -> None:
    assert (TLOG_KEY.id, TLOG_KEY.format, TLOG_KEY.algo) == ("tlog-ed25519", "ssh", "ed25519")
    assert KeySpec("ssh", "ed25519").id == "ssh-ed25519"  # the SSH extra key is another key
    assert spec_of("tlog-ed25519") == TLOG_KEY
    assert spec_of("openpgp-nistp256") == KeySpec("openpgp", "nistp256")


def test_the_log_key_signs_checkpoints_only() -> None:
    """Registered keys carry no purpose: the log key's reserved id gives it its own, whatever
    the settings; it is never an allowed signer of stamps."""
    keys = with_purposes([OPENPGP, SSH, LOG], None)
    assert [k.purpose for k in keys] == [STAMPS, STAMPS, TLOG]
    assert [k.purpose for k in with_purposes(keys, SSH.id)] == [STAMPS, RFC3161, TLOG]
    assert keys[2].allowed_signers("git") is None and keys[1].allowed_signers("git")


def test_requests_may_not_name_the_log_key() -> None:
    keys = with_purposes([OPENPGP, LOG, SSH], None)
    with pytest.raises(BadRequest, match="transparency log key: it signs log checkpoints only"):
        choose_key(keys, None, "SHA256:log")
    with pytest.raises(BadRequest, match="log checkpoints only"):
        choose_key(keys, "ssh", "SHA256:log")
    assert choose_key(keys, "ssh", None) == keys[2]  # format=ssh never picks the log key
    with pytest.raises(BadRequest, match="no ssh key"):
        choose_key(keys[:2], "ssh", None)


def test_the_pool_tells_the_log_key_its_role(tmp_path: Path) -> None:
    dispatch = DispatchConfig("socket", socket=tmp_path / "s")
    ssh = KeySpec("ssh", "ed25519")
    pool = PoolConfig(1, tmp_path / "keys", tmp_path / "run", dispatch, (ssh, TLOG_KEY))
    assert PoolConfig.from_json(pool.to_json()) == pool
    worker = pool.worker_config("w", tmp_path / "h", TLOG_KEY)
    assert (worker.key_id, worker.format, worker.role, worker.key_dir.name) == (
        "tlog-ed25519", "ssh", TLOG, "tlog-ed25519")
    assert WorkerConfig.from_json(worker.to_json()) == worker
    assert pool.worker_config("w", tmp_path / "h", ssh).role is None
    assert pool.worker_config("w", tmp_path / "h").role is None
    with pytest.raises(ConfigError, match="role"):
        PoolConfig(1, tmp_path, tmp_path, dispatch, (KeySpec("openpgp", "ed25519", TLOG),))
    with pytest.raises(ConfigError, match="role"):
        WorkerConfig("w", tmp_path, tmp_path, dispatch, role="other")


def test_the_log_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STAMPD_TLOG", raising=False)  # (tests/conftest.py turns it off)
    monkeypatch.delenv("STAMPD_TLOG_ORIGIN", raising=False)
    on = Settings()
    assert on.tlog and on.tlog_spec == TLOG_KEY and TLOG_KEY in on.extra_key_specs
    assert on.tlog_origin == "127.0.0.1:8080/tlog"
    assert Settings(port=9000, host="::1").tlog_origin == "[::1]:9000/tlog"
    assert Settings(own_url="https://stamps.example.org/").tlog_origin == \
        "stamps.example.org/tlog"
    assert Settings(own_url="https://example.org/stampd").tlog_origin == \
        "example.org/stampd/tlog"
    assert Settings(tlog_origin="example.org/log").tlog_origin == "example.org/log"
    off = Settings(tlog="off")  # type: ignore[arg-type]
    assert not off.tlog and off.tlog_spec is None and TLOG_KEY not in off.extra_key_specs
    assert Settings(tlog="on").tlog  # type: ignore[arg-type]
    for bad in ("a b", "a+b", "tab\there"):
        with pytest.raises(ValueError, match="tlog_origin must be a note key name"):
            Settings(tlog_origin=bad)
    with pytest.raises(ValueError, match="must not be empty"):
        Settings(tlog_origin="")
    with pytest.raises(ValueError, match="set STAMPD_TLOG_ORIGIN"):
        Settings(own_url="https://example.org/a+b/")
    assert Settings(own_url="https://example.org/a+b/", tlog_origin="example.org/log").tlog
    assert not Settings(own_url="https://example.org/a+b/", tlog=False).tlog
    with pytest.raises(ValueError, match="tlog"):
        Settings(tlog="maybe")  # type: ignore[arg-type]
