"""Signatures that outlive their keys (issue 42): `stampd verify COMMIT|TAG --signers FILE` and
`--range A..B` check a commit's or tag's own signature at the time its stamp proves, with real
git, ssh-keygen and gpg against a live stampd (transparency log on, one witness of its own).

The stamps are made by the real post-commit hook at the server's real time, which cannot be
injected: each key's end is therefore placed relative to the stamp's time read from the stamp
(valid-before = the stamp's second, a key expiring the second after it). Where gpg itself is
asked about a later moment, its clock is faked (``--faked-system-time``), never waited for;
one test waits for the clock to leave a stamp's second (under a second) before it revokes a key,
as a revocation made in the stamp's own second could not be told from one made before it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from formats.gitobjects import split_signed
from formats.note import parse_note
from formats.tlog.proof import TlogProof
from stampd import cli
from tests.helpers import (
    TEST_PUBLIC_KEY,
    LocalWitness,
    Server,
    git,
    make_repo,
    require_tools,
    seed_data_dir,
    short_tmpdir,
    start_server,
    wait_for,
)

BRANCH = "stamps-timestamps"
WITNESS = "w.example/witness"
NOTES = "refs/notes/stampd-tlog"


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    require_tools("git", "gpg", "gpg-agent", "ssh-keygen", "curl")


@pytest.fixture(scope="module")
def witness() -> Iterator[LocalWitness]:
    w = LocalWitness(WITNESS)
    yield w
    w.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, witness: LocalWitness) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("outlive") / "data")
    s = start_server(data, workers=1, args=("--witness", witness.spec), extra_env={
        "STAMPD_TLOG": "on", "STAMPD_EXTRA_KEYS": "ssh:ed25519",
        "STAMPD_WITNESS_TIMEOUT": "1", "STAMPD_WITNESS_RETRY_BASE": "0.2",
        "STAMPD_WITNESS_RETRY_MAX": "1"})
    try:
        witness.trust(get(s, "tlog/vkey").decode().strip())
        s.wait_ready(workers=2)
        yield s
    finally:
        s.stop()
        shutil.rmtree(s.runtime_dir, ignore_errors=True)


def get(s: Server, path: str) -> bytes:
    with urllib.request.urlopen(s.url + path, timeout=30) as r:
        return bytes(r.read())


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def ssh_time(t: int) -> str:
    return time.strftime("%Y%m%d%H%M%SZ", time.gmtime(t))


def ssh_key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, timeout=60)
    return path.with_suffix(".pub")


def signers_file(path: Path, principal: str, pub: Path, options: str = "") -> Path:
    opts = f'namespaces="git"{"," + options if options else ""}'
    path.write_text(f"{principal} {opts} {pub.read_text().split()[0]} "
                    f"{pub.read_text().split()[1]}\n")
    return path


def hooked_repo(capsys: pytest.CaptureFixture[str], path: Path, s: Server,
                object_format: str = "sha1", *extra: str) -> Path:
    repo = make_repo(path, object_format)
    code, _, err = run(capsys, "hook", "install", "--repo", repo, "--server",
                         s.url.rstrip("/"), "--branch", BRANCH, "--proof-wait", "10", *extra)
    assert code == 0, err
    return repo


def ssh_signing(repo: Path, pub: Path) -> None:
    git(repo, "config", "gpg.format", "ssh")
    git(repo, "config", "user.signingkey", str(pub))
    git(repo, "config", "commit.gpgsign", "true")


def commit(repo: Path, name: str, env: dict[str, str] | None = None) -> str:
    (repo / f"{name}.txt").write_text(f"{name}\n")
    git(repo, "add", f"{name}.txt")
    r = subprocess.run(["git", "commit", "-q", "-m", name], cwd=repo, capture_output=True,
                       text=True, timeout=120, env={**os.environ, **(env or {})}, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stampd:" not in r.stderr, r.stderr  # the hook stamped it (and kept its proof)
    return git(repo, "rev-parse", "HEAD").strip()


def dated(t: int) -> dict[str, str]:
    return {"GIT_COMMITTER_DATE": f"@{t} +0000", "GIT_AUTHOR_DATE": f"@{t} +0000"}


def stamp_of(repo: Path, commit_id: str) -> tuple[str, int]:
    """(the stamp on the timestamp branch whose last parent is ``commit_id``, its time)."""
    for line in git(repo, "rev-list", "--first-parent", "--parents", BRANCH).splitlines():
        ids = line.split()
        if ids[-1] == commit_id:
            t = int(git(repo, "log", "-1", "--format=%ct", ids[0]).strip())
            return ids[0], t
    raise AssertionError(f"no stamp of {commit_id}")


def git_verify(repo: Path, rev: str, *config: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    flags = [x for c in config for x in ("-c", c)]
    return subprocess.run(["git", *flags, "verify-commit", rev], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})},
                          check=False)


def line(out: str, label: str) -> str:
    return next(x for x in out.splitlines() if x.startswith(label))


# --------------------------------------------------------------------------- SSH


def test_ssh_signature_checked_at_the_stamps_time(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A commit signed while its key was valid and stamped then: accepted once the key's
    valid-before has passed; a commit signed after its key's end with an earlier committer
    date: `git verify-commit` says Good, `stampd verify` refuses naming both times; a signer
    whose clock ran ahead: git refuses, stampd and git with stampd's wrapper accept."""
    alice = ssh_key(tmp_path / "alice")
    old = ssh_key(tmp_path / "old")
    repo = hooked_repo(capsys, tmp_path / "repo", server, "sha1", "--git-verify")
    ssh_signing(repo, alice)
    legit = commit(repo, "legit")
    _, t = stamp_of(repo, legit)
    signers = signers_file(tmp_path / "signers", "alice@example.org", alice,
                           f'valid-before="{ssh_time(t)}"')
    code, out, err = run(capsys, "verify", legit, "--repo", repo, "--signers", signers)
    assert code == 0, err
    assert out.startswith(f"valid signature: commit {legit}\n"), out
    assert "alice@example.org" in line(out, "signed by:")
    assert line(out, "time:") == f"time:          signed no later than {iso(t)} ({t})"
    assert "the server key 474CDCD4B9FAC83751047AD207C6AAE46E9FC8C9" in \
        line(out, "vouched for by:") and "and its log (index" in out, out
    assert "of this commit" in line(out, "stamp:")
    # The key's end has passed: ssh-keygen itself refuses it at any time after the stamp.
    payload, signature, _ = split_signed("commit", git_bytes(repo, "cat-file", "commit", legit))
    assert signature is not None
    (tmp_path / "legit.sig").write_bytes(signature)
    for at, ok in ((t, True), (t + 1, False)):
        r = subprocess.run(["ssh-keygen", "-Y", "verify", "-n", "git", "-f", str(signers),
                            "-I", "alice@example.org", "-s", str(tmp_path / "legit.sig"),
                            f"-Overify-time={ssh_time(at)}"], input=payload,
                           capture_output=True, timeout=60, check=False)
        assert (r.returncode == 0) == ok, r.stderr
    assert "key has expired" in r.stderr.decode()
    # git checks at the committer date, before the key's end too: it agrees.
    assert git_verify(repo, legit, f"gpg.ssh.allowedSignersFile={signers}").returncode == 0

    # Signed with a key that ended an hour ago, dated before its end: git says Good.
    end = t - 3600
    both = tmp_path / "both"
    both.write_text(signers.read_text() + signers_file(
        tmp_path / "ended", "alice@example.org", old,
        f'valid-before="{ssh_time(end)}"').read_text())
    ssh_signing(repo, old)
    forged = commit(repo, "forged", dated(end - 600))
    ssh_signing(repo, alice)
    _, t_forged = stamp_of(repo, forged)
    plain = git_verify(repo, forged, f"gpg.ssh.allowedSignersFile={both}",
                       "gpg.ssh.program=ssh-keygen")
    assert plain.returncode == 0 and 'Good "git" signature' in plain.stderr, plain.stderr
    code, out, err = run(capsys, "verify", forged, "--repo", repo, "--signers", both)
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"stampd verify: invalid: commit {forged}: signed by "
                          "alice@example.org"), err
    assert f"valid-before {iso(end)}" in err and f"not valid at {iso(t_forged)}" in err, err
    assert f"committer date, {iso(end - 600)}" in err, err
    wrapped = git_verify(repo, forged, f"gpg.ssh.allowedSignersFile={both}")
    assert wrapped.returncode != 0, wrapped.stderr
    assert "the time its stamp proves" in wrapped.stderr, wrapped.stderr

    # The signer's clock an hour ahead: git checks the key at that date, after its end.
    ahead = commit(repo, "ahead", dated(int(time.time()) + 3600))
    _, t_ahead = stamp_of(repo, ahead)
    window = tmp_path / "window"
    window.write_text(both.read_text().replace(f'valid-before="{ssh_time(t)}"',
                                               f'valid-before="{ssh_time(t_ahead + 60)}"'))
    plain = git_verify(repo, ahead, f"gpg.ssh.allowedSignersFile={window}",
                       "gpg.ssh.program=ssh-keygen")
    assert plain.returncode != 0, plain.stderr
    code, out, err = run(capsys, "verify", ahead, "--repo", repo, "--signers", window)
    assert code == 0, err
    wrapped = git_verify(repo, ahead, f"gpg.ssh.allowedSignersFile={window}")
    assert wrapped.returncode == 0, wrapped.stderr
    assert f"checked at {ssh_time(t_ahead)}, the time its stamp proves" in wrapped.stderr

    # The range, in CI: one line per commit, the forged one refused (exit 1).
    code, out, err = run(capsys, "verify", "--range", "HEAD~3..HEAD", "--repo", repo,
                         "--signers", window)
    assert code == 1 and err.count("\n") == 1, err
    assert "3 commit(s) of range HEAD~3..HEAD: 2 valid, 1 invalid" in err
    assert [x.split()[:2] for x in out.splitlines()[:3]] == [
        ["ok", ahead[:12]], ["INVALID", forged[:12]], ["ok", legit[:12]]], out

    code, out, err = run(capsys, "hook", "uninstall", "--repo", repo)
    assert code == 0 and "unset gpg.ssh.program" in out, err
    assert git_verify(repo, ahead, f"gpg.ssh.allowedSignersFile={window}").returncode != 0


