"""The /v1 digest API with curl: receipts, rejections, fetching again, the log."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from formats.receipts import parse_statement, split_receipt
from tests.helpers import TEST_FPR, Server, keyring, log_commits, start_server, wait_for

H256 = hashlib.sha256(b"hello\n").hexdigest()
H512 = hashlib.sha512(b"hello\n").hexdigest()


def curl(server: Server, *args: str) -> tuple[int, str, str]:
    """(status, content type, body) of a curl call against the server."""
    r = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code} %{content_type}",
                        *args], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    body, _, tail = r.stdout.rpartition("\n")
    status, _, ctype = tail.partition(" ")
    return int(status), ctype, body


def rows(server: Server) -> int:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return int(db.execute("select count(*) from stamps where kind='digest'").fetchone()[0])


def gpg_verify(receipt: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                           "--verify"], input=receipt, capture_output=True, text=True,
                          timeout=60, check=False)


def test_form_receipt_verifies_with_gpg(live_server: Server, tmp_path: Path) -> None:
    status, ctype, receipt = curl(live_server, "--data", f"sha256={H256}",
                                  live_server.url + "v1/stamps")
    assert status == 200 and ctype.startswith("text/plain"), receipt
    statement = parse_statement(split_receipt(receipt)[0])
    assert (statement.algorithm, statement.digest, statement.key) == ("sha256", H256, TEST_FPR)
    assert statement.server == live_server.url
    home = keyring(live_server.data_dir / "keys/pubkey.asc", tmp_path / "g")
    r = gpg_verify(receipt, home)
    assert r.returncode == 0 and f"VALIDSIG {TEST_FPR}" in r.stdout
    assert f" {statement.time} " in r.stdout.split("VALIDSIG")[1].split("\n")[0]


def test_json_request_and_answer(live_server: Server, tmp_path: Path) -> None:
    status, ctype, body = curl(live_server, "-H", "Content-Type: application/json",
                               "-H", "Accept: application/json",
                               "--data", json.dumps({"sha512": H512}),
                               live_server.url + "v1/stamps")
    assert status == 200 and ctype == "application/json", body
    data = json.loads(body)
    assert data["algorithm"] == "sha512" and data["digest"] == H512
    assert data["key"] == TEST_FPR and data["serial"] > 0
    assert parse_statement(split_receipt(data["receipt"])[0]).serial == data["serial"]
    home = keyring(live_server.data_dir / "keys/pubkey.asc", tmp_path / "g")
    assert gpg_verify(data["receipt"], home).returncode == 0


def test_tampered_receipt_rejected_by_gpg(live_server: Server, tmp_path: Path) -> None:
    _, _, receipt = curl(live_server, "--data", f"sha256={H256}",
                         live_server.url + "v1/stamps")
    home = keyring(live_server.data_dir / "keys/pubkey.asc", tmp_path / "g")
    st = parse_statement(split_receipt(receipt)[0])
    for old, new in [(H256, H256[:-1] + ("0" if H256[-1] != "0" else "1")),
                     (f"time: {st.time}", f"time: {st.time - 1}"),
                     (f"serial: {st.serial}", f"serial: {st.serial + 1}")]:
        assert gpg_verify(receipt.replace(old, new), home).returncode != 0


def test_fetch_again(live_server: Server) -> None:
    digest = hashlib.sha256(b"fetch me").hexdigest()
    status, _, _ = curl(live_server, live_server.url + f"v1/stamps/sha256/{digest}")
    assert status == 404
    _, _, first = curl(live_server, "--data", f"sha256={digest}", live_server.url + "v1/stamps")
    _, _, second = curl(live_server, "--data", f"sha256={digest}", live_server.url + "v1/stamps")
    status, _, both = curl(live_server, live_server.url + f"v1/stamps/sha256/{digest}")
    assert status == 200 and both == first + second
    status, _, body = curl(live_server, "-H", "Accept: application/json",
                           live_server.url + f"v1/stamps/sha256/{digest}")
    assert [r["receipt"] for r in json.loads(body)["receipts"]] == [first, second]


def get(server: Server, path: str, accept: str | None = None
        ) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a GET."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", path, headers={"Accept": accept} if accept else {})
    r = conn.getresponse()
    body = r.read().decode()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def test_receipts_come_a_page_at_a_time(live_server: Server) -> None:
    """One digest stamped many times: receipts are answered in pages (limit + cursor), each
    page naming the next one, so a lookup's cost is bounded whatever the history."""
    digest = hashlib.sha256(b"paged").hexdigest()
    receipts = [curl(live_server, "--data", f"sha256={digest}", live_server.url + "v1/stamps")[2]
                for _ in range(3)]
    base = f"/v1/stamps/sha256/{digest}"
    status, headers, first = get(live_server, base + "?limit=2")
    assert status == 200 and first == receipts[0] + receipts[1]
    next_url = headers["link"].removeprefix("<").split(">;")[0]
    assert headers["link"].endswith('>; rel="next"') and next_url.startswith(base + "?limit=2&")
    status, headers, rest = get(live_server, next_url)
    assert status == 200 and rest == receipts[2] and "link" not in headers
    status, _, body = get(live_server, base + "?limit=2", accept="application/json")
    page = json.loads(body)
    assert [r["receipt"] for r in page["receipts"]] == receipts[:2]
    assert page["next"] == next_url
    status, _, body = get(live_server, next_url, accept="application/json")
    assert json.loads(body)["next"] is None
    # Without a limit a page holds at most 100 receipts.
    serial = int(parse_statement(split_receipt(receipts[2])[0]).serial)
    with sqlite3.connect(live_server.data_dir / "stampd.sqlite3") as db:
        db.executemany(
            "insert into stamps (kind, algorithm, digest, stamped_at, state, attempts, receipt)"
            " values ('digest', 'sha256', ?, 0, 'signed', 1, ?)",
            [(digest, f"receipt {i}\n") for i in range(150)])
    status, headers, body = get(live_server, base)
    assert status == 200 and body.count("\n") > 0 and "link" in headers
    assert body.startswith(receipts[0]) and body.endswith("receipt 96\n")
    status, _, body = get(live_server, f"{base}?after={serial}&limit=1")
    assert status == 200 and body == "receipt 0\n"
    for bad in ("limit=0", "limit=101", "limit=x", "after=-1", "limit=1&limit=2"):
        status, headers, body = get(live_server, f"{base}?{bad}")
        assert status == 400 and headers["content-type"] == "application/problem+json", bad


