"""Which stamp proves when a commit existed (client.verify.covering, through `stampd verify
--signers`), with real git, gpg and ssh-keygen and no server: branch stamps made here as a
stampd makes them, signed by the test key with gpg's clock set to the stamp's time.

A commit's earliest stamp is the earliest of its own and its descendants' (a merge's stamp
covers both sides); a stamp that does not verify is passed over for the next earliest, and
said; a stamp signed by another key counts for nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stampd import cli
from tests.helpers import (
    TEST_FPR,
    TEST_PUBLIC_KEY,
    TEST_SECRET_KEY,
    TEST_UID,
    git,
    make_repo,
    require_tools,
    short_tmpdir,
)

BRANCH = "x-timestamps"
NAME, EMAIL = TEST_UID.split(" <")


class LocalStamper:
    """Branch stamps signed by the test key in a home of its own (its agent stopped by PID),
    their signature made at the stamp's time (``--faked-system-time``), as stampd signs them
    with the committer time equal to the signature's."""

    def __init__(self, tmp: Path) -> None:
        from workers.agents.gpg import GpgAgent

        self.home = short_tmpdir("ls")
        os.chmod(self.home, 0o700)
        self.agent = GpgAgent(self.home)
        self.agent.start()
        subprocess.run(["gpg", "--homedir", str(self.home), "--batch", "--import",
                        str(TEST_SECRET_KEY)], capture_output=True, timeout=60, check=True)
        self.program = tmp / "gpg-at"
        self.program.write_text('#!/bin/sh\nexec gpg --faked-system-time "$STAMP_TIME!" "$@"\n')
        self.program.chmod(0o755)

    def stamp(self, repo: Path, commit: str, t: int, ref: str = f"refs/heads/{BRANCH}") -> str:
        old = subprocess.run(["git", "rev-parse", "--verify", "--quiet", ref], cwd=repo,
                             capture_output=True, text=True, timeout=60, check=False)
        parents = ([old.stdout.strip()] if old.returncode == 0 else []) + [commit]
        ident = {"GIT_COMMITTER_NAME": NAME, "GIT_COMMITTER_EMAIL": EMAIL.rstrip(">"),
                 "GIT_AUTHOR_NAME": NAME, "GIT_AUTHOR_EMAIL": EMAIL.rstrip(">"),
                 "GIT_COMMITTER_DATE": f"@{t} +0000", "GIT_AUTHOR_DATE": f"@{t} +0000",
                 "GNUPGHOME": str(self.home), "STAMP_TIME": str(t)}
        tree = git(repo, "rev-parse", f"{commit}^{{tree}}").strip()
        r = subprocess.run(["git", "-c", "gpg.format=openpgp", "-c",
                            f"gpg.program={self.program}", "commit-tree", f"-S{TEST_FPR}",
                            *[x for p in parents for x in ("-p", p)], "-m",
                            f"Timestamp of commit {commit}", tree], cwd=repo,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, **ident}, check=False)
        assert r.returncode == 0, r.stderr
        stamp = r.stdout.strip()
        git(repo, "update-ref", ref, stamp)
        return stamp

    def close(self) -> None:
        self.agent.stop()
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def stamper(tmp_path: Path) -> Iterator[LocalStamper]:
    require_tools("git", "gpg", "gpg-agent", "ssh-keygen")
    s = LocalStamper(tmp_path)
    yield s
    s.close()


def signed_repo(tmp: Path) -> tuple[Path, Path]:
    key = tmp / "alice"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)],
                   check=True, timeout=60)
    pub = key.with_suffix(".pub").read_text().split()
    signers = tmp / "signers"
    signers.write_text(f'alice@example.org namespaces="git" {pub[0]} {pub[1]}\n')
    repo = make_repo(tmp / "repo")
    for name, value in (("gpg.format", "ssh"), ("user.signingkey", str(key) + ".pub"),
                        ("commit.gpgsign", "true")):
        git(repo, "config", name, value)
    return repo, signers


def commit(repo: Path, name: str, t: int) -> str:
    (repo / f"{name}.txt").write_text(name)
    git(repo, "add", f"{name}.txt")
    git(repo, "commit", "-q", "-m", name,
        env={**os.environ, "GIT_COMMITTER_DATE": f"@{t} +0000",
             "GIT_AUTHOR_DATE": f"@{t} +0000"})
    return git(repo, "rev-parse", "HEAD").strip()