def git_bytes(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, timeout=60,
                          check=True).stdout


def test_unstamped_commits_and_a_descendants_stamp(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A commit no stamp covers: said in one line, exit 3 (a range with one, too). A commit
    whose own stamp is missing is covered by a descendant's, which is named."""
    pub = ssh_key(tmp_path / "bob")
    signers = signers_file(tmp_path / "signers", "bob@example.org", pub)
    repo = make_repo(tmp_path / "repo")
    ssh_signing(repo, pub)
    first = commit(repo, "unstamped")
    code, out, err = run(capsys, "verify", first, "--repo", repo, "--signers", signers)
    assert code == 3 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"stampd verify: not stamped: commit {first} is signed by "
                          "bob@example.org"), err
    code, out, err = run(capsys, "hook", "install", "--repo", repo, "--server",
                         server.url.rstrip("/"), "--branch", BRANCH)
    assert code == 0, err
    second = commit(repo, "stamped")
    code, out, err = run(capsys, "verify", first, "--repo", repo, "--signers", signers)
    assert code == 0, err
    assert f"of its descendant {second[:12]}" in line(out, "stamp:"), out
    # An unsigned commit (the repository's first) is malformed alone, invalid in a range.
    root = git(repo, "rev-list", "--max-parents=0", "HEAD").strip()
    code, _, err = run(capsys, "verify", root, "--repo", repo, "--signers", signers)
    assert code == 2 and "not signed" in err, err
    git(repo, "config", "stampd.server", "http://127.0.0.1:9")  # (unreachable: no hook stamp)
    third = subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "late"], cwd=repo,
                           capture_output=True, text=True, timeout=120, check=False)
    assert third.returncode == 0 and "timestamp not obtained" in third.stderr
    code, out, err = run(capsys, "verify", "--range", f"{root}..HEAD", "--repo", repo,
                         "--signers", signers)
    assert code == 3 and "2 valid, 0 invalid, 0 not signed, 1 not stamped" in err, out + err
    assert out.splitlines()[0].startswith("NOT STAMPED  "), out


