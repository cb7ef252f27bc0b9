"""Issue 12, A1 end to end on PostgreSQL: a worker host registers its keys; an API host with no
key files at all serves exactly those, its stamps verify against them, and its log publishes
them."""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from pathlib import Path

import pygit2

from keystore.keyset import SshKeyStore
from stampd.cli import main
from tests.helpers import (
    TEST_FPR,
    Server,
    keyring,
    run_stampd,
    seed_data_dir,
    start_server,
    verify_stamps,
    wait_for,
)
from tests.system.test_cluster import WorkerHost, heartbeats


def test_an_api_host_without_keys_serves_what_the_worker_host_registered(
        tmp_path: Path, pg_url: str, server_factory: list[Server]) -> None:
    env = {**os.environ, "STAMPD_DISPATCH": "database", "STAMPD_DATABASE_URL": pg_url,
           "STAMPD_EXTRA_KEYS": "ssh:ed25519"}
    signer = seed_data_dir(tmp_path / "w" / "data")
    SshKeyStore(signer / "keys" / "ssh-ed25519").ensure("ed25519", "stampd test")
    host = WorkerHost(signer, env, workers=1)
    try:
        wait_for(lambda: heartbeats(pg_url) == 2, timeout=60, what="2 worker heartbeats")
        api_dir = tmp_path / "api" / "data"
        api = start_server(api_dir, commit_interval=1, database_url=pg_url,
                           args=("--no-workers",), wait=False,
                           extra_env={"STAMPD_DISPATCH": "database",
                                      "STAMPD_EXTRA_KEYS": "ssh:ed25519"})
        server_factory.append(api)
        api.wait_ready(workers=2)
        assert not (api_dir / "keys").exists()  # no key file, public or secret, ever made

        with urllib.request.urlopen(f"{api.url}?request=get-public-key-v1") as r:
            assert r.read() == (signer / "keys" / "pubkey.asc").read_bytes()
        status, body = api.get_json("/readyz")
        assert status == 200
        assert body["checks"]["key:primary"]["ok"]  # type: ignore[index]
        assert body["checks"]["key:ssh-ed25519"]["ok"]  # type: ignore[index]

        form = urllib.parse.urlencode({"request": "stamp-tag-v1", "commit": "a" * 40,
                                       "tagname": "t1"}).encode()
        with urllib.request.urlopen(api.url, data=form) as r:
            tag = r.read().decode()
        (verified,) = verify_stamps([tag], keyring(signer / "keys/pubkey.asc", tmp_path / "g"))
        assert verified.fingerprint == TEST_FPR

        # The log publishes the registered keys, the SSH one included.
        repo = pygit2.Repository(str(api_dir / "log.git"))
        wait_for(lambda: "refs/heads/main" in repo.references, timeout=30, what="a log commit")
        tree = repo.revparse_single("main").tree  # type: ignore[attr-defined]
        assert tree["pubkey.asc"].data == (signer / "keys/pubkey.asc").read_bytes()
        ssh_pub = (signer / "keys/ssh-ed25519/id.pub").read_text().split()[:2]
        assert tree["keys"]["ssh-ed25519.pub"].data.decode().split()[:2] == ssh_pub
    finally:
        host.stop()


def test_a_worker_host_with_another_key_refuses_to_start(
        tmp_path: Path, pg_url: str) -> None:
    first = seed_data_dir(tmp_path / "first")
    assert main(["keys", "register", "--data-dir", str(first), "--database-url",
                 pg_url]) == 0
    other = tmp_path / "other"
    env = {**os.environ, "STAMPD_DISPATCH": "database", "STAMPD_DATABASE_URL": pg_url,
           "STAMPD_KEY_UID": "Other <other@stampd.invalid>"}
    made = run_stampd(["keys", "--data-dir", other, "generate"], env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    r = run_stampd(["worker", "--data-dir", other], env=env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"stampd worker: key primary in {other}/keys/pubkey.asc ")
    assert f"the database has {TEST_FPR}" in r.stderr
