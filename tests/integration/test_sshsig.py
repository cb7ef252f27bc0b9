"""SSHSIG built in-process and signed by a real ssh-agent, checked by real ssh-keygen and git.

Ed25519 is deterministic, so for it the armored signature must be byte-identical to
``ssh-keygen -Y sign``. For every key type ``ssh-keygen -Y verify`` and ``git verify-tag`` /
``git verify-commit`` (``gpg.format=ssh``, an allowed-signers file made by
:func:`allowed_signers_line`) must accept the signature, and reject a tampered message.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from formats.sshsig import (
    SSH_AGENT_RSA_SHA2_512,
    SshPublicKey,
    SshSigError,
    SshSignature,
    allowed_signers_line,
    armor,
    check_signature_blob,
    dearmor,
    ssh_signature,
    sshsig_signed_data,
)
from tests.helpers import short_tmpdir
from workers.agents.ssh import SshAgent, SshAgentConnection, SshAgentError

KEY_SPECS = {  # name -> ssh-keygen arguments
    "ed25519": ["-t", "ed25519"],
    "ecdsa-p256": ["-t", "ecdsa", "-b", "256"],
    "ecdsa-p384": ["-t", "ecdsa", "-b", "384"],
    "ecdsa-p521": ["-t", "ecdsa", "-b", "521"],
    "rsa3072": ["-t", "rsa", "-b", "3072"],
}
KEY_TYPES = {
    "ed25519": "ssh-ed25519",
    "ecdsa-p256": "ecdsa-sha2-nistp256",
    "ecdsa-p384": "ecdsa-sha2-nistp384",
    "ecdsa-p521": "ecdsa-sha2-nistp521",
    "rsa3072": "ssh-rsa",
}
PRINCIPAL = "stampd@example.invalid"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}


def require_tools() -> None:
    """These tests need OpenSSH and git: fail loudly, never skip."""
    missing = [t for t in ("ssh-agent", "ssh-add", "ssh-keygen", "git") if not shutil.which(t)]
    if missing:
        pytest.fail(f"required tools missing: {', '.join(missing)}")


@dataclass
class Key:
    name: str
    private: Path
    public: SshPublicKey


@dataclass
class Env:
    dir: Path
    agent: SshAgent
    conn: SshAgentConnection
    keys: dict[str, Key]


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    require_tools()
    base = short_tmpdir("sshsig")
    os.chmod(base, 0o700)
    home = base / "agent"
    home.mkdir(mode=0o700)
    agent = SshAgent(home)
    try:
        keys = {}
        for name, args in KEY_SPECS.items():
            path = base / name
            subprocess.run(
                ["ssh-keygen", "-q", *args, "-N", "", "-C", f"{name}-key", "-f", str(path)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
            keys[name] = Key(
                name, path, SshPublicKey.from_line(path.with_suffix(".pub").read_text())
            )
        agent.start()
        for key in keys.values():
            assert agent.add_key(key.private).blob == key.public.blob
        with agent.connect() as conn:
            yield Env(base, agent, conn, keys)
    finally:
        pid = agent._pid
        agent.stop()
        if pid is not None:
            assert not Path(f"/proc/{pid}").exists()
        shutil.rmtree(base, ignore_errors=True)


def keygen_sign(key: Path, message: bytes, namespace: str, *extra: str) -> str:
    result = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-n", namespace, "-f", str(key), *extra],
        input=message,
        capture_output=True,
        check=True,
    )
    return result.stdout.decode("ascii")


def keygen_verify(
    env: Env, key: Key, signature: str, message: bytes, namespace: str = "git"
) -> subprocess.CompletedProcess[bytes]:
    allowed = env.dir / f"allowed-{key.name}"
    allowed.write_text(allowed_signers_line(PRINCIPAL, key.public.to_line()) + "\n")
    sig = env.dir / f"sig-{key.name}"
    sig.write_text(signature)
    argv = ["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", PRINCIPAL, "-n", namespace]
    return subprocess.run(
        [*argv, "-s", str(sig)],
        input=message,
        capture_output=True,
        check=False,
    )


def git(repo: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **GIT_ENV},
        check=False,
    )


@pytest.fixture(scope="module")
def repo(env: Env) -> Path:
    path = env.dir / "repo"
    assert git(env.dir, "init", "-q", str(path)).returncode == 0
    return path


def git_verify(
    repo: Path, env: Env, key: Key, kind: str, oid: str
) -> subprocess.CompletedProcess[bytes]:
    allowed = env.dir / f"allowed-git-{key.name}"
    allowed.write_text(allowed_signers_line(PRINCIPAL, key.public.to_line()) + "\n")
    return git(
        repo,
        "-c", "gpg.format=ssh", "-c", f"gpg.ssh.allowedSignersFile={allowed}",
        kind, "--raw", oid,
    )  # fmt: skip


def write_object(repo: Path, kind: str, text: str) -> str:
    result = git(
        repo, "hash-object", "-t", kind, "-w", "--literally", "--stdin", stdin=text.encode()
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().strip()


# --------------------------------------------------------------------------------------------
# Byte identity with ssh-keygen (deterministic ed25519)


@pytest.mark.parametrize(
    ("message", "namespace", "hash_alg"),
    [
        (b"hello\n", "git", "sha512"),
        (b"", "git", "sha512"),
        (bytes(range(256)) * 40, "stampd", "sha512"),
        (b"object x\n\nmessage\n", "git", "sha256"),
    ],
    ids=["text", "empty", "binary-stampd", "sha256"],
)
def test_ed25519_byte_identical_to_ssh_keygen(
    env: Env, message: bytes, namespace: str, hash_alg: str
) -> None:
    key = env.keys["ed25519"]
    ours = env.conn.sshsig(key.public, message, namespace, hash_alg)
    theirs = keygen_sign(key.private, message, namespace, "-O", f"hashalg={hash_alg}")
    assert ours == theirs

    # And through the pure API with the agent as the sign callable.
    def sign(data: bytes) -> bytes:
        return env.conn.sign(key.public.blob, data)

    assert ssh_signature(message, key.public.blob, namespace, sign, hash_alg) == theirs


def test_armor_layout_matches_ssh_keygen(env: Env) -> None:
    text = keygen_sign(env.keys["rsa3072"].private, b"layout\n", "git")
    lines = text.split("\n")
    assert lines[0] == "-----BEGIN SSH SIGNATURE-----"
    assert lines[-2:] == ["-----END SSH SIGNATURE-----", ""]
    assert {len(line) for line in lines[1:-3]} == {70}
    assert 0 < len(lines[-3]) <= 70
    assert armor(dearmor(text)) == text
    parsed = SshSignature.from_armored(text)
    assert parsed.public_key.blob == env.keys["rsa3072"].public.blob
    assert (parsed.namespace, parsed.hash_alg) == ("git", "sha512")


# --------------------------------------------------------------------------------------------
# Every key type: ssh-keygen -Y verify, git verify-tag, git verify-commit


@pytest.mark.parametrize("name", list(KEY_SPECS))
def test_ssh_keygen_verifies(env: Env, name: str) -> None:
    key = env.keys[name]
    assert key.public.key_type == KEY_TYPES[name]
    message = f"digest receipt for {name}\n".encode()
    signature = env.conn.sshsig(key.public, message, "git")
    parsed = SshSignature.from_armored(signature)
    assert parsed.public_key.blob == key.public.blob
    check_signature_blob(key.public, parsed.signature)

    good = keygen_verify(env, key, signature, message)
    assert good.returncode == 0, good.stderr
    assert f'Good "git" signature for {PRINCIPAL}'.encode() in good.stdout

    tampered = keygen_verify(env, key, signature, message + b"x")
    assert tampered.returncode != 0
    other_namespace = keygen_verify(env, key, signature, message, namespace="file")
    assert other_namespace.returncode != 0


@pytest.mark.parametrize("name", list(KEY_SPECS))
def test_git_verify_tag(env: Env, repo: Path, name: str) -> None:
    key = env.keys[name]
    payload = (
        f"object {COMMIT}\ntype commit\ntag stamp-{name}\n"
        "tagger A <a@b> 1700000000 +0000\n\nTimestamp\n"
    )
    signature = env.conn.sshsig(key.public, payload.encode(), "git")
    oid = write_object(repo, "tag", payload + signature)
    good = git_verify(repo, env, key, "verify-tag", oid)
    assert good.returncode == 0, good.stderr
    assert f'Good "git" signature for {PRINCIPAL}'.encode() in good.stderr

    tampered = write_object(repo, "tag", payload.replace("Timestamp", "Timestamq") + signature)
    assert git_verify(repo, env, key, "verify-tag", tampered).returncode != 0


@pytest.mark.parametrize("name", list(KEY_SPECS))
def test_git_verify_commit(env: Env, repo: Path, name: str) -> None:
    key = env.keys[name]
    headers = (
        f"tree {EMPTY_TREE}\nauthor A <a@b> 1700000000 +0000\ncommitter A <a@b> 1700000000 +0000\n"
    )
    body = f"\nstamp {name}\n"
    signature = env.conn.sshsig(key.public, (headers + body).encode(), "git")
    gpgsig = "gpgsig " + signature.rstrip("\n").replace("\n", "\n ") + "\n"
    oid = write_object(repo, "commit", headers + gpgsig + body)
    good = git_verify(repo, env, key, "verify-commit", oid)
    assert good.returncode == 0, good.stderr
    assert f'Good "git" signature for {PRINCIPAL}'.encode() in good.stderr

    tampered = write_object(repo, "commit", headers + gpgsig + body.replace("stamp", "stomp"))
    assert git_verify(repo, env, key, "verify-commit", tampered).returncode != 0


# --------------------------------------------------------------------------------------------
# RSA algorithm choice


def test_rsa_needs_sha2_512_flag(env: Env) -> None:
    key = env.keys["rsa3072"]
    data = sshsig_signed_data(b"m", "git")
    sha1 = env.conn.sign(key.public.blob, data)  # no flag: the agent falls back to ssh-rsa
    with pytest.raises(SshSigError, match="SSH_AGENT_RSA_SHA2_512"):
        check_signature_blob(key.public, sha1)
    with pytest.raises(SshSigError, match="ssh-rsa"):
        ssh_signature(b"m", key.public.blob, "git", lambda d: env.conn.sign(key.public.blob, d))
    good = env.conn.sign(key.public.blob, data, SSH_AGENT_RSA_SHA2_512)
    check_signature_blob(key.public, good)
    assert good[4:16] == b"rsa-sha2-512"


# --------------------------------------------------------------------------------------------
# Keys and allowed_signers (pure)


@pytest.mark.parametrize("name", list(KEY_SPECS))
def test_public_key_parsing_and_fingerprint(env: Env, name: str) -> None:
    key = env.keys[name]
    pub_file = key.private.with_suffix(".pub")
    line = pub_file.read_text().strip()
    assert key.public.to_line() == line
    assert key.public.comment == f"{name}-key"
    assert SshPublicKey.from_blob(key.public.blob).to_line() == line.rsplit(" ", 1)[0]
    listing = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(pub_file)], capture_output=True, check=True, text=True
    ).stdout.split()
    assert int(listing[0]) == key.public.bits
    assert listing[1] == key.public.fingerprint


def test_allowed_signers_line_format(env: Env) -> None:
    key = env.keys["ed25519"].public
    b64 = base64.b64encode(key.blob).decode()
    assert allowed_signers_line("me@x", key.to_line()) == f'me@x namespaces="git" ssh-ed25519 {b64}'
    assert (
        allowed_signers_line("me@x", key.to_line(), namespaces="git,stampd")
        == f'me@x namespaces="git,stampd" ssh-ed25519 {b64}'
    )
    assert allowed_signers_line("me@x", key.to_line(), None) == f"me@x ssh-ed25519 {b64}"
    for principal in ["", "a b", "*@x", "a,b", 'a"b', "#x", "a\nb"]:
        with pytest.raises(SshSigError):
            allowed_signers_line(principal, key.to_line())
    for namespaces in ["", "git,", 'g"it', "git stampd"]:
        with pytest.raises(SshSigError):
            allowed_signers_line("me@x", key.to_line(), namespaces)


def test_malformed_input_rejected(env: Env) -> None:
    ed = env.keys["ed25519"].public
    with pytest.raises(SshSigError):
        SshPublicKey.from_line("ssh-ed25519")
    with pytest.raises(SshSigError):
        SshPublicKey.from_line("ssh-ed25519 !!notbase64")
    with pytest.raises(SshSigError, match="says"):  # type field disagrees with the blob
        SshPublicKey.from_line("ssh-rsa " + ed.to_line().split()[1])
    with pytest.raises(SshSigError, match="trailing"):
        SshPublicKey.from_blob(ed.blob + b"\0")
    with pytest.raises(SshSigError, match="truncated"):
        SshPublicKey.from_blob(ed.blob[:-1])
    with pytest.raises(SshSigError, match="unsupported SSH key type"):
        SshPublicKey.from_blob(b"\0\0\0\x07ssh-dss")
    with pytest.raises(SshSigError, match="hash algorithm"):
        sshsig_signed_data(b"m", "git", "sha1")
    with pytest.raises(SshSigError, match="namespace"):
        sshsig_signed_data(b"m", "")
    with pytest.raises(SshSigError):
        dearmor("-----BEGIN SSH SIGNATURE-----\n-----END SSH SIGNATURE-----\n")


def test_agent_failure_is_an_agent_error(env: Env) -> None:
    # A key the agent does not hold: SSH_AGENT_FAILURE; the connection stays usable.
    unknown = SshPublicKey.from_blob(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(32))
    with pytest.raises(SshAgentError, match="SSH_AGENT_FAILURE"):
        env.conn.sshsig(unknown, b"m", "git")
    assert len(env.conn.list_identities()) == len(KEY_SPECS)
