"""POST /v1/manifests against a real server, checked with real curl, gpg, sha256sum and
ssh-keygen (docs/manifests.md)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Server, log_commits, start_server, wait_for

pytestmark = pytest.mark.slow

# The module's server takes at most this many lines (STAMPD_MAX_MANIFEST_LINES), and the big
# test sends exactly that many: the whole path at the limit, in a few seconds. A million lines
# (the default limit) is `make bench-manifest`'s, which checks every answer too.
MANIFEST_LINES = int(os.environ.get("STAMPD_TEST_MANIFEST_LINES", "100000"))


def curl(*args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sS", *args], input=data, capture_output=True,
                          check=True, timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("manifests"), workers=1, commit_interval=1,
                       extra_env={"STAMPD_EXTRA_KEYS": "ssh:ed25519",
                                  "STAMPD_MAX_MANIFEST_LINES": str(MANIFEST_LINES)})
    try:
        yield srv
    finally:
        srv.stop()


def gnupghome(tmp: Path, server: Server) -> dict[str, str]:
    home = tmp / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    key = curl(f"{server.url}?request=get-public-key-v1").stdout
    subprocess.run(["gpg", "--batch", "--import"], input=key, env=env, check=True,
                   capture_output=True)
    return env


def stamped_rows(server: Server) -> tuple[int, int]:
    db = sqlite3.connect(server.data_dir / "stampd.sqlite3")
    try:
        return (db.execute("SELECT count(*) FROM stamps WHERE kind='manifest'").fetchone()[0],
                db.execute("SELECT count(*) FROM manifest_digests").fetchone()[0])
    finally:
        db.close()


def digests_logged(data_dir: Path) -> set[str]:
    """The lines of every log commit's digests.log (each commit holds its period's)."""
    lines: set[str] = set()
    for c in log_commits(data_dir):
        if "digests.log" in c.tree:
            lines.update(c.tree["digests.log"].data.decode().split("\n"))  # type: ignore[attr-defined]
    return lines


def test_sha256sum_curl_gpg_verify_and_check(server: Server, tmp_path: Path) -> None:
    files = tmp_path / "release"
    files.mkdir()
    for i in range(5):
        (files / f"file {i}.bin").write_bytes(os.urandom(100 + i))
    sums = subprocess.run("sha256sum -b *", shell=True, cwd=files, capture_output=True,
                          check=True).stdout
    signed = curl("--data-binary", "@-", f"{server.url}v1/manifests", data=sums).stdout
    (files / "SHA256SUMS.asc").write_bytes(signed)
    text = signed.decode()
    assert text.startswith("-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n"
                           "# stampd manifest v1\n# algorithm: sha256\n")
    assert sums.decode() in text and "# lines: 5\n" in text
    env = gnupghome(tmp_path, server)
    subprocess.run(["gpg", "--batch", "--verify", "SHA256SUMS.asc"], cwd=files, env=env,
                   check=True, capture_output=True)
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS.asc"], cwd=files,
                           capture_output=True)
    assert check.returncode == 0, check.stderr
    assert check.stdout.decode().count(": OK") == 5
    # A tampered file fails sha256sum -c; a tampered line fails gpg --verify.
    (files / "file 2.bin").write_bytes(b"changed")
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS.asc"], cwd=files,
                          capture_output=True).returncode == 1
    lines = text.split("\n")
    i = next(n for n, line in enumerate(lines) if line.endswith("file 3.bin"))
    lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
    (files / "SHA256SUMS.asc").write_text("\n".join(lines))
    assert subprocess.run(["gpg", "--batch", "--verify", "SHA256SUMS.asc"], cwd=files,
                          env=env, capture_output=True).returncode != 0
    # GET finds the manifest for each digest, and the manifest itself.
    serial = int(next(x for x in text.split("\n") if x.startswith("# serial: ")).split()[-1])
    digest = sums.split()[0].decode()
    page = json.loads(curl("-H", "Accept: application/json",
                           f"{server.url}v1/stamps/sha256/{digest}").stdout)
    assert page["receipts"] == [] and page["manifests"][0]["serial"] == serial
    assert curl(f"{server.url}v1/manifests/{serial}").stdout == signed


def test_bad_lines_are_refused_with_their_numbers(server: Server) -> None:
    before = stamped_rows(server)
    good = hashlib.sha256(b"x").hexdigest()
    body = "".join(f"{good}  ok{i}\n" if i not in (3, 7) else f"{good[:-1]}  bad\n"
                   for i in range(1, 10)).encode()
    answer = subprocess.run(["curl", "-sS", "-w", "%{http_code}", "--data-binary", "@-",
                             f"{server.url}v1/manifests"], input=body, capture_output=True,
                            check=True).stdout
    problem, status = answer[:-3], answer[-3:]
    assert status == b"400"
    got = json.loads(problem)
    assert got["lines"] == [3, 7] and got["bad_lines"] == 2
    assert stamped_rows(server) == before


def test_ssh_format(server: Server, tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    sums = subprocess.run(["sha256sum", "a"], cwd=tmp_path, capture_output=True,
                          check=True).stdout
    signed = curl("--data-binary", "@-", f"{server.url}v1/manifests?format=ssh",
                  data=sums).stdout.decode()
    text, sep, sig = signed.partition("-----BEGIN SSH SIGNATURE-----\n")
    assert sep and text.endswith(sums.decode())
    (tmp_path / "SHA256SUMS.asc").write_text(signed)
    (tmp_path / "sig").write_text(sep + sig)
    allowed = curl(f"{server.url}v1/keys/allowed_signers").stdout
    (tmp_path / "allowed").write_bytes(allowed)
    principal = allowed.split()[0].decode()
    subprocess.run(["ssh-keygen", "-Y", "verify", "-f", "allowed", "-I", principal, "-n",
                    "stampd", "-s", "sig"], cwd=tmp_path, input=text.encode(), check=True,
                   capture_output=True)
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS.asc"], cwd=tmp_path,
                          capture_output=True).returncode == 0


def test_a_manifest_at_the_line_limit_signed_once_found_and_logged(server: Server,
                                                                   tmp_path: Path) -> None:
    """A manifest of exactly the server's most lines is signed once, each of its digests is
    found by GET and reaches the log (digests only, never names); one line more is a 413 that
    leaves no row."""
    n = MANIFEST_LINES
    digests = [hashlib.sha256(i.to_bytes(8, "big")).hexdigest() for i in range(n)]
    body = "".join(f"{d} *f{i}\n" for i, d in enumerate(digests)).encode()
    manifests_before = stamped_rows(server)[0]
    over = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                           "--data-binary", "@-", f"{server.url}v1/manifests"],
                          input=body + f"{digests[0]} *one-more\n".encode(),
                          capture_output=True, check=True, timeout=300).stdout
    assert over == b"413"
    assert stamped_rows(server)[0] == manifests_before
    started = time.monotonic()
    signed = curl("--data-binary", "@-", f"{server.url}v1/manifests", data=body).stdout
    took = time.monotonic() - started
    print(f"{n} lines in {took:.1f} s: {n / took:.0f} digests/s")
    assert signed.count(b"-----BEGIN PGP SIGNATURE-----") == 1
    assert f"# lines: {n}\n".encode() in signed
    assert stamped_rows(server)[0] == manifests_before + 1  # one stamp, one signature
    for d in (digests[0], digests[n // 2], digests[-1]):
        page = json.loads(curl("-H", "Accept: application/json",
                               f"{server.url}v1/stamps/sha256/{d}").stdout)
        assert page["manifests"]
    clone = tmp_path / "log"
    deadline = time.monotonic() + 60
    while True:
        subprocess.run(["rm", "-rf", str(clone)], check=True)
        subprocess.run(["git", "clone", "-q", f"{server.url}log.git", str(clone)],
                       check=True, capture_output=True)
        log = clone / "digests.log"
        logged = set(log.read_text().split("\n")) if log.exists() else set()
        if f"sha256 {digests[-1]}" in logged or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {f"sha256 {d}" for d in digests} <= logged
    # Only digests reach the log, never names.
    assert all(re.fullmatch(r"sha(256 [0-9a-f]{64}|512 [0-9a-f]{128})", line)
               for line in logged if line)



def test_on_postgres(seeded_dir: Path, server_factory: list[Server], pg_url: str,
                     tmp_path: Path) -> None:
    """The whole path on PostgreSQL: journalled with its digest buckets, signed once
    (gpg --verify), found by GET, its digests in the log; the rows are PostgreSQL's."""
    from sqlalchemy import create_engine, text

    (seeded_dir / "stampd.sqlite3").unlink()  # the seeded journal: none is made on PostgreSQL
    server = start_server(seeded_dir, workers=1, commit_interval=1, database_url=pg_url)
    server_factory.append(server)
    n = 50_000  # enough for every one of the 65,536 buckets to be hit many times over
    digests = [hashlib.sha256(i.to_bytes(8, "big")).hexdigest() for i in range(n)]
    body = "".join(f"{d}  f{i}\n" for i, d in enumerate(digests)).encode()
    signed = curl("--data-binary", "@-", f"{server.url}v1/manifests", data=body).stdout
    assert signed.count(b"-----BEGIN PGP SIGNATURE-----") == 1 and body in signed
    (tmp_path / "SHA256SUMS.asc").write_bytes(signed)
    env = gnupghome(tmp_path, server)
    subprocess.run(["gpg", "--batch", "--verify", "SHA256SUMS.asc"], cwd=tmp_path, env=env,
                   check=True, capture_output=True)
    serial = int(re.search(rb"\n# serial: (\d+)\n", signed)[1])  # type: ignore[index]
    for d in (digests[0], digests[n // 2], digests[-1]):
        page = json.loads(curl("-H", "Accept: application/json",
                               f"{server.url}v1/stamps/sha256/{d}").stdout)
        assert [m["serial"] for m in page["manifests"]] == [serial]
    assert curl(f"{server.url}v1/manifests/{serial}").stdout == signed
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("select kind, state from stamps where id = :i"),
                                {"i": serial}).one() == ("manifest", "signed")
            stored = conn.execute(text("select sum(length(digests)) from manifest_digests "
                                       "where stamp_id = :i"), {"i": serial}).scalar_one()
            # Migration 0009: a long signed text is stored without pglz (2.2 s for 72 MB).
            storage = conn.execute(text("select attstorage from pg_attribute where attname "
                                        "= 'receipt' and attrelid = 'stamps'::regclass")
                                   ).scalar_one()
        assert stored == 32 * n and storage == "e"  # every digest, once; uncompressed
    finally:
        engine.dispose()
    wait_for(lambda: f"sha256 {digests[-1]}" in digests_logged(seeded_dir), what="log commit")
    assert {f"sha256 {d}" for d in digests} <= digests_logged(seeded_dir)
    assert not (seeded_dir / "stampd.sqlite3").exists()