def test_one_line_file_stamp(live_server: Server, tmp_path: Path) -> None:
    """The README's one-liner: sha256sum FILE | cut -d' ' -f1 | curl ..."""
    f = tmp_path / "doc.txt"
    f.write_text("a document\n")
    r = subprocess.run(
        f"sha256sum {f} | cut -d' ' -f1 | curl -sS --data-urlencode sha256@- "
        f"{live_server.url}v1/stamps", shell=True, capture_output=True, text=True, timeout=60,
        check=False)
    assert r.returncode == 0, r.stderr
    st = parse_statement(split_receipt(r.stdout)[0])
    assert st.digest == hashlib.sha256(f.read_bytes()).hexdigest()


BAD = {
    "wrong length": ["--data", f"sha256={H256[:-2]}"],
    "sha512 length for sha256": ["--data", f"sha256={H512}"],
    "non-hex": ["--data", "sha256=" + "g" * 64],
    "uppercase": ["--data", f"sha256={H256.upper()}"],
    "unknown algorithm": ["--data", f"md5={H256[:32]}"],
    "two digests": ["--data", f"sha256={H256}&sha512={H512}"],
    "same field twice": ["--data", f"sha256={H256}&sha256={H256}"],
    "empty body": ["--data", ""],
    "json not an object": ["-H", "Content-Type: application/json", "--data", f'["{H256}"]'],
    "json number": ["-H", "Content-Type: application/json", "--data", '{"sha256": 5}'],
    "json malformed": ["-H", "Content-Type: application/json", "--data", '{"sha256": '],
    "newline inside digest": ["--data-urlencode", f"sha256={H256[:32]}\n{H256[32:]}"],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_rejected_400_problem_json(live_server: Server, name: str) -> None:
    before = rows(live_server)
    status, ctype, body = curl(live_server, *BAD[name], live_server.url + "v1/stamps")
    assert status == 400, body
    assert ctype == "application/problem+json"
    problem = json.loads(body)
    assert problem["status"] == 400 and problem["detail"]
    assert rows(live_server) == before


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["-H", "Content-Type: text/plain", "--data", f"sha256={H256}"], 415),
        (["--data", f"sha256={H256}&pad=" + "x" * 2000], 413),
        (["-H", "Transfer-Encoding: chunked", "--data", f"sha256={H256}"], 411),
    ],
)
def test_rejected_other_4xx(live_server: Server, args: list[str], code: int) -> None:
    before = rows(live_server)
    status, ctype, _ = curl(live_server, *args, live_server.url + "v1/stamps")
    assert status == code
    assert ctype == "application/problem+json"
    assert rows(live_server) == before