def cosigned_proof(s: Server, object_id: str) -> bytes:
    """The git stamp's proof once its checkpoint carries the witness's cosignature."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        proof = get(s, f"v1/proofs/git/{object_id}?wait=5")
        if any(sig.name == WITNESS
               for sig in parse_note(TlogProof.parse(proof).checkpoint).signatures):
            return proof
        time.sleep(0.2)
    raise AssertionError(f"no cosigned proof of {object_id}:\n{s.log()}")


def test_the_witnesses_bound_and_the_weaker_one(
        server: Server, witness: LocalWitness, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With --policy and a cosigned proof the witnesses vouch for the time; with the proof
    missing, or a cosignature that does not verify, the stamp's own time is used, and said."""
    pub = ssh_key(tmp_path / "carol")
    signers = signers_file(tmp_path / "signers", "carol@example.org", pub)
    repo = hooked_repo(capsys, tmp_path / "repo", server)
    ssh_signing(repo, pub)
    c = commit(repo, "witnessed")
    stamp, t = stamp_of(repo, c)
    proof = cosigned_proof(server, stamp)
    note_file = tmp_path / "proof"
    note_file.write_bytes(proof)
    git(repo, "notes", "--ref=stampd-tlog", "add", "-f", "-F", str(note_file), stamp)
    policy = tmp_path / "policy"
    vkey = get(server, "tlog/vkey").decode().strip()
    policy.write_text(f"log {vkey}\nwitness w {witness.vkey}\nquorum w\n")
    code, out, err = run(capsys, "verify", c, "--repo", repo, "--signers", signers,
                         "--policy", policy)
    assert code == 0, err
    assert "the witnesses w (a quorum of" in line(out, "vouched for by:"), out
    assert "independently of the server's key" in out
    assert line(out, "witnessed:").startswith("witnessed:     1 of 1 witnesses")
    cosigned = int(line(out, "time:").rsplit("(", 1)[1].rstrip(")"))
    assert cosigned >= t
    # A cosignature that does not verify: the stamp's time, said.
    note = parse_note(TlogProof.parse(proof).checkpoint)
    bad = bytearray(proof)
    w_line = next(s for s in note.signatures if s.name == WITNESS).line()
    pos = proof.index(w_line.encode()) + w_line.rindex(" ") + 1 + 60  # in its signature
    bad[pos] = ord("A") if bad[pos] != ord("A") else ord("B")
    note_file.write_bytes(bytes(bad))
    git(repo, "notes", "--ref=stampd-tlog", "add", "-f", "-F", str(note_file), stamp)
    code, out, err = run(capsys, "verify", c, "--repo", repo, "--signers", signers,
                         "--policy", policy)
    assert code == 0, err
    assert line(out, "time:") == f"time:          signed no later than {iso(t)} ({t})"
    assert "the witnesses' cosignatures do not verify" in line(out, "note:"), out
    # No proof at all: the server's key alone, said.
    git(repo, "notes", "--ref=stampd-tlog", "remove", stamp)
    code, out, err = run(capsys, "verify", c, "--repo", repo, "--signers", signers,
                         "--policy", policy)
    assert code == 0, err
    assert line(out, "vouched for by:").startswith("vouched for by: the server key 474C")
    assert "no log proof of the stamp: its time rests on the server's key alone" in out
    # --fetch-proof fetches it again, and keeps it.
    code, out, err = run(capsys, "verify", c, "--repo", repo, "--signers", signers,
                         "--fetch-proof")
    assert code == 0 and "and its log (index" in out, err
    assert git(repo, "notes", "--ref=stampd-tlog", "show", stamp).startswith("c2sp.org/")


