"""``stampd stamp FILE|DIR...`` and ``stampd verify SHA256SUMS.asc --dir DIR`` against a real
server, checked afterwards with stock tools too (gpg --verify, sha256sum -c, ssh-keygen); an
answer that is another manifest, or a manifest from another server, is refused and nothing is
written."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stampd import cli
from tests.helpers import Relay, Server, require_tools, start_server

TREE_FILES = 10_000


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    require_tools("gpg", "sha256sum", "sha512sum", "ssh-keygen")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("stampf") / "data", workers=1,
                     extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519"})
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        data: bytes = r.read()
        return data


def make_tree(root: Path, files: int, per_dir: int = 100) -> None:
    for i in range(files):
        d = root / f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            d.mkdir(parents=True)
        fd = os.open(d / f"f{i:05d}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, i.to_bytes(4, "big"))
        os.close(fd)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_tree_of_10000_files(server: Server, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path / "tree", TREE_FILES)
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code, out, err = run(capsys, "stamp", "tree", "--server", server.url)
    print(f"stampd stamp of {TREE_FILES} files: {time.monotonic() - started:.1f} s")
    assert code == 0, err
    assert f"manifest:      SHA256SUMS.asc ({TREE_FILES} files, sha256)" in out
    asc = tmp_path / "SHA256SUMS.asc"
    text = asc.read_text()
    assert f"# lines: {TREE_FILES}\n" in text and f"# server: {server.url}\n" in text
    assert "*tree/d000/f00000.bin\n" in text and "*tree/d099/f09999.bin\n" in text

    started = time.monotonic()
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".")
    print(f"stampd verify --dir of {TREE_FILES} files: {time.monotonic() - started:.1f} s")
    assert code == 0, err
    assert f"files:          {TREE_FILES} checked in .: all match" in out

    # Stock tools: gpg --verify with the server's key, sha256sum -c where stamp ran.
    key = tmp_path / "server-key.asc"
    key.write_bytes(fetch(f"{server.url}?request=get-public-key-v1"))
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--import", str(key)], env=env, check=True,
                   capture_output=True)
    subprocess.run(["gpg", "--batch", "--verify", str(asc)], env=env, check=True,
                   capture_output=True)
    check = subprocess.run(["sha256sum", "-c", str(asc)], cwd=tmp_path, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr[-500:]
    assert check.stdout.count(": OK\n") == TREE_FILES
    # a publishable file (0666 less the umask), and a check without warnings about the armor
    # lines: gpg --decrypt verifies and writes the signed text, whose # lines are comments
    assert stat.S_IMODE(asc.stat().st_mode) == 0o666 & ~umask()
    plain = subprocess.run(["gpg", "--batch", "--decrypt", str(asc)], env=env,
                           capture_output=True, check=True).stdout
    check = subprocess.run(["sha256sum", "-c", "-"], cwd=tmp_path, input=plain,
                           capture_output=True)
    assert check.returncode == 0 and check.stderr == b"", check.stderr[-500:]
    assert check.stdout.count(b": OK\n") == TREE_FILES

    # A changed file: exit 1, named; offline with --key.
    (tmp_path / "tree" / "d042" / "f04242.bin").write_bytes(b"changed")
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".", "--key",
                         str(key))
    assert code == 1
    assert "CHANGED:        tree/d042/f04242.bin" in out
    assert err.startswith("stampd verify: invalid: 1 of 10000 files do not match the "
                          "manifest: tree/d042/f04242.bin")

    # A tampered line: the signature no longer verifies (nor does gpg's).
    lines = text.split("\n")
    i = next(n for n, line in enumerate(lines) if line.endswith("*tree/d007/f00700.bin"))
    lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
    (tmp_path / "tampered.asc").write_text("\n".join(lines))
    code, _, err = run(capsys, "verify", "tampered.asc", "--key", str(key))
    assert code == 1 and "signature does not verify" in err, err
    assert subprocess.run(["gpg", "--batch", "--verify", str(tmp_path / "tampered.asc")],
                          env=env, capture_output=True).returncode != 0


def test_ssh_sha512_round_trip_and_what_is_skipped(server: Server, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "release"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.tar.gz").write_bytes(os.urandom(3000))
    (tree / "sub" / "back\\slash").write_bytes(b"b")
    (tree / "sub" / "new\nline").write_bytes(b"n")
    os.symlink("a.tar.gz", tree / "link-to-file")
    os.symlink("sub", tree / "link-to-dir")
    os.mkfifo(tree / "fifo")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "stamp", "release", "--server", server.url, "--format",
                         "ssh", "--algorithm", "sha512")
    assert code == 0, err
    assert "manifest:      SHA512SUMS.asc (4 files, sha512)" in out and "skipped:       2" in out
    assert "skipped release/fifo: not a regular file" in err
    assert "skipped release/link-to-dir: symlink to a directory (not followed)" in err
    asc = tmp_path / "SHA512SUMS.asc"
    text = asc.read_text()
    assert "-----BEGIN SSH SIGNATURE-----" in text and "# algorithm: sha512\n" in text
    assert "\\" in text.split("# lines: 4\n")[1].split("\n")[2]  # an escaped name

    allowed = tmp_path / "allowed_signers"
    allowed.write_bytes(fetch(f"{server.url}v1/keys/allowed_signers"))
    code, out, err = run(capsys, "verify", "SHA512SUMS.asc", "--dir", ".", "--key",
                         str(allowed))
    assert code == 0, err
    assert "files:          4 checked in .: all match" in out
    check = subprocess.run(["sha512sum", "-c", str(asc)], cwd=tmp_path, capture_output=True,
                           text=True)
    assert check.returncode == 0 and check.stdout.count(": OK\n") == 4, check.stderr

    (tree / "sub" / "new\nline").unlink()
    code, out, err = run(capsys, "verify", "SHA512SUMS.asc", "--dir", ".", "--key",
                         str(allowed))
    assert code == 1 and "MISSING:        release/sub/new\nline" in out, err
    (tmp_path / "tampered.asc").write_text(text.replace("*release/a.tar.gz",
                                                        "*release/a.tar.bz2"))
    code, _, err = run(capsys, "verify", "tampered.asc", "--key", str(allowed))
    assert code == 1 and "the SSH signature does not verify" in err, err
    # What stampd verify cannot check is "unsupported" (exit 1), not malformed.
    for name, changed in (("v2.asc", text.replace("manifest v1", "manifest v2")),
                          ("x509.asc", text.replace("SSH SIGNATURE", "SIGNED MESSAGE"))):
        (tmp_path / name).write_text(changed)
        code, _, err = run(capsys, "verify", name, "--key", str(allowed))
        assert code == 1 and err.startswith("stampd verify: unsupported: "), err


def test_names_are_relative_to_where_stamp_ran(server: Server, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue: ``stampd stamp dist`` from the project root, then the everyday checks from
    the same directory -- ``sha256sum -c`` and ``gpg --decrypt | sha256sum -c -`` -- and
    ``stampd verify`` with and without ``--dir``; a path outside it is refused."""
    project = tmp_path / "project"
    (project / "dist" / "sub").mkdir(parents=True)
    (project / "dist" / "a.tar.gz").write_bytes(os.urandom(2000))
    (project / "dist" / "sub" / "b.txt").write_bytes(b"b\n")
    (project / "README").write_bytes(b"readme\n")
    monkeypatch.chdir(project)
    code, out, err = run(capsys, "stamp", "dist", "README", "--server", server.url)
    assert code == 0, err
    asc = project / "SHA256SUMS.asc"
    text = asc.read_text()
    # the lines are what sha256sum -b prints here for those files
    here = subprocess.run(["sha256sum", "-b", "README", "dist/a.tar.gz", "dist/sub/b.txt"],
                          capture_output=True, text=True, check=True).stdout
    assert text.split("# lines: 3\n")[1].startswith(here + "-----BEGIN PGP SIGNATURE-----\n")

    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--import"], env=env, check=True, capture_output=True,
                   input=fetch(f"{server.url}?request=get-public-key-v1"))

    def everyday_checks() -> tuple[int, int]:
        plain = subprocess.run(["gpg", "--batch", "--decrypt", "SHA256SUMS.asc"], env=env,
                               capture_output=True, check=True).stdout
        piped = subprocess.run(["sha256sum", "-c", "-"], input=plain, capture_output=True)
        direct = subprocess.run(["sha256sum", "-c", "SHA256SUMS.asc"], capture_output=True)
        return piped.returncode, direct.returncode

    assert everyday_checks() == (0, 0)
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc")  # the signature alone
    assert code == 0 and "files:" not in out, err
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".")
    assert code == 0 and "files:          3 checked in .: all match" in out, err
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "verify", "project/SHA256SUMS.asc", "--dir", "project")
    assert code == 0 and "files:          3 checked in project: all match" in out, err

    monkeypatch.chdir(project)
    (project / "dist" / "sub" / "b.txt").write_bytes(b"changed\n")
    assert everyday_checks() == (1, 1)
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".")
    assert code == 1 and "CHANGED:        dist/sub/b.txt" in out, err

    # Outside the current directory: refused in one line, nothing written.
    monkeypatch.chdir(project / "dist")
    for outside in ("../README", str(project / "README"), ".."):
        code, _, err = run(capsys, "stamp", outside, "--server", server.url)
        assert code == 2 and err == (
            f"stampd stamp: {outside} is outside the current directory (the manifest names "
            f"files relative to it): run stampd stamp from a directory above {outside}\n")
    assert not (project / "dist" / "SHA256SUMS.asc").exists()
    # ... and from inside, names relative to it, as a manifest made before the change named
    # them: stampd verify --dir finds them as before.
    code, _, err = run(capsys, "stamp", str(project / "dist" / "sub"), "a.tar.gz", "--server",
                       server.url)
    assert code == 0, err
    assert "*a.tar.gz\n" in (project / "dist" / "SHA256SUMS.asc").read_text()
    monkeypatch.chdir(project)
    code, out, err = run(capsys, "verify", "dist/SHA256SUMS.asc", "--dir", "dist")
    assert code == 0 and "files:          2 checked in dist: all match" in out, err