def verify(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> tuple[int, str, str]:
    code = cli.main(["verify", *args, "--repo", str(repo), "--key", str(TEST_PUBLIC_KEY)])
    out, err = capsys.readouterr()
    return code, out, err


def stamp_time(out: str) -> int:
    line = next(x for x in out.splitlines() if x.startswith("time:"))
    return int(line.rsplit("(", 1)[1].rstrip(")"))


def test_the_earliest_of_its_own_and_its_descendants_stamps(
        stamper: LocalStamper, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, signers = signed_repo(tmp_path)
    t0 = int(time.time()) - 1000
    a = commit(repo, "a", t0)
    b = commit(repo, "b", t0 + 10)
    stamper.stamp(repo, b, t0 + 20)  # b's stamp covers a too
    stamper.stamp(repo, a, t0 + 30)  # a's own stamp, later: b's is the earliest
    git(repo, "checkout", "-q", "-b", "side", a)
    s = commit(repo, "s", t0 + 40)
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side",
        env={**os.environ, "GIT_COMMITTER_DATE": f"@{t0 + 50} +0000"})
    m = git(repo, "rev-parse", "HEAD").strip()
    stamper.stamp(repo, m, t0 + 60, "refs/remotes/origin/x-timestamps")  # (a CI clone's)
    code, out, err = verify(capsys, repo, a, "--signers", str(signers))
    assert code == 0 and stamp_time(out) == t0 + 20, out + err
    assert f"of its descendant {b[:12]}" in out
    code, out, err = verify(capsys, repo, s, "--signers", str(signers))
    assert code == 0 and stamp_time(out) == t0 + 60, out + err
    assert "remotes/origin/x-timestamps" in out
    code, out, err = verify(capsys, repo, "--range", "main~2..main", "--signers", str(signers))
    assert code == 0, out + err
    assert [x.split()[1] for x in out.splitlines()[:-1]] == [m[:12], s[:12], b[:12]], out
    assert out.splitlines()[-1] == ("checked:     3 commit(s) of range main~2..main: 3 valid, "
                                    "0 invalid, 0 not signed, 0 not stamped")


def test_a_stamp_that_does_not_verify_is_passed_over(
        stamper: LocalStamper, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, signers = signed_repo(tmp_path)
    t0 = int(time.time()) - 1000
    a = commit(repo, "a", t0)
    early = stamper.stamp(repo, a, t0 + 10)
    # The earliest stamp, tampered: another time in its committer line (its signature no
    # longer covers it), on a branch of its own.
    body = git(repo, "cat-file", "commit", early).replace(f" {t0 + 10} +0000",
                                                          f" {t0 + 5} +0000")
    forged = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], cwd=repo,
                            input=body, capture_output=True, text=True, timeout=60,
                            check=True).stdout.strip()
    git(repo, "update-ref", "refs/heads/forged-timestamps", forged)
    code, out, err = verify(capsys, repo, a, "--signers", str(signers))
    assert code == 0 and stamp_time(out) == t0 + 10, out + err
    assert err.startswith("note: 1 stamp(s) passed over, not verified: "), err
    # With only the forged one, the commit is not stamped (exit 3), and why is said.
    git(repo, "update-ref", "-d", f"refs/heads/{BRANCH}")
    code, out, err = verify(capsys, repo, a, "--signers", str(signers))
    assert code == 3 and "do not verify" in err, err


def pin_test_key(repo: Path) -> None:
    """The pins `stampd hook install` makes of a server with the test key."""
    (repo / ".git" / "stampd").mkdir(exist_ok=True)
    shutil.copy(TEST_PUBLIC_KEY, repo / ".git" / "stampd" / "server-key.asc")
    git(repo, "config", "stampd.server", "http://127.0.0.1:9")
    git(repo, "config", "stampd.fingerprint", TEST_FPR)


def ssh_time(t: int) -> str:
    return time.strftime("%Y%m%d%H%M%SZ", time.gmtime(t))


def test_gits_own_commands_through_the_wrappers(
        stamper: LocalStamper, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpg.ssh.program and gpg.program set to stampd's wrappers (hook install --git-verify's
    scripts): git verify-commit checks at the stamp's time, where there is one."""
    from client.hook import WRAPPERS, wrapper_script

    repo, signers = signed_repo(tmp_path)
    pin_test_key(repo)
    for config, (which, rel) in WRAPPERS.items():
        path = tmp_path / rel.name
        path.write_text(wrapper_script(config, which))
        path.chmod(0o755)
        git(repo, "config", config, str(path))
    t0 = int(time.time()) - 1000
    a = commit(repo, "a", t0)  # signed and dated at t0, stamped at t0 + 100
    stamper.stamp(repo, a, t0 + 100)
    line = signers.read_text()
    ended = tmp_path / "ended"
    ended.write_text(line.replace('namespaces="git"',
                                  f'namespaces="git",valid-before="{ssh_time(t0 + 50)}"'))

    def verify_commit(file: Path, *config: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-c", f"gpg.ssh.allowedSignersFile={file}",
                               *[x for c in config for x in ("-c", c)], "verify-commit", a],
                              cwd=repo, capture_output=True, text=True, timeout=120,
                              check=False)

    # The key ended between the committer date and the stamp: git alone says Good.
    assert verify_commit(ended, "gpg.ssh.program=ssh-keygen").returncode == 0
    r = verify_commit(ended)
    assert r.returncode != 0, r.stderr
    assert f"checked at {ssh_time(t0 + 100)}, the time its stamp proves" in r.stderr
    assert verify_commit(signers).returncode == 0
    # No stamp: as git checks, said.
    b = commit(repo, "b", t0 + 200)
    r = subprocess.run(["git", "-c", f"gpg.ssh.allowedSignersFile={signers}", "verify-commit",
                        b], cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and f"commit {b[:12]} has no stamp" in r.stderr, r.stderr