def test_sha256_repository_with_ssh_stamps(server: Server, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pub = ssh_key(tmp_path / "dave")
    signers = signers_file(tmp_path / "signers", "dave@example.org", pub)
    repo = hooked_repo(capsys, tmp_path / "repo", server, "sha256", "--format", "ssh")
    ssh_signing(repo, pub)
    c = commit(repo, "sha256")
    assert len(c) == 64 and "\ngpgsig-sha256 -----BEGIN SSH" in git(repo, "cat-file",
                                                                      "commit", c)
    stamp, t = stamp_of(repo, c)
    assert "\ngpgsig-sha256 -----BEGIN SSH" in git(repo, "cat-file", "commit", stamp)
    code, out, err = run(capsys, "verify", c, "--repo", repo, "--signers", signers)
    assert code == 0, err
    assert "vouched for by: the server key SHA256:" in out and f"({t})" in out, out
    code, out, err = run(capsys, "verify", "--range", "HEAD", "--repo", repo, "--signers",
                         signers)
    assert code == 1 and "1 valid, 0 invalid, 1 not signed" in err, out + err


# --------------------------------------------------------------------------- OpenPGP


class Signer:
    """A GnuPG home with its own agent (stopped by PID), whose keys sign commits; gpg runs
    through a wrapper that fakes its clock when FAKETIME is set."""

    def __init__(self, tmp: Path) -> None:
        from workers.agents.gpg import GpgAgent

        self.home = short_tmpdir("sg")
        os.chmod(self.home, 0o700)
        self.agent = GpgAgent(self.home)
        self.agent.start()
        self.program = tmp / "gpg-faked"
        self.program.write_text('#!/bin/sh\nif [ -n "$FAKETIME" ]; then\n'
                                '  exec gpg --faked-system-time "$FAKETIME!" "$@"\nfi\n'
                                'exec gpg "$@"\n')
        self.program.chmod(0o755)

    def env(self, faked: int | None = None) -> dict[str, str]:
        env = {**os.environ, "GNUPGHOME": str(self.home)}
        if faked is not None:
            env["FAKETIME"] = str(faked)
        return env

    def gpg(self, *args: str, faked: int | None = None, input: bytes | None = None
            ) -> subprocess.CompletedProcess[bytes]:
        argv = [str(self.program), "--batch", "--pinentry-mode", "loopback", "--passphrase",
                "", *args]
        r = subprocess.run(argv, input=input, capture_output=True, timeout=120,
                           env=self.env(faked), check=False)
        assert r.returncode == 0, r.stderr.decode()
        return r

    def new_key(self, name: str, created: int, expire: str = "never") -> str:
        r = self.gpg("--status-fd", "1", "--quick-gen-key", f"{name} <{name}@example.org>",
                     "ed25519", "sign", expire, faked=created)
        return next(x.split()[-1] for x in r.stdout.decode().splitlines()
                    if x.startswith("[GNUPG:] KEY_CREATED"))

    def revoke(self, fpr: str, menu_reason: int) -> None:
        """Revoke with gpg's menu reason (1 compromised, 2 superseded, 3 no longer used)."""
        self.gpg("--command-fd", "0", "--edit-key", fpr,
                 input=f"revkey\ny\n{menu_reason}\ntest\n\ny\nsave\n".encode())

    def export(self, path: Path, *fprs: str) -> Path:
        path.write_bytes(self.gpg("--export", *fprs).stdout)
        return path

    def close(self) -> None:
        self.agent.stop()
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def signer(tmp_path: Path) -> Iterator[Signer]:
    s = Signer(tmp_path)
    yield s
    s.close()


def pgp_commit(repo: Path, signer: Signer, fpr: str, name: str, faked: int | None = None,
               when: int | None = None) -> str:
    git(repo, "config", "user.signingkey", fpr)
    env = signer.env(faked)
    if when is not None:
        env.update(dated(when))
    (repo / f"{name}.txt").write_text(f"{name}\n")
    git(repo, "add", f"{name}.txt")
    r = subprocess.run(["git", "-c", f"gpg.program={signer.program}", "commit", "-q", "-S",
                        "-m", name], cwd=repo, capture_output=True, text=True, timeout=120,
                       env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return git(repo, "rev-parse", "HEAD").strip()


def test_openpgp_expired_and_revoked_keys(
        server: Server, signer: Signer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A key that expired after the stamp: accepted (git refuses once it has expired); one
    expired before the stamp: refused, naming both times. A key revoked as superseded after the
    stamp: accepted; a commit it signed but stamped after the revocation: refused; a key
    revoked as compromised: refused whatever its stamps."""
    repo = hooked_repo(capsys, tmp_path / "repo", server)
    now = int(time.time())
    k1 = signer.new_key("erin", created=now - 7200)
    a = pgp_commit(repo, signer, k1, "a")
    _, t_a = stamp_of(repo, a)
    # The key's expiry set to the second after the stamp, by a self-signature made before it.
    signer.gpg("--quick-set-expire", k1, "seconds=61", faked=t_a - 60)
    keys = signer.export(tmp_path / "erin.gpg", k1)
    code, out, err = run(capsys, "verify", a, "--repo", repo, "--signers", keys)
    assert code == 0, err
    assert f"expires {iso(t_a + 1)}" in line(out, "signed by:"), out
    assert line(out, "time:") == f"time:          signed no later than {iso(t_a)} ({t_a})"
    # git, asked once the key has expired (gpg's clock faked a minute on): refused.
    home = short_tmpdir("gv")
    (home / "gpg.conf").write_text("no-autostart\n")
    try:
        subprocess.run(["gpg", "--homedir", str(home), "--batch", "--import", str(keys)],
                       capture_output=True, timeout=60, check=True)
        later = git_verify(repo, a, f"gpg.program={signer.program}",
                           env={"GNUPGHOME": str(home), "FAKETIME": str(t_a + 60)})
        assert later.returncode != 0 and "expired" in later.stderr.lower(), later.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)

    # A key expired an hour ago; a commit it signed back then, dated then, stamped now.
    k2 = signer.new_key("frank", created=now - 7200, expire="seconds=3600")
    b = pgp_commit(repo, signer, k2, "b", faked=now - 4000, when=now - 4000)
    _, t_b = stamp_of(repo, b)
    code, out, err = run(capsys, "verify", b, "--repo", repo, "--signers",
                         signer.export(tmp_path / "frank.gpg", k2))
    assert code == 1 and err.count("\n") == 1, err
    assert f"expired at {iso(now - 3600)}" in err and f"not valid at {iso(t_b)}" in err, err

    # Revoked as superseded after the stamp: what it signed before stays valid.
    k3 = signer.new_key("grace", created=now - 7200)
    c = pgp_commit(repo, signer, k3, "c")
    _, t_c = stamp_of(repo, c)
    d = pgp_commit(repo, signer, k3, "d", faked=t_c)  # (signed now; stamped below)
    git(repo, "update-ref", f"refs/heads/{BRANCH}", stamp_of(repo, c)[0])  # (d's stamp gone)
    wait_for(lambda: time.time() >= t_c + 1, timeout=5, what="the stamp's second to pass")
    signer.revoke(k3, 2)
    keys = signer.export(tmp_path / "grace.gpg", k3)
    code, out, err = run(capsys, "verify", c, "--repo", repo, "--signers", keys)
    assert code == 0, err
    assert "key is superseded" in line(out, "signed by:"), out
    code, out, err = run(capsys, "stamp", "--branch", BRANCH, d, "--repo", repo,
                         "--server", server.url)
    assert code == 0, err
    code, out, err = run(capsys, "verify", d, "--repo", repo, "--signers", keys)
    assert code == 1 and "revoked at" in err and "key is superseded" in err, err

    # Revoked as compromised: refused, stamped before or not.
    k4 = signer.new_key("heidi", created=now - 7200)
    e = pgp_commit(repo, signer, k4, "e")
    signer.revoke(k4, 1)
    code, out, err = run(capsys, "verify", e, "--repo", repo, "--signers",
                         signer.export(tmp_path / "heidi.gpg", k4))
    assert code == 1 and "key material has been compromised" in err, err
    assert "hard revocation" in err


# --------------------------------------------------------------------------- tags, merges


def test_a_signed_tag_stamped_by_its_receipt(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pub = ssh_key(tmp_path / "ivan")
    signers = signers_file(tmp_path / "signers", "ivan@example.org", pub)
    repo = hooked_repo(capsys, tmp_path / "repo", server)
    ssh_signing(repo, pub)
    git(repo, "tag", "-s", "v1", "-m", "release 1")
    code, out, err = run(capsys, "verify", "v1", "--repo", repo, "--signers", signers)
    assert code == 3 and "not stamped: tag " in err, err
    code, out, err = run(capsys, "stamp", "--object", "v1", "--repo", repo, "--server",
                         server.url, "--key", TEST_PUBLIC_KEY)
    assert code == 0, err
    t = int(line(out, "time:").rsplit("(", 1)[1].rstrip(")"))
    code, out, err = run(capsys, "verify", "v1", "--repo", repo, "--signers", signers,
                         "--key", TEST_PUBLIC_KEY)
    assert code == 0, err
    assert out.startswith("valid signature: tag ") and f"({t})" in line(out, "time:"), out
    assert "receipt of the object's sha256" in line(out, "stamp:")
    # Without the note, the server is asked for the receipts of the tag's digest.
    git(repo, "update-ref", "-d", "refs/notes/stampd-receipts")
    code, out, err = run(capsys, "verify", "v1", "--repo", repo, "--signers", signers)
    assert code == 3, err
    code, out, err = run(capsys, "verify", "v1", "--repo", repo, "--signers", signers,
                         "--fetch-proof", "--key", TEST_PUBLIC_KEY)
    assert code == 0 and f"from {server.url.rstrip('/')}" in line(out, "stamp:"), out + err


def test_the_hook_stamps_a_signed_merge_and_the_server_knows_a_commit(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`git merge` runs post-merge, not post-commit: the merge commit is stamped at once.
    A commit whose stamp is not in the repository: --fetch-proof asks the server's log."""
    pub = ssh_key(tmp_path / "judy")
    signers = signers_file(tmp_path / "signers", "judy@example.org", pub)
    repo = hooked_repo(capsys, tmp_path / "repo", server)
    ssh_signing(repo, pub)
    assert (repo / ".git" / "hooks" / "post-merge").is_file()
    git(repo, "checkout", "-q", "-b", "side")
    commit(repo, "side")
    git(repo, "checkout", "-q", "main")
    commit(repo, "main")
    r = subprocess.run(["git", "merge", "-q", "--no-ff", "-S", "-m", "merged", "side"],
                       cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and "stampd:" not in r.stderr, r.stderr
    merge = git(repo, "rev-parse", "HEAD").strip()
    stamp_of(repo, merge)  # (stamped at once, by post-merge)
    code, out, err = run(capsys, "verify", merge, "--repo", repo, "--signers", signers)
    assert code == 0 and "of this commit" in line(out, "stamp:"), err
    # The stamps gone from the repository; the server's log still has the merge's.
    git(repo, "update-ref", "-d", f"refs/heads/{BRANCH}")
    code, out, err = run(capsys, "verify", merge, "--repo", repo, "--signers", signers)
    assert code == 3, err
    code, out, err = run(capsys, "verify", merge, "--repo", repo, "--signers", signers,
                         "--fetch-proof")
    assert code == 0, err
    assert line(out, "stamp:").startswith(
        f"stamp:         the log of {server.url.rstrip('/')}"), out
    assert "the server's log" in line(out, "vouched for by:")