def test_unusable_paths_are_refused_before_anything_is_sent(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "tab\there").write_bytes(b"")
    code, _, err = run(capsys, "stamp", "d", "--server", server.url)
    assert code == 2 and "cannot be put in a manifest" in err and "tab\\there" in err
    (tmp_path / "e" / "x").mkdir(parents=True)
    (tmp_path / "e" / "a").write_bytes(b"1")
    (tmp_path / "e" / "x" / "a").write_bytes(b"2")
    code, _, err = run(capsys, "stamp", "e", "e/x/a", "--server", server.url)
    assert code == 2 and "'e/x/a' is given twice" in err
    code, _, err = run(capsys, "stamp", "missing", "--server", server.url)
    assert code == 2 and "cannot read missing" in err
    assert not (tmp_path / "SHA256SUMS.asc").exists()


def manifest_relay(target: str, edit: Callable[[bytes], bytes]) -> Relay:
    """A server in front of a real one: GETs pass through; a manifest POST is sent on with
    its body changed by ``edit``."""

    def route(method: str, path: str, body: bytes | None) -> urllib.request.Request:
        if body is None:
            return urllib.request.Request(target + path.lstrip("/"))
        return urllib.request.Request(target + path.lstrip("/"), data=edit(body),
                                      headers={"Content-Type": "text/plain"})

    return Relay(route)


def _other_line(body: bytes) -> bytes:
    lines = body.split(b"\n")
    lines[0] = (b"0" if lines[0][:1] != b"0" else b"1") + lines[0][1:]
    return b"\n".join(lines)


@pytest.mark.parametrize(("fmt", "edit", "says"), [
    ("openpgp", _other_line, "the lines signed are not the 3 lines sent"),
    ("ssh", lambda b: b + b"0" * 64 + b" *extra\n", "the lines signed are not the 3 lines sent"),
    ("openpgp", lambda b: b, "the manifest names the server http://127.0.0.1:"),
])
def test_another_manifest_is_refused_and_nothing_written(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, fmt: str, edit: Callable[[bytes], bytes],
        says: str) -> None:
    (tmp_path / "d").mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "d" / name).write_text(name)
    monkeypatch.chdir(tmp_path)
    relay = manifest_relay(server.url, edit)
    try:
        code, _, err = run(capsys, "stamp", "d", "--server", relay.url, "--format", fmt)
    finally:
        relay.close()
    assert code == 3 and err.startswith(f"stampd stamp: refused: {says}"), err
    assert not (tmp_path / "SHA256SUMS.asc").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d"]