def test_bad_lookup_400(live_server: Server) -> None:
    status, _, _ = curl(live_server, live_server.url + "v1/stamps/md5/abc")
    assert status == 400


def test_digests_reach_the_log(seeded_dir: Path, server_factory: list[Server]) -> None:
    server = start_server(seeded_dir, workers=1, commit_interval=2)
    server_factory.append(server)
    curl(server, "--data", f"sha512={H512}", server.url + "v1/stamps")
    curl(server, "--data", f"sha256={H256}", server.url + "v1/stamps")
    curl(server, "--data", f"sha256={H256}", server.url + "v1/stamps")
    wait_for(lambda: len(log_commits(seeded_dir)) == 1, what="a log commit")
    tree = log_commits(seeded_dir)[0].tree
    assert tree["digests.log"].data.decode() == f"sha256 {H256}\nsha512 {H512}\n"  # type: ignore[attr-defined]
    assert tree["hashes.log"].data == b""  # type: ignore[attr-defined]


def logged_digests(data_dir: Path) -> list[str]:
    """Every line of every digests.log on main."""
    return [line for c in log_commits(data_dir) if "digests.log" in c.tree
            for line in c.tree["digests.log"].data.decode().splitlines()]  # type: ignore[attr-defined]


def test_failed_digest_stays_out_of_the_log(seeded_dir: Path,
                                            server_factory: list[Server]) -> None:
    """A digest answered with 503 was never signed: the log does not list it."""
    server = start_server(seeded_dir, workers=1, commit_interval=2,
                          extra_env={"STAMPD_REQUEST_TIMEOUT": "2"})
    server_factory.append(server)
    failing = hashlib.sha256(b"never signed").hexdigest()
    (worker,) = server.worker_pids()
    os.kill(worker, signal.SIGSTOP)  # no worker can sign within the request timeout
    try:
        status, _, body = curl(server, "--data", f"sha256={failing}", server.url + "v1/stamps")
    finally:
        os.kill(worker, signal.SIGCONT)
    assert status == 503, body
    status, _, body = curl(server, "--data", f"sha256={H256}", server.url + "v1/stamps")
    assert status == 200, body

    wait_for(lambda: f"sha256 {H256}" in logged_digests(seeded_dir), what="the signed digest")
    assert logged_digests(seeded_dir) == [f"sha256 {H256}"]
    with sqlite3.connect(seeded_dir / "stampd.sqlite3") as db:
        rows = db.execute("select digest, state, log_commit_id is not null from stamps "
                          "order by id").fetchall()
    # The failed stamp went along with that log commit, unpublished.
    assert rows == [(failing, "failed-unlogged", 1), (H256, "signed", 1)]
