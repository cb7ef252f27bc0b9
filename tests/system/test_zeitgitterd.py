"""Interoperability with the real zeitgitterd 1.2.0 (PyPI, test-only), both directions, on
loopback: it stamps our log as our peer, and it lists us as its upstream timestamper."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pygit2
import pytest

from tests.helpers import (
    Server,
    branch,
    free_port,
    keyring,
    kill_pids,
    pids_mentioning,
    stamp_tag,
    start_server,
    terminate,
    wait_for,
)

ZEITGITTERD = Path(sys.executable).parent / "zeitgitterd"
ZG_UID = "Zeit Test <zeit@example.invalid>"


@dataclass
class Zeitgitterd:
    proc: subprocess.Popen[bytes]
    port: int
    root: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def pubkey(self) -> str:
        with urllib.request.urlopen(self.url + "?request=get-public-key-v1", timeout=10) as r:
            return str(r.read().decode())

    def log(self) -> str:
        return (self.root / "zg.log").read_text(errors="replace")[-4000:]


def start_zeitgitterd(root: Path, upstream: str, commit_in: int = 8) -> Zeitgitterd:
    assert ZEITGITTERD.exists(), "zeitgitterd (test dependency) is not installed"
    port = free_port()
    (root / "home").mkdir(parents=True)
    (root / "gnupg").mkdir(mode=0o700)
    # Commit (and ask upstream for a cross-timestamp) `commit_in` seconds from now; its
    # shortest sensible interval is one minute.
    offset = (int(time.time()) + commit_in) % 60
    env = {**os.environ, "HOME": str(root / "home"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("GNUPGHOME", None)
    cmd = [str(ZEITGITTERD), "--own-url", f"http://127.0.0.1:{port}/", "--owner", "test",
           "--contact", "test", "--country", "test", "--keyid", ZG_UID,
           "--gnupg-home", str(root / "gnupg"), "--repository", str(root / "repo"),
           "--listen-address", "127.0.0.1", "--listen-port", str(port),
           "--upstream-timestamp", upstream,  # never the public default servers
           "--commit-interval", "1m", "--commit-offset", f"{offset}s", "--debug-level", "INFO"]
    with open(root / "zg.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    zg = Zeitgitterd(proc, port, root)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"zeitgitterd exited:\n{zg.log()}")
        try:
            if "BEGIN PGP PUBLIC KEY" in zg.pubkey():
                return zg
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"zeitgitterd did not come up:\n{zg.log()}")


@pytest.fixture
def zg_factory() -> Iterator[list[Zeitgitterd]]:
    started: list[Zeitgitterd] = []
    yield started
    for zg in started:
        terminate(zg.proc, timeout=15)
        kill_pids(pids_mentioning(str(zg.root)))  # its gpg-agents and git-timestamp runs
        shutil.rmtree(zg.root, ignore_errors=True)


def test_zeitgitterd_both_directions(tmp_path: Path, seeded_dir: Path,
                                     server_factory: list[Server],
                                     zg_factory: list[Zeitgitterd]) -> None:
    port = free_port()
    zg = start_zeitgitterd(tmp_path / "zg", f"stampd-timestamps=http://127.0.0.1:{port}")
    zg_factory.append(zg)
    server = start_server(seeded_dir, workers=1, commit_interval=2, port=port,
                          extra_env={"STAMPD_PEERS": f"zg={zg.url}"}, api_processes=2)
    server_factory.append(server)

    # stampd <- zeitgitterd: our log head stamped by zeitgitterd, checked with its key.
    stamp_tag(server, "a" * 40)
    wait_for(lambda: len(branch(seeded_dir, "zg-timestamps")) >= 1, timeout=30,
             what="zeitgitterd's stamp of our log")
    (tmp_path / "zg.asc").write_text(zg.pubkey())
    env = {**os.environ, "GNUPGHOME": str(keyring(tmp_path / "zg.asc", tmp_path / "g1"))}
    stamp = branch(seeded_dir, "zg-timestamps")[0]
    r = subprocess.run(["git", "--git-dir", str(seeded_dir / "log.git"), "verify-commit",
                        str(stamp.id)], capture_output=True, text=True, env=env, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert stamp.author.name == "Zeit Test"

    # zeitgitterd <- stampd: its commit cycle ran `git timestamp` against us.
    def stamped_by_us() -> bool:
        try:
            repo = pygit2.Repository(str(zg.root / "repo"))
            return "refs/heads/stampd-timestamps" in list(repo.references)
        except pygit2.GitError:
            return False

    wait_for(stamped_by_us, timeout=90, what=f"our stamp in zeitgitterd's log\n{zg.log()}")
    env = {**os.environ, "GNUPGHOME": str(keyring(seeded_dir / "keys/pubkey.asc",
                                                  tmp_path / "g2"))}
    r = subprocess.run(["git", "-C", str(zg.root / "repo"), "verify-commit",
                        "stampd-timestamps"], capture_output=True, text=True, env=env,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
