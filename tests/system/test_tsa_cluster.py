"""RFC 3161 with several hosts on one PostgreSQL: an API host without key files serves tokens
and the chain a worker host registered; a second worker host with the same key takes that
chain instead of making its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from keystore.keyset import TSA_CHAIN_FILE
from tests.helpers import seed_data_dir, start_server, wait_for
from tests.system.test_cluster import WorkerHost, heartbeats
from tests.system.test_tsa import _server, chain, post, run

pytestmark = pytest.mark.slow

TSA_KEY = Path("keys") / "openpgp-nistp256"


def test_api_hosts_serve_the_registered_chain(tmp_path: Path, pg_url: str) -> None:
    made = seed_data_dir(tmp_path / "made" / "data")
    _server(made).stop()  # a first start makes the TSA key and its certificate
    w1, w2 = tmp_path / "w1" / "data", tmp_path / "w2" / "data"
    for host in (w1, w2):
        shutil.copytree(made / "keys", host / "keys")
    (w2 / TSA_KEY / TSA_CHAIN_FILE).unlink()  # the key copied before its certificate was made
    env = {"STAMPD_DISPATCH": "database", "STAMPD_DATABASE_URL": pg_url,
           "STAMPD_TSA": "true", "STAMPD_LOG_LEVEL": "INFO"}
    hosts = [WorkerHost(w1, {**os.environ, **env}, workers=1)]
    api = None
    try:
        wait_for(lambda: heartbeats(pg_url) >= 2, timeout=60, what="worker host 1")
        api = start_server(tmp_path / "api" / "data", workers=1, extra_env=env,
                           args=("--no-workers",), wait=False)
        api.wait_ready(workers=2)
        assert not (api.data_dir / "keys").exists() or \
            not any((api.data_dir / "keys").rglob("secret-key.asc"))
        served = chain(api, tmp_path / "tsa.pem").read_text()
        assert served == (w1 / TSA_KEY / TSA_CHAIN_FILE).read_text()

        (tmp_path / "f").write_bytes(b"through an API host")
        assert run("openssl", "ts", "-query", "-data", "f", "-sha256", "-out", "q.tsq",
                   cwd=tmp_path).returncode == 0
        assert post(api.url + "tsr", tmp_path / "q.tsq", tmp_path / "r.tsr")[0] == 200
        r = run("openssl", "ts", "-verify", "-data", "f", "-in", "r.tsr", "-CAfile", "tsa.pem",
                "-untrusted", "tsa.pem", cwd=tmp_path)
        assert "Verification: OK" in r.stdout, r.stdout + r.stderr

        hosts.append(WorkerHost(w2, {**os.environ, **env}, workers=1))
        wait_for(lambda: heartbeats(pg_url) >= 4, timeout=60, what="worker host 2")
        assert (w2 / TSA_KEY / TSA_CHAIN_FILE).read_text() == served
    finally:
        if api is not None:
            api.stop()
        for host in hosts:
            host.stop()
