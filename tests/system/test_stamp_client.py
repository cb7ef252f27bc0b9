"""``stampd stamp --tag/--branch``, the client of our own, against a real server: OpenPGP and SSH
stamps in SHA-1 and SHA-256 repositories, checked afterwards by git itself (verify-tag,
verify-commit, fsck --strict) and by ``stampd verify``; answers that are not the stamp asked for
(another server's key, another object, another SSH key) are refused and nothing is stored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client.stamp import pin_name
from stampd import cli
from tests.helpers import (
    TEST_FPR,
    TEST_PUBLIC_KEY,
    Relay,
    Server,
    git,
    keyring,
    make_repo,
    require_tools,
    seed_data_dir,
    start_server,
)

FORMATS = ["sha1", "sha256"]
SIGNERS = ["openpgp", "ssh"]


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    require_tools("git", "gpg", "ssh-keygen")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("stampc") / "data")
    s = start_server(data, workers=1,
                     extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519,ssh:ecdsa-p256"})
    s.wait_ready(workers=3)
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ssh_keys(server: Server) -> dict[str, dict[str, str]]:
    with urllib.request.urlopen(server.url + "v1/keys", timeout=10) as r:
        return {k["id"]: k for k in json.loads(r.read())["keys"]}


def commit(repo: Path, text: str) -> str:
    (repo / "a.txt").write_text(text + "\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", text)
    return git(repo, "rev-parse", "HEAD").strip()


def stampd(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["stamp", *args])
    out, err = capsys.readouterr()
    return code, out, err


def refs(repo: Path) -> str:
    return git(repo, "for-each-ref", "--format=%(refname) %(objectname)")


def stamp_relay(keys: str, stamps: str,
                edit: Callable[[dict[str, str]], dict[str, str]] = lambda f: f) -> Relay:
    """A server in front of a real one: key requests go to ``keys``, stamp requests (their
    form changed by ``edit``) to ``stamps``: a server whose stamps are wrong."""

    def route(method: str, path: str, body: bytes | None) -> urllib.request.Request:
        if body is None:
            return urllib.request.Request(keys + path.lstrip("/"))
        form = dict(urllib.parse.parse_qsl(body.decode()))
        return urllib.request.Request(stamps, data=urllib.parse.urlencode(edit(form)).encode())

    return Relay(route)


@pytest.mark.parametrize("signer", SIGNERS)
@pytest.mark.parametrize("object_format", FORMATS)
def test_tag_and_branch_stamps(server: Server, ssh_keys: dict[str, dict[str, str]],
                               tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               object_format: str, signer: str) -> None:
    repo = make_repo(tmp_path / "repo", object_format)
    digits = 64 if object_format == "sha256" else 40
    ssh = ssh_keys["ssh-ed25519"]
    env: dict[str, str] | None = None
    if signer == "ssh":
        key_file = tmp_path / "allowed_signers"
        key_file.write_text(ssh["allowed_signers"])
        git(repo, "config", "gpg.format", "ssh")
        git(repo, "config", "gpg.ssh.allowedSignersFile", str(key_file))
        tag_args: tuple[str, ...] = ("--format", "ssh")  # the server's first SSH key, pinned
        branch_args: tuple[str, ...] = ("--key", ssh["fingerprint"])
        expected = ssh["fingerprint"]
    else:
        key_file = TEST_PUBLIC_KEY
        env = {**os.environ, "GNUPGHOME": str(keyring(TEST_PUBLIC_KEY, tmp_path / "gnupg"))}
        tag_args = ()  # trust on first use
        branch_args = ("--key", str(TEST_PUBLIC_KEY))
        expected = TEST_FPR
    first = git(repo, "rev-parse", "HEAD").strip()

    code, out, err = stampd(capsys, "--tag", "stamp", "--server", server.url, "--repo",
                            str(repo), *tag_args)
    assert code == 0, err
    assert f"stamps commit: {first}" in out and expected in out
    oid = git(repo, "rev-parse", "refs/tags/stamp").strip()
    assert len(oid) == digits
    pin = pin_name(server.url)
    assert git(repo, "config", "--get", f"timestamper.{pin}.keyid").strip() == TEST_FPR
    if signer == "ssh":
        assert git(repo, "config", "--get", f"timestamper.{pin}.sshkey").strip() == expected

    heads = []
    for n in range(2):
        code, out, err = stampd(capsys, "--branch", "stamps", "--server", server.url,
                                "--repo", str(repo), *branch_args)
        assert code == 0, err
        heads.append(git(repo, "rev-parse", "refs/heads/stamps").strip())
        commit(repo, f"next {n}")
    parents = git(repo, "rev-parse", "stamps^@").split()
    assert parents == [heads[0], git(repo, "rev-parse", "HEAD~1").strip()]  # the chain
    assert git(repo, "rev-parse", f"{heads[0]}^@").split() == [first]
    assert f"chained on:    {heads[0]}" in out

    # The same commit twice on one branch is refused before anything is asked.
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    code, _, err = stampd(capsys, "--branch", "stamps", "--server", server.url, "--repo",
                          str(repo), *branch_args)
    assert code == 2 and "stamped on stamps already" in err

    for verb, target in (("verify-tag", "stamp"), ("verify-commit", "stamps"),
                         ("verify-commit", heads[0])):
        out = git(repo, verb, "--raw", target, env=env)
        assert (expected if signer == "ssh" else f"VALIDSIG {TEST_FPR}") in out
    git(repo, "fsck", "--strict", "--no-dangling")
    for target in ("stamp", "stamps"):
        assert cli.main(["verify", target, "--repo", str(repo), "--key", str(key_file)]) == 0
    out = capsys.readouterr().out
    assert expected in out and f"stamps commit: {first}" in out


def test_server_from_environment_and_git_config(server: Server, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo", "sha1")
    monkeypatch.delenv("STAMPD_SERVER", raising=False)
    code, _, err = stampd(capsys, "--tag", "t1", "--repo", str(repo))
    assert code == 2 and err.startswith("stampd stamp: no server: give --server URL")
    git(repo, "config", "timestamp.server", server.url)
    assert stampd(capsys, "--tag", "t1", "--repo", str(repo))[0] == 0
    monkeypatch.setenv("STAMPD_SERVER", "http://127.0.0.1:9/")  # wins over git config
    code, _, err = stampd(capsys, "--tag", "t2", "--repo", str(repo))
    assert code == 1 and "could not fetch the server key from http://127.0.0.1:9/" in err
    code, _, err = stampd(capsys, "--tag", "t1", "--repo", str(repo), "--server", server.url)
    assert code == 2 and "tag t1 exists already" in err
    code, _, err = stampd(capsys, "--tag", "a..b", "--repo", str(repo), "--server", server.url)
    assert code == 2 and "not a valid tag name" in err


def test_another_servers_key_is_refused(server: Server, other_server: Server, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """other_server signs with another key under the test key's user id: its stamps look
    right. Whether the key is pinned, fetched for the first time or given as --key FILE, the
    stamp is refused (exit 3) and neither a ref, an object nor a pin is stored."""
    repo = make_repo(tmp_path / "repo", "sha256")
    before = (refs(repo), git(repo, "count-objects", "-v"))
    relay = stamp_relay(keys=server.url, stamps=other_server.url)
    try:
        for args in (("--tag", "stamp"), ("--branch", "stamps"),
                     ("--tag", "stamp", "--key", str(TEST_PUBLIC_KEY))):
            code, _, err = stampd(capsys, *args, "--server", relay.url, "--repo", str(repo))
            assert code == 3, err
            assert err.startswith("stampd stamp: refused: the signature does not verify")
            assert (refs(repo), git(repo, "count-objects", "-v")) == before
        r = subprocess.run(["git", "-C", str(repo), "config", "--get-regexp", "^timestamper"],
                           capture_output=True, text=True, check=False)
        assert r.stdout == ""
    finally:
        relay.close()

    # A pinned key that the server no longer has: not even asked for a stamp.
    git(repo, "config", f"timestamper.{pin_name(other_server.url)}.keyid", TEST_FPR)
    code, _, err = stampd(capsys, "--tag", "stamp", "--server", other_server.url,
                          "--repo", str(repo))
    assert code == 1 and f"not the pinned {TEST_FPR}" in err
    assert refs(repo) == before[0]


def test_another_object_or_ssh_key_is_refused(server: Server,
                                              ssh_keys: dict[str, dict[str, str]],
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo", "sha1")
    other = make_repo(tmp_path / "other", "sha1")
    commit(other, "another commit")  # not one of repo's (the first commits may be identical)
    before = refs(repo)

    def other_commit(form: dict[str, str]) -> dict[str, str]:
        return {**form, "commit": git(other, "rev-parse", "HEAD").strip(),
                "tree": git(other, "rev-parse", "HEAD^{tree}").strip()}

    def other_ssh_key(form: dict[str, str]) -> dict[str, str]:
        return {**form, "key": ssh_keys["ssh-ecdsa-p256"]["fingerprint"]}

    for edit, args, says in (
            (other_commit, ("--tag", "stamp"), "refused: the tag does not start with"),
            (other_commit, ("--branch", "stamps"), "refused: the commit does not start with"),
            (other_ssh_key, ("--tag", "stamp", "--key", ssh_keys["ssh-ed25519"]["fingerprint"]),
             f"refused: signed by {ssh_keys['ssh-ecdsa-p256']['fingerprint']}, not by")):
        relay = stamp_relay(keys=server.url, stamps=server.url, edit=edit)
        try:
            code, _, err = stampd(capsys, *args, "--server", relay.url, "--repo", str(repo))
        finally:
            relay.close()
        assert code == 3 and err.startswith(f"stampd stamp: {says}"), err
        assert refs(repo) == before


def test_verify_says_unsupported_for_unknown_signatures(server: Server, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    repo = make_repo(tmp_path / "repo", "sha1")
    head = git(repo, "rev-parse", "HEAD").strip()
    tag = (f"object {head}\ntype commit\ntag x509\ntagger T <t@example.invalid> 1795400000 "
           "+0000\n\nsigned\n-----BEGIN SIGNED MESSAGE-----\nAAAA\n-----END SIGNED MESSAGE-----\n")
    oid = git(repo, "mktag", input=tag).strip()
    git(repo, "update-ref", "refs/tags/x509", oid)
    assert cli.main(["verify", "x509", "--repo", str(repo), "--key", str(TEST_PUBLIC_KEY)]) == 1
    assert capsys.readouterr().err.startswith("stampd verify: unsupported: the tag is signed in "
                                              "a format stampd verify cannot check")
    # An SSH stamp checked with an OpenPGP key file: an unusable --key, named as such.
    assert stampd(capsys, "--tag", "ssh", "--format", "ssh", "--server", server.url,
                  "--repo", str(repo))[0] == 0
    assert cli.main(["verify", "ssh", "--repo", str(repo), "--key", str(TEST_PUBLIC_KEY)]) == 2
    assert "holds no SSH public key" in capsys.readouterr().err
