"""The post-commit hook: real git, curl and gpg against a live stampd on loopback."""

from __future__ import annotations

import http.client
import http.server
import os
import re
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client.hook import BACKUP_SUFFIX, MARKER, USER_SUFFIX
from stampd import cli
from tests.helpers import (
    DATA,
    ROOT,
    TEST_FPR,
    TEST_UID,
    Server,
    free_port,
    git,
    make_repo,
    require_tools,
    seed_data_dir,
    start_server,
)

HOOK_SCRIPT = ROOT / "client" / "hooks" / "post-commit"
BRANCH = "stamps"
MISSED = re.compile(r"^stampd: timestamp not obtained \((.+)\); the next commit's stamp will "
                    r"cover this one$")
# What the hook runs besides git, curl and gpg (and what `git commit` needs).
HOOK_TOOLS = ("git", "curl", "gpg", "ssh-keygen", "sh", "date", "mktemp", "rm", "tr", "wc")


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    require_tools(*HOOK_TOOLS)


class Proxy:
    """An HTTP server in this process that forwards to ``upstream`` and lets a test rewrite
    the answer (``mutate(status, body) -> (status, body)``)."""

    def __init__(self, upstream: Server) -> None:
        self.upstream = upstream
        self.mutate: Callable[[int, bytes], tuple[int, bytes]] = lambda s, b: (s, b)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() == "content-type"}
                conn.request(method, self.path, body=body, headers=headers)
                r = conn.getresponse()
                status, data = proxy.mutate(r.status, r.read())
                conn.close()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def ssh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with an SSH key beside its OpenPGP key."""
    data = seed_data_dir(tmp_path_factory.mktemp("hook-ssh") / "data")
    s = start_server(data, workers=1, api_processes=2,
                     extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519"})
    s.wait_ready(workers=2)
    yield s
    s.stop()


@pytest.fixture
def proxy(live_server: Server) -> Iterator[Proxy]:
    p = Proxy(live_server)
    yield p
    p.close()


def hook_cmd(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = cli.main(["hook", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def install(capsys: pytest.CaptureFixture[str], repo: Path, server: str,
            *extra: str) -> tuple[int, str, str]:
    return hook_cmd(capsys, "install", "--repo", repo, "--server", server.rstrip("/"),
                    "--branch", BRANCH, *extra)


def commit(repo: Path, name: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """A new commit (which must succeed); (its id, the hook's stderr lines)."""
    (repo / f"{name}.txt").write_text(f"{name}\n")
    git(repo, "add", f"{name}.txt", env=env)
    r = subprocess.run(["git", "commit", "-q", "-m", name], cwd=repo, capture_output=True,
                       text=True, timeout=60, env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return git(repo, "rev-parse", "HEAD").strip(), r.stderr.splitlines()


def branch_head(repo: Path) -> str | None:
    r = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{BRANCH}"],
                       cwd=repo, capture_output=True, text=True, timeout=60, check=False)
    return r.stdout.strip() or None


def parents(repo: Path, rev: str) -> list[str]:
    return git(repo, "log", "-1", "--format=%P", rev).split()


def pinned_env(repo: Path) -> dict[str, str]:
    return {**os.environ, "GNUPGHOME": str(repo / ".git" / "stampd" / "gnupg")}


def assert_missed(lines: list[str], reason: str) -> None:
    assert len(lines) == 1, lines
    m = MISSED.match(lines[0])
    assert m, lines
    assert reason in m.group(1), lines[0]


def test_install_and_three_commits_make_a_verified_merge_chain(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    code, out, err = install(capsys, repo, live_server.url)
    assert code == 0, err
    assert TEST_FPR in out
    hook = repo / ".git" / "hooks" / "post-commit"
    assert MARKER in hook.read_text().splitlines()
    assert hook.stat().st_mode & stat.S_IXUSR
    ring = repo / ".git" / "stampd" / "gnupg"
    assert stat.S_IMODE(ring.stat().st_mode) == 0o700
    config = git(repo, "config", "--get-regexp", r"^stampd\.")
    assert f"stampd.fingerprint {TEST_FPR}\n" in config
    assert f"stampd.uid {TEST_UID}\n" in config
    assert f"stampd.branch {BRANCH}\n" in config
    assert f"stampd.server {live_server.url.rstrip('/')}\n" in config

    commits = []
    for name in ("one", "two", "three"):
        c, lines = commit(repo, name)
        assert lines == [], lines
        commits.append(c)
    # First parents: three stamps, then the first stamped commit and the initial commit.
    chain = git(repo, "rev-list", "--first-parent", BRANCH).split()
    assert chain[3:] == [commits[0], git(repo, "rev-parse", f"{commits[0]}^").strip()]
    chain = chain[2::-1]
    assert parents(repo, chain[0]) == [commits[0]]
    for i in (1, 2):
        assert parents(repo, chain[i]) == [chain[i - 1], commits[i]]
    for stamp, stamped in zip(chain, commits, strict=True):
        git(repo, "verify-commit", stamp, env=pinned_env(repo))
        assert git(repo, "rev-parse", f"{stamp}^{{tree}}") == \
            git(repo, "rev-parse", f"{stamped}^{{tree}}")
    git(repo, "fsck", "--strict", "--no-dangling")
    # `stampd verify` with the key the install pinned.
    r = cli.main(["verify", BRANCH, "--repo", str(repo),
                  "--key", str(repo / ".git" / "stampd" / "server-key.asc")])
    assert r == 0, capsys.readouterr().err
    # ... which is also what it checks with when no --key is given.
    capsys.readouterr()
    r = cli.main(["verify", BRANCH, "--repo", str(repo)])
    out, err = capsys.readouterr()
    assert r == 0 and "(pinned as stampd.fingerprint)" in out, err


def test_server_down_then_back(live_server: Server, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    assert install(capsys, repo, live_server.url)[0] == 0
    commit(repo, "stamped")
    before = branch_head(repo)
    assert before

    git(repo, "config", "stampd.server", f"http://127.0.0.1:{free_port()}")  # nothing listens
    missed, lines = commit(repo, "missed")
    assert_missed(lines, "server unreachable")
    assert branch_head(repo) == before

    git(repo, "config", "stampd.server", live_server.url.rstrip("/"))
    latest, lines = commit(repo, "back")
    assert lines == []
    head = branch_head(repo)
    assert head and head != before
    assert parents(repo, head) == [before, latest]
    git(repo, "merge-base", "--is-ancestor", missed, head)
    git(repo, "verify-commit", head, env=pinned_env(repo))


def test_bad_answers_are_rejected(proxy: Proxy, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    assert install(capsys, repo, proxy.url)[0] == 0
    commit(repo, "first")
    before = branch_head(repo)
    assert before

    def duplicate_gpgsig(body: bytes) -> bytes:
        m = re.search(rb"^gpgsig .*?\n -----END PGP SIGNATURE-----\n", body, re.M | re.S)
        assert m
        return body[:m.end()] + m.group() + body[m.end():]

    cases: dict[str, tuple[Callable[[int, bytes], tuple[int, bytes]], str]] = {
        "garbage": (lambda s, b: (200, b"hello, world\n"), "invalid answer from server"),
        "http error": (lambda s, b: (500, b"oops\n"), "server answered HTTP 500"),
        "redirect": (lambda s, b: (301, b""), "server answered HTTP 301"),
        "empty": (lambda s, b: (200, b""), "invalid answer from server: empty"),
        "too large": (lambda s, b: (200, b + b"x" * 8000), "larger than 8000 bytes"),
        "not ascii": (lambda s, b: (200, b.replace(b"Timestamp", "Zeitstempel\u00e9".encode())),
                      "not only printable ASCII"),
        "message changed": (lambda s, b: (200, b.replace(b"Timestamp of", b"Timestamp 0f")),
                            "does not verify with the pinned key"),
        "two gpgsig headers": (lambda s, b: (200, duplicate_gpgsig(b)), "more headers"),
        "no final newline": (lambda s, b: (200, b.rstrip(b"\n")), "not terminated"),
        "other uid": (lambda s, b: (200, b.replace(b"stampd Test Key", b"stampd Fake Key")),
                      "expected 'author"),
        "parent dropped": (lambda s, b: (200, re.sub(rb"^parent [0-9a-f]{40}\n", b"", b,
                                                     count=1, flags=re.M)), "expected 'parent"),
    }
    for name, (mutate, reason) in cases.items():
        proxy.mutate = mutate
        _, lines = commit(repo, name.replace(" ", "-"))
        assert len(lines) == 1, f"{name}: {lines}"
        assert_missed(lines, reason)
        assert branch_head(repo) == before, name

    proxy.mutate = lambda s, b: (s, b)
    latest, lines = commit(repo, "good-again")
    assert lines == []
    assert parents(repo, branch_head(repo) or "") == [before, latest]
    git(repo, "fsck", "--strict", "--no-dangling")


def test_a_stamp_by_the_pinned_key_once_revoked_is_rejected(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpg says VALIDSIG and exits 0 for a signature by a revoked key (REVKEYSIG beside it):
    once the pinned key's revocation (tests/data/test-key-revoked-superseded.asc) is in the
    pinned keyring, the server's new stamps are refused and nothing is stored; a
    stamp made now by a key that has ended proves nothing."""
    repo = make_repo(tmp_path / "repo")
    assert install(capsys, repo, live_server.url)[0] == 0
    commit(repo, "first")
    before = branch_head(repo)
    assert before
    revocation = DATA / "test-key-revoked-superseded.asc"
    r = subprocess.run(["gpg", "--homedir", str(repo / ".git" / "stampd" / "gnupg"), "--batch",
                        "--no-autostart", "--import", str(revocation)],
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 0 and b"new key revocations: 1" in r.stderr, r.stderr
    _, lines = commit(repo, "second")
    assert_missed(lines, f"the pinned key {TEST_FPR} is revoked")
    assert branch_head(repo) == before


def test_stamp_signed_by_another_key_is_rejected(
        live_server: Server, other_server: Server, proxy: Proxy, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    assert install(capsys, repo, live_server.url)[0] == 0
    commit(repo, "first")
    before = branch_head(repo)

    # Same user id, same answer format, but another key: only the pinned key counts.
    git(repo, "config", "stampd.server", other_server.url)
    _, lines = commit(repo, "second")
    assert_missed(lines, "does not verify with the pinned key")
    assert branch_head(repo) == before

    # Trust on first use: re-installing for a server whose key changed is refused.
    repo2 = make_repo(tmp_path / "repo2")
    first_install = install(capsys, repo2, proxy.url)
    assert first_install[0] == 0, first_install
    proxy.upstream = other_server
    code, _, err = install(capsys, repo2, proxy.url)
    assert code == 1 and "changed" in err and "--force" in err
    assert git(repo2, "config", "stampd.fingerprint").strip() == TEST_FPR
    code, _, err = install(capsys, repo2, proxy.url, "--force")
    assert code == 0, err
    assert git(repo2, "config", "stampd.fingerprint").strip() != TEST_FPR
    _, lines = commit(repo2, "with-new-key")
    assert lines == []


def test_foreign_hooks_are_never_overwritten_and_chained(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    hook = repo / ".git" / "hooks" / "post-commit"
    ran = repo / ".git" / "user-hook-ran"
    mine = f"#!/bin/sh\necho \"my own hook $#\" >>'{ran}'\nexit 3\n"
    hook.write_text(mine)
    hook.chmod(0o755)

    code, _, err = install(capsys, repo, live_server.url)
    assert code == 1 and "--force" in err and len(err.splitlines()) == 1
    assert hook.read_text() == mine
    code, _, err = hook_cmd(capsys, "uninstall", "--repo", repo)
    assert code == 1 and "not stampd's" in err
    assert hook.read_text() == mine

    code, out, err = install(capsys, repo, live_server.url, "--force")
    assert code == 0, err
    user = hook.with_name("post-commit" + USER_SUFFIX)
    assert user.read_text() == mine and "kept the previous hook" in out
    assert MARKER in hook.read_text()
    # Each commit runs the user's hook first, then stamps.
    for n, name in enumerate(("stamped", "stamped-again"), 1):
        _, lines = commit(repo, name)
        assert lines == [] and branch_head(repo)
        assert ran.read_text() == "my own hook 0\n" * n
    # Its exit status is the hook's (git ignores a post-commit hook's status).
    r = subprocess.run([str(hook)], cwd=repo, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 3 and r.stderr == ""
    # Re-installing keeps the chain; a second foreign hook beside it is refused, not lost.
    code, out, err = install(capsys, repo, live_server.url)
    assert code == 0 and user.read_text() == mine
    hook.write_text("#!/bin/sh\necho another\n")
    code, _, err = install(capsys, repo, live_server.url, "--force")
    assert code == 1 and "post-commit.user exists too" in err
    hook.write_text(hook_script_text())

    code, out, err = hook_cmd(capsys, "uninstall", "--repo", repo)
    assert code == 0, err
    assert hook.read_text() == mine and not user.exists()
    code, _, err = hook_cmd(capsys, "uninstall", "--repo", repo)
    assert code == 1 and hook.read_text() == mine


def test_a_backup_of_an_earlier_version_is_restored(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    assert install(capsys, repo, live_server.url)[0] == 0
    hook = repo / ".git" / "hooks" / "post-commit"
    backup = hook.with_name("post-commit" + BACKUP_SUFFIX)
    backup.write_text("#!/bin/sh\necho old\n")
    code, out, err = hook_cmd(capsys, "uninstall", "--repo", repo)
    assert code == 0, err
    assert hook.read_text() == "#!/bin/sh\necho old\n" and not backup.exists()
    assert "restored the previous hook" in out


def hook_script_text() -> str:
    return HOOK_SCRIPT.read_text()


@pytest.mark.parametrize("signer", ["openpgp", "ssh"])
@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_hook_in_sha1_and_sha256_repositories(
        ssh_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        object_format: str, signer: str) -> None:
    repo = make_repo(tmp_path / "repo", object_format)
    code, out, err = install(capsys, repo, ssh_server.url, "--format", signer)
    assert code == 0, err
    stampd = repo / ".git" / "stampd"
    if signer == "ssh":
        assert "ssh key: SHA256:" in out
        assert git(repo, "config", "stampd.format").strip() == "ssh"
        assert git(repo, "config", "stampd.key").strip().startswith("SHA256:")
        check = ["-c", "gpg.format=ssh", "-c",
                 f"gpg.ssh.allowedSignersFile={stampd / 'allowed_signers'}"]
        env = None
    else:
        check, env = [], pinned_env(repo)
    commits = [commit(repo, name) for name in ("one", "two")]
    assert all(lines == [] for _, lines in commits), commits
    head = branch_head(repo)
    assert head and len(head) == (64 if object_format == "sha256" else 40)
    assert parents(repo, head)[1] == commits[1][0]
    header = "gpgsig-sha256" if object_format == "sha256" else "gpgsig"
    kind = "SSH" if signer == "ssh" else "PGP"
    for stamp in (head, parents(repo, head)[0]):
        body = git(repo, "cat-file", "commit", stamp)
        assert f"\n{header} -----BEGIN {kind} SIGNATURE-----\n" in body
        git(repo, *check, "verify-commit", stamp, env=env)
    git(repo, "fsck", "--strict", "--no-dangling")
    if signer == "openpgp":
        assert cli.main(["verify", BRANCH, "--repo", str(repo),
                         "--key", str(stampd / "server-key.asc")]) == 0
    else:
        # Another SSH key pinned: the server's stamps no longer verify, nothing is stored.
        other = tmp_path / "other"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                       check=True, timeout=60)
        principal = (stampd / "allowed_signers").read_text().split()[0]
        (stampd / "allowed_signers").write_text(
            f"{principal} {(other.with_suffix('.pub')).read_text().split(' ', 2)[0]} "
            f"{(other.with_suffix('.pub')).read_text().split(' ', 2)[1]}\n")
        _, lines = commit(repo, "three")
        assert_missed(lines, "does not verify with the pinned key")
        assert branch_head(repo) == head


def test_core_hooks_path_and_uninstall(live_server: Server, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "config", "core.hooksPath", "my-hooks")
    sub = repo / "sub"
    sub.mkdir()
    code, out, err = install(capsys, sub, live_server.url)
    assert code == 0, err
    hook = repo / "my-hooks" / "post-commit"
    assert MARKER in hook.read_text()
    assert not (repo / ".git" / "hooks" / "post-commit").exists()
    _, lines = commit(repo, "stamped")
    assert lines == [] and branch_head(repo)
    code, out, err = hook_cmd(capsys, "uninstall", "--repo", repo)
    assert code == 0 and not hook.exists()
    code, out, err = hook_cmd(capsys, "uninstall", "--repo", repo)
    assert code == 0 and "nothing to do" in out


def test_install_errors(live_server: Server, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    not_repo = tmp_path / "plain"
    not_repo.mkdir()
    code, _, err = install(capsys, not_repo, live_server.url)
    assert code == 1 and "not inside a git repository" in err
    repo = make_repo(tmp_path / "repo")
    code, _, err = install(capsys, repo, "ftp://127.0.0.1/")
    assert code == 2
    code, _, err = hook_cmd(capsys, "install", "--repo", repo, "--server", live_server.url,
                            "--branch", "bad..name")
    assert code == 2
    code, _, err = install(capsys, repo, f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "could not fetch" in err
    assert not (repo / ".git" / "hooks" / "post-commit").exists()
    assert "stampd." not in git(repo, "config", "--list", "--local")


def test_hook_runs_without_python(live_server: Server, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """PATH holds only git, curl, gpg, sh and the few coreutils the hook uses."""
    repo = make_repo(tmp_path / "repo")
    assert install(capsys, repo, live_server.url)[0] == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in HOOK_TOOLS:
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    assert HOOK_SCRIPT.read_text().startswith("#!/bin/sh\n")
    for python in ("python", "python3", "stampd"):
        assert shutil.which(python, path=str(bin_dir)) is None
    env = {**os.environ, "PATH": str(bin_dir)}
    env.pop("VIRTUAL_ENV", None)
    _, lines = commit(repo, "first", env=env)
    assert lines == []
    second, lines = commit(repo, "second", env=env)
    assert lines == []
    head = branch_head(repo)
    assert head and parents(repo, head)[1] == second
    git(repo, "verify-commit", head, env=pinned_env(repo))
    # The same commit with curl missing from PATH: the commit succeeds, one line says why.
    (bin_dir / "curl").unlink()
    _, lines = commit(repo, "third", env=env)
    assert_missed(lines, "curl is not installed")
    assert branch_head(repo) == head


def test_hook_script_is_posix_sh() -> None:
    for shell in ("sh", "dash", "bash"):
        path = shutil.which(shell)
        if path is None:
            continue
        args = [path, "--posix", "-n"] if shell == "bash" else [path, "-n"]
        r = subprocess.run([*args, str(HOOK_SCRIPT)], capture_output=True, text=True,
                           timeout=30, check=False)
        assert r.returncode == 0, f"{shell}: {r.stderr}"
    text = HOOK_SCRIPT.read_text()
    for bashism in ("[[", "function ", "$'", "<<<", "local ", "${!", "source "):
        assert bashism not in text, bashism
    assert stat.S_IMODE(HOOK_SCRIPT.stat().st_mode) & 0o111
