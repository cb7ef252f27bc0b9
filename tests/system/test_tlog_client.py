"""The client with a real server's transparency log (STAMPD_TLOG=on): `stampd stamp` keeps the
proof of a manifest beside it and of a git stamp in a git note, pins the log key, and `stampd
verify` checks it and says where in the log the stamp is; a receipt's proof is fetched later;
another stamp's proof and a wrong log key are refused."""

from __future__ import annotations

import hashlib
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.stamp import pin_name
from stampd import cli
from tests.helpers import (
    TEST_PUBLIC_KEY,
    Server,
    git,
    make_repo,
    seed_data_dir,
    start_server,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(seed_data_dir(tmp_path_factory.mktemp("tlogc") / "data"), workers=1,
                     extra_env={"STAMPD_TLOG": "on"})
    yield s
    s.stop()
    shutil.rmtree(s.runtime_dir, ignore_errors=True)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def log_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("log:"))


def test_files_stamped_with_their_proof(server: Server, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("a\n")
    monkeypatch.chdir(repo)
    code, out, err = run(capsys, "stamp", "a.txt", "--server", server.url)
    assert code == 0, err
    assert "in the log at index" in log_line(out), out
    proof = repo / "SHA256SUMS.asc.tlog-proof"
    assert proof.is_file()
    pin = pin_name(server.url)
    vkey = urllib.request.urlopen(server.url + "tlog/vkey", timeout=10).read().decode().strip()
    assert git(repo, "config", "--get", f"timestamper.{pin}.tlogkey").strip() == vkey
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".")
    assert code == 0, err
    assert "in the log at index" in log_line(out) and "pinned log key" in log_line(out)
    # The proof is no stamp of its own: the message says what to give instead.
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc.tlog-proof")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("stampd verify: malformed: SHA256SUMS.asc.tlog-proof is the "
                          "transparency-log proof of a stamp, not a stamp: verify the receipt "
                          "or manifest it belongs to (stampd verify SHA256SUMS.asc"), err
    # a wrong log key: refused
    other = vkey.split("+")[0] + "+00000000+AQ" + "A" * 42 + "="
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".", "--log-key", other)
    assert code != 0, out


def test_a_git_stamp_keeps_its_proof_in_a_note(server: Server, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    code, out, err = run(capsys, "stamp", "--tag", "stamp", "--server", server.url,
                         "--repo", str(repo))
    assert code == 0, err
    assert "in the log at index" in log_line(out), out
    note = git(repo, "notes", "--ref=stampd-tlog", "show", "stamp^{tag}")
    assert note.startswith("c2sp.org/tlog-proof@v1\n")
    code, out, err = run(capsys, "verify", "stamp", "--repo", str(repo), "--key",
                         str(TEST_PUBLIC_KEY))
    assert code == 0, err
    assert "in the log at index" in log_line(out)


def post_receipt(server: Server, digest: str) -> str:
    req = urllib.request.Request(server.url + "v1/stamps", data=f"sha256={digest}".encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_a_receipts_proof_fetched_later_and_another_stamps_refused(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "file.bin"
    data.write_bytes(b"receipt data")
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    receipt = tmp_path / "file.bin.asc"
    receipt.write_text(post_receipt(server, digest))
    other = tmp_path / "other.asc"
    other.write_text(post_receipt(server, digest))  # another stamp of the same digest
    code, out, err = run(capsys, "verify", str(receipt), "--file", str(data), "--fetch-proof",
                         "--key", str(TEST_PUBLIC_KEY))
    assert code == 0, err
    assert Path(f"{receipt}.tlog-proof").is_file()
    assert "in the log at index" in log_line(out)
    code, out, err = run(capsys, "verify", str(receipt), "--file", str(data), "--key",
                         str(TEST_PUBLIC_KEY))
    assert code == 0, err  # from the stored proof now
    code, out, err = run(capsys, "verify", str(other), "--file", str(data), "--key",
                         str(TEST_PUBLIC_KEY), "--proof", f"{receipt}.tlog-proof")
    assert code == 1 and "entry" in err and "serial" in err, err


def test_verify_is_offline_with_the_keys_stamp_pinned(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """As the README says: what `stampd stamp` stored (OpenPGP and SSH manifests, a tag stamp,
    their proofs) and a receipt of the same server verify with the server stopped, against the
    keys stamp pinned in the repository (server key and log key). Where none is pinned, one
    line names the option to give."""
    s = start_server(seed_data_dir(tmp_path / "data"), workers=1,
                     extra_env={"STAMPD_TLOG": "on", "STAMPD_EXTRA_KEYS": "ssh:ed25519"})
    repo = make_repo(tmp_path / "repo")
    outside = tmp_path / "outside"
    outside.mkdir()
    try:
        (repo / "a.txt").write_text("a\n")
        monkeypatch.chdir(repo)
        for extra in ((), ("--format", "ssh", "-o", "SSH256SUMS.asc")):
            code, out, err = run(capsys, "stamp", "a.txt", "--server", s.url, *extra)
            assert code == 0 and "in the log at index" in log_line(out), err
        code, out, err = run(capsys, "stamp", "--tag", "v1-stamp", "--server", s.url)
        assert code == 0 and "in the log at index" in log_line(out), err
        (repo / "a.txt.asc").write_text(post_receipt(
            s, hashlib.sha256(b"a\n").hexdigest()))
        vkey = urllib.request.urlopen(s.url + "tlog/vkey", timeout=10).read().decode().strip()
        for name in ("a.txt", "SHA256SUMS.asc", "SHA256SUMS.asc.tlog-proof"):
            shutil.copy(repo / name, outside / name)
    finally:
        s.stop()
        shutil.rmtree(s.runtime_dir, ignore_errors=True)
    pin = pin_name(s.url)
    for argv in (["SHA256SUMS.asc", "--dir", "."], ["SSH256SUMS.asc", "--dir", "."],
                 ["v1-stamp"], ["a.txt.asc", "--file", "a.txt"]):
        code, out, err = run(capsys, "verify", *argv)
        assert code == 0, f"{argv}: {err}"
        assert err == "", f"{argv}: {err}"  # (no note: no key was fetched)
        assert f"(pinned as timestamper.{pin}." in out, out
        if argv[0] != "a.txt.asc":  # (a receipt from curl has no proof)
            assert "in the log at index" in log_line(out) and "pinned log key" in log_line(out)
    # Outside the repository nothing is pinned, and the server is gone: one line each, naming
    # the option that would do.
    monkeypatch.chdir(outside)
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".")
    assert code == 1 and err.count("\n") == 1 and "give --key KEYFILE" in err, err
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".", "--key",
                         str(TEST_PUBLIC_KEY))
    assert code == 1 and err.count("\n") == 1 and "give --log-key VKEY_OR_FILE" in err, err
    code, out, err = run(capsys, "verify", "SHA256SUMS.asc", "--dir", ".", "--key",
                         str(TEST_PUBLIC_KEY), "--log-key", vkey)
    assert code == 0, err
