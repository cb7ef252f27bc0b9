"""SSH signing keys beside the primary OpenPGP key: git stamps, receipts, routing, faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from formats.receipts import parse_statement, split_receipt
from tests.helpers import (
    TEST_FPR,
    Load,
    Server,
    git,
    keyring,
    make_repo,
    run_stampd,
    seed_data_dir,
    start_server,
    verify_stamp,
)

SSH_TYPES = ["ed25519", "ecdsa-p256", "ecdsa-p384", "ecdsa-p521", "rsa"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("ssh") / "data")
    extra = ",".join(f"ssh:{t}" for t in SSH_TYPES)
    s = start_server(data, workers=1, extra_env={"STAMPD_EXTRA_KEYS": extra},
                     commit_interval=2, api_processes=2)
    s.wait_ready(workers=1 + len(SSH_TYPES))
    yield s
    s.stop()


def keys(server: Server) -> dict[str, dict[str, str]]:
    with urllib.request.urlopen(server.url + "v1/keys", timeout=10) as r:
        return {k["id"]: k for k in json.loads(r.read())["keys"]}


def post(server: Server, fields: dict[str, str], path: str = "") -> str:
    req = urllib.request.Request(server.url + path, data=urllib.parse.urlencode(fields).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(r.read().decode())


@pytest.fixture
def repo(tmp_path: Path, server: Server) -> Path:
    path = make_repo(tmp_path / "repo")
    with urllib.request.urlopen(server.url + "v1/keys/allowed_signers", timeout=10) as r:
        (tmp_path / "allowed_signers").write_bytes(r.read())
    git(path, "config", "gpg.format", "ssh")
    git(path, "config", "gpg.ssh.allowedSignersFile", str(tmp_path / "allowed_signers"))
    return path


@pytest.mark.parametrize("ssh_type", SSH_TYPES)
def test_git_stamps_with_ssh_keys(server: Server, repo: Path, ssh_type: str) -> None:
    key = keys(server)[f"ssh-{ssh_type}"]
    head = git(repo, "rev-parse", "HEAD").strip()
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()

    tag = post(server, {"request": "stamp-tag-v1", "commit": head, "tagname": "t",
                        "key": key["fingerprint"]})
    assert tag.count("-----BEGIN SSH SIGNATURE-----") == 1
    oid = git(repo, "hash-object", "-t", "tag", "-w", "--stdin", input=tag).strip()
    out = git(repo, "verify-tag", "--raw", oid)
    assert "Good" in out and key["fingerprint"] in out

    commit = post(server, {"request": "stamp-branch-v1", "commit": head, "tree": tree,
                           "format": "ssh", "key": key["fingerprint"]})
    assert commit.startswith(f"tree {tree}\nparent {head}\nauthor ")
    assert "\ngpgsig -----BEGIN SSH SIGNATURE-----\n" in commit
    oid = git(repo, "hash-object", "-t", "commit", "-w", "--stdin", input=commit).strip()
    out = git(repo, "verify-commit", "--raw", oid)
    assert "Good" in out and key["fingerprint"] in out
    git(repo, "update-ref", "refs/heads/ts", oid)
    git(repo, "fsck", "--strict", "--no-dangling")


@pytest.mark.parametrize("ssh_type", ["ed25519", "ecdsa-p256", "rsa"])
def test_receipts_verify_with_ssh_keygen(server: Server, tmp_path: Path, ssh_type: str) -> None:
    key = keys(server)[f"ssh-{ssh_type}"]
    digest = "ab" * 32
    receipt = post(server, {"sha256": digest, "key": key["fingerprint"]}, "v1/stamps")
    statement, signature = split_receipt(receipt)
    st = parse_statement(statement)
    assert st.key == key["fingerprint"] and st.digest == digest
    (tmp_path / "sig").write_text(signature)
    (tmp_path / "signers").write_text(key["allowed_signers"])
    principal = key["allowed_signers"].split()[0]

    def verify(message: str) -> int:
        return subprocess.run(["ssh-keygen", "-Y", "verify", "-n", "stampd", "-f",
                               str(tmp_path / "signers"), "-I", principal, "-s",
                               str(tmp_path / "sig")], input=message, capture_output=True,
                              text=True, timeout=30, check=False).returncode

    assert verify(statement) == 0
    assert verify(statement.replace(digest, "cd" * 32)) != 0


def test_key_choice_errors(server: Server) -> None:
    for fields in ({"format": "x509"}, {"key": "0" * 40}, {"format": "openpgp",
                                                           "key": keys(server)["ssh-rsa"]
                                                           ["fingerprint"]}):
        body = {"request": "stamp-tag-v1", "commit": "a" * 40, "tagname": "t", **fields}
        with pytest.raises(urllib.error.HTTPError) as e:
            post(server, body)
        assert e.value.code == 406


def test_two_keys_under_concurrent_load(server: Server, tmp_path: Path) -> None:
    """Every answer is signed by the key that was asked for."""
    ssh = keys(server)["ssh-ed25519"]["fingerprint"]
    gnupg = keyring(server.data_dir / "keys/pubkey.asc", tmp_path / "g")

    def one(i: int) -> None:
        use_ssh = i % 2 == 0
        fields = {"request": "stamp-tag-v1", "commit": f"{i + 1:040x}", "tagname": "t"}
        if use_ssh:
            fields["key"] = ssh
        text = post(server, fields)
        if use_ssh:
            assert "-----BEGIN SSH SIGNATURE-----" in text
            assert "PGP SIGNATURE" not in text
        else:
            assert verify_stamp(text, gnupg).fingerprint == TEST_FPR

    with ThreadPoolExecutor(16) as ex:
        list(ex.map(one, range(200)))


def test_log_publishes_every_key(server: Server) -> None:
    import pygit2

    from tests.helpers import log_commits, wait_for

    post(server, {"request": "stamp-tag-v1", "commit": "c" * 40, "tagname": "t"})
    wait_for(lambda: len(log_commits(server.data_dir)) >= 1, what="a log commit")
    tree = log_commits(server.data_dir)[0].tree
    names = {e.name for e in tree["keys"]}  # type: ignore[union-attr]
    assert names == {f"ssh-{t}.pub" for t in SSH_TYPES}
    signers = tree["allowed_signers"].data.decode()  # type: ignore[union-attr]
    assert signers.count("\n") == len(SSH_TYPES)
    assert isinstance(tree["pubkey.asc"], pygit2.Blob)


def test_kill_ssh_agent_under_load(seeded_dir: Path, server_factory: list[Server],
                                   tmp_path: Path) -> None:
    server = start_server(seeded_dir, workers=1,
                          extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519",
                                     "STAMPD_EXTRA_KEY_WORKERS": "2"})
    server_factory.append(server)
    server.wait_ready(workers=3)
    ssh = keys(server)["ssh-ed25519"]["fingerprint"]
    agents = [p for p in server.agent_pids()
              if b"ssh-agent" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(agents) == 2

    class SshLoad(Load):
        def _client(self) -> None:  # same as Load, asking for the SSH key
            import http.client
            import secrets
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            for _ in range(self.per_client):
                commit = secrets.token_hex(20)
                body = urllib.parse.urlencode({"request": "stamp-tag-v1", "commit": commit,
                                               "tagname": "t", "key": ssh})
                conn.request("POST", "/", body=body, headers={
                    "Content-Type": "application/x-www-form-urlencoded"})
                r = conn.getresponse()
                from tests.helpers import Result
                with self._lock:
                    self.results.append(Result(commit, r.status, r.read().decode()))
                self.done.release()

    load = SshLoad(server.port, clients=50, per_client=10)
    pool = load.run()
    load.wait_done(60)
    os.kill(agents[0], signal.SIGKILL)
    pool.shutdown(wait=True)
    assert len(load.results) == 500
    bad = [r for r in load.results if r.status != 200 or r.commit not in r.text
           or "-----BEGIN SSH SIGNATURE-----" not in r.text]
    assert not bad, bad[:3]
    _, ready = server.get_json("/readyz")
    assert ready["requeued"] >= 1, ready  # the kill hit jobs in flight
    server.wait_ready(workers=3)
    assert agents[0] not in server.agent_pids()


def test_stampd_verify_ssh_receipt(server: Server, tmp_path: Path) -> None:

    key = keys(server)["ssh-ecdsa-p256"]
    doc = tmp_path / "doc"
    doc.write_bytes(b"ssh receipts\n")
    import hashlib
    digest = hashlib.sha256(doc.read_bytes()).hexdigest()
    receipt = tmp_path / "r.txt"
    receipt.write_text(post(server, {"sha256": digest, "format": "ssh",
                                     "key": key["fingerprint"]}, "v1/stamps"))
    (tmp_path / "signers").write_text(key["allowed_signers"])

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return run_stampd(["verify", *args], cwd=Path.cwd())

    ok = verify(str(receipt), "--file", str(doc), "--key", str(tmp_path / "signers"))
    assert ok.returncode == 0, ok.stderr
    assert key["fingerprint"] in ok.stdout
    assert verify(str(receipt)).returncode == 0  # key fetched from the server
    tampered = tmp_path / "t.txt"
    tampered.write_text(receipt.read_text().replace(digest, "0" * 64))
    assert verify(str(tampered), "--key", str(tmp_path / "signers")).returncode == 1
    other = keys(server)["ssh-ed25519"]["allowed_signers"]
    (tmp_path / "other").write_text(other)
    assert verify(str(receipt), "--key", str(tmp_path / "other")).returncode == 1
