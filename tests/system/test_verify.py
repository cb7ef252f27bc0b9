"""`stampd verify` against receipts and git stamps from a live stampd, with real gpg and git."""

from __future__ import annotations

import hashlib
import http.client
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from formats.openpgp import armor_signature, dearmor_signature
from formats.receipts import BEGIN_SIG, Statement
from stampd import cli
from tests.helpers import (
    ROOT,
    TEST_FPR,
    TEST_PUBLIC_KEY,
    TEST_SECRET_KEY,
    TEST_UID,
    Server,
    git,
    keyring,
    make_repo,
)

README = ROOT / "README.md"
STAMPD = Path(sys.executable).parent / "stampd"


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    missing = [t for t in ("git", "gpg", "curl", "sha256sum") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"required tools missing: {', '.join(missing)}")


def post(server: Server, fields: dict[str, str], path: str = "/") -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", path, body=urllib.parse.urlencode(fields),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    assert r.status == 200, text
    return text


def receipt(server: Server, data: bytes, algorithm: str = "sha256") -> str:
    return post(server, {algorithm: hashlib.new(algorithm, data).hexdigest()}, "/v1/stamps")


def server_key(server: Server, path: Path) -> Path:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/?request=get-public-key-v1")
    r = conn.getresponse()
    path.write_bytes(r.read())
    conn.close()
    assert r.status == 200
    return path


def verify(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """`stampd verify ARGS` in-process: (exit status, stdout, stderr)."""
    code = cli.main(["verify", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def gpg_verify(path: Path, home: Path) -> bool:
    r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--verify", str(path)],
                       capture_output=True, timeout=60, check=False)
    return r.returncode == 0


def readme_one_liner() -> str:
    lines = [line for line in README.read_text().splitlines() if line.startswith("sha256sum ")]
    assert len(lines) == 1, "the README shows one curl one-liner"
    return lines[0]


def test_readme_one_liner_and_verify_offline_and_online(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "notes.txt"
    doc.write_text("the minutes of the meeting\n")
    line = readme_one_liner().replace("http://127.0.0.1:8080/", live_server.url)
    line = line.replace("FILE", str(doc))
    r = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=60,
                       check=False, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rec = Path(f"{doc}.receipt.asc")
    assert rec.read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----\n"), rec.read_text()
    assert gpg_verify(rec, keyring(TEST_PUBLIC_KEY, tmp_path / "g")), "real gpg --verify"

    code, out, err = verify(capsys, rec, "--file", doc, "--key", TEST_PUBLIC_KEY)
    assert code == 0, err
    t = int(re.search(r"^time: .*\((\d+)\)$", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert abs(t - time.time()) < 60
    assert f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))} ({t})" in out
    assert TEST_FPR in out and "matches:       file" in out
    assert err == ""

    digest = hashlib.sha256(doc.read_bytes()).hexdigest()
    code, out, err = verify(capsys, rec, "--digest", digest.upper())  # online: fetches the key
    assert code == 0, err
    assert f"fetched from {live_server.url}?request=get-public-key-v1" in err
    assert TEST_FPR in out

    code, _, err = verify(capsys, rec, "--file", TEST_PUBLIC_KEY, "--key", TEST_PUBLIC_KEY)
    assert code == 1 and "not the receipt's" in err
    code, _, err = verify(capsys, rec, "--digest", "ab" * 32, "--key", TEST_PUBLIC_KEY)
    assert code == 1 and len(err.splitlines()) == 1
    code, _, err = verify(capsys, rec, "--digest", "xyz", "--key", TEST_PUBLIC_KEY)
    assert code == 2


def test_sha512_receipt_from_stdin_with_the_console_script(
        live_server: Server, tmp_path: Path) -> None:
    data = b"sha512 data\n"
    (tmp_path / "d").write_bytes(data)
    text = receipt(live_server, data, "sha512")
    r = subprocess.run([str(STAMPD), "verify", "-", "--file", str(tmp_path / "d"), "--key",
                        str(TEST_PUBLIC_KEY)], input=text, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "valid receipt: sha512 " in r.stdout


# --------------------------------------------------------------------------- tampering


def signature_packets(text: str) -> tuple[str, bytes]:
    """(text before the signature armor, the binary signature packets)."""
    head = text[:text.index(BEGIN_SIG + "\n")]
    return head, dearmor_signature(text[len(head):])


def armor(head: str, packets: bytes) -> str:
    return head + armor_signature(packets)


def replace_line(name: str, value: Callable[[str], str]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        m = re.search(rf"^{name}: (.*)$", text, re.MULTILINE)
        assert m
        return text[:m.start(1)] + value(m.group(1)) + text[m.end(1):]
    return edit


def shift_time(text: str) -> str:
    t = int(re.search(r"^time: (\d+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    text = replace_line("time", lambda _: str(t + 1))(text)
    return replace_line("utc", lambda _: time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                       time.gmtime(t + 1)))(text)


def flip_signature_char(text: str) -> str:
    start = text.index(BEGIN_SIG) + len(BEGIN_SIG) + 2 + 20  # inside the first base64 line
    c = text[start]
    return text[:start] + ("B" if c != "B" else "C") + text[start + 1:]


def two_signatures(text: str) -> str:
    head, packets = signature_packets(text)
    return armor(head, packets + packets)


def flip_hex(value: str) -> str:
    return ("1" if value[0] != "1" else "2") + value[1:]


# name: (edit, expected `stampd verify` status, whether the real `gpg --verify` accepts it)
TAMPERED: dict[str, tuple[Callable[[str], str], int, bool]] = {
    "digest changed": (replace_line("digest", flip_hex), 1, False),
    "time and utc changed": (shift_time, 1, False),
    "time changed, utc not": (replace_line("time", lambda v: str(int(v) + 1)), 2, False),
    "serial changed": (replace_line("serial", lambda v: str(int(v) + 1)), 1, False),
    "server changed": (replace_line("server", lambda v: v.replace("127.0.0.1", "localhost")),
                       1, False),
    "key changed": (replace_line("key", lambda v: "0" * 40), 1, False),
    "base64 char flipped in the signature": (flip_signature_char, 1, False),
    "statement line added": (lambda t: t.replace("\nkey: ", "\nnote: x\nkey: "), 2, False),
    "signature removed": (lambda t: t.split(BEGIN_SIG)[0], 2, False),
    # gpg checks only signatures: these pass `gpg --verify` but are not receipts stampd accepts.
    "signature packet twice": (two_signatures, 1, True),
    "text before the message": (lambda t: "hello\n" + t, 2, True),
    "second signature block": (lambda t: t + t[t.index(BEGIN_SIG):], 2, True),
}


def test_tampered_receipts(live_server: Server, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    text = receipt(live_server, b"tamper with me\n")
    home = keyring(TEST_PUBLIC_KEY, tmp_path / "g")
    good = tmp_path / "good.asc"
    good.write_text(text)
    assert gpg_verify(good, home)
    assert verify(capsys, good, "--key", TEST_PUBLIC_KEY)[0] == 0
    # The re-armoring helper itself is faithful: one packet re-armored still verifies.
    same = tmp_path / "rearmored.asc"
    same.write_text(armor(*signature_packets(text)))
    assert gpg_verify(same, home) and verify(capsys, same, "--key", TEST_PUBLIC_KEY)[0] == 0

    for name, (edit, expected, gpg_accepts) in TAMPERED.items():
        path = tmp_path / f"{name.replace(' ', '-')}.asc"
        path.write_text(edit(text))
        assert path.read_text() != text, name
        code, out, err = verify(capsys, path, "--key", TEST_PUBLIC_KEY)
        assert code == expected, f"{name}: {code} {out} {err}"
        assert out == "" and len(err.splitlines()) == 1, f"{name}: {err}"
        assert gpg_verify(path, home) == gpg_accepts, f"real gpg --verify on: {name}"
        if name == "signature packet twice":
            assert "more than one signature" in err


def test_signature_time_must_be_the_statement_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Receipts clearsigned here with the test key by gpg itself, at a chosen signature time."""
    home = keyring(TEST_SECRET_KEY, tmp_path / "signer", agent=True)
    t = int(time.time()) - 100
    statement = Statement(algorithm="sha256", digest="ab" * 32, time=t,
                          server="http://127.0.0.1:9/", serial=7, key=TEST_FPR).text()

    def clearsign(at: int) -> Path:
        r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--faked-system-time",
                            f"{at}!", "--local-user", TEST_FPR, "--clearsign"],
                           input=statement.encode(), capture_output=True, timeout=60, check=True)
        path = tmp_path / f"at-{at}.asc"
        path.write_bytes(r.stdout)
        return path

    assert verify(capsys, clearsign(t), "--key", TEST_PUBLIC_KEY)[0] == 0
    code, _, err = verify(capsys, clearsign(t + 5), "--key", TEST_PUBLIC_KEY)
    assert code == 1 and f"signature made at {t + 5}" in err


def test_a_saved_server_error_is_named_and_quoted(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """curl without --fail saves an error answer where the receipt should be: verify says it
    holds a server's error and quotes it. The README's one-liner has --fail, so it saves none."""
    assert " --fail " in readme_one_liner()
    problem, plain = tmp_path / "problem.receipt.asc", tmp_path / "plain.receipt.asc"
    for args, path in (
            (["--data-urlencode", "sha256=xyz", f"{live_server.url}v1/stamps"], problem),
            (["--data", "request=stamp-tag-v1&commit=xyz&tagname=t", live_server.url], plain)):
        r = subprocess.run(["curl", "-sS", "-o", str(path), *args], capture_output=True,
                           text=True, timeout=60, check=False)
        assert r.returncode == 0 and path.stat().st_size > 0, r.stderr
    code, _, err = verify(capsys, problem, "--key", TEST_PUBLIC_KEY)
    assert code == 2, err
    assert err.startswith(f"stampd verify: malformed: {problem} holds a server's error answer, "
                          "not a receipt: HTTP 400 'Bad Request: "), err
    assert "sha256" in err and len(err.splitlines()) == 1
    code, _, err = verify(capsys, plain, "--key", TEST_PUBLIC_KEY)
    assert code == 2, err
    assert err.startswith(f"stampd verify: malformed: {plain} holds no receipt but a short "
                          "text, likely a server's error answer: \"field 'commit' must be "), err
    assert len(err.splitlines()) == 1
    # with --fail, curl saves nothing and fails (exit 22)
    r = subprocess.run(["curl", "-sS", "--fail", "-o", str(tmp_path / "none"),
                        "--data-urlencode", "sha256=xyz", f"{live_server.url}v1/stamps"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 22 and not (tmp_path / "none").exists()


def test_garbage_is_malformed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {"empty": b"", "text": b"hello world\n", "binary": bytes(range(256)),
             "json": b'{"sha256": "00"}\n', "huge": b"A" * 100_000}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        code, _, err = verify(capsys, path, "--key", TEST_PUBLIC_KEY)
        assert code == 2, f"{name}: {err}"
        assert err.startswith("stampd verify: malformed: ")
    # A receipt path that does not exist says so (it is no git tag or commit either).
    for missing in (tmp_path / "gone.asc", "gone.receipt.asc"):
        code, _, err = verify(capsys, missing)
        assert code == 2 and err == f"stampd verify: malformed: no such file: {missing}\n", err


def test_receipt_of_another_server(live_server: Server, other_server: Server, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = receipt(other_server, b"from elsewhere\n")
    path = tmp_path / "other.asc"
    path.write_text(text)
    other_key = server_key(other_server, tmp_path / "other-key.asc")
    assert TEST_FPR not in text
    # Signed by a key that is not the one in --key: invalid.
    code, _, err = verify(capsys, path, "--key", TEST_PUBLIC_KEY)
    assert code == 1 and "signature does not verify" in err
    # With its own key, offline or fetched from its server, it is valid.
    assert verify(capsys, path, "--key", other_key)[0] == 0
    code, _, err = verify(capsys, path)
    assert code == 0 and f"fetched from {other_server.url}" in err
    # The live server's receipt checked against the other key: invalid.
    mine = tmp_path / "mine.asc"
    mine.write_text(receipt(live_server, b"mine\n"))
    assert verify(capsys, mine, "--key", other_key)[0] == 1
    # A key file holding both keys still requires the key the receipt names.
    both = tmp_path / "both.asc"
    both.write_bytes(TEST_PUBLIC_KEY.read_bytes() + other_key.read_bytes())
    assert verify(capsys, mine, "--key", both)[0] == 0


def test_online_check_needs_a_reachable_http_server(
        live_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = receipt(live_server, b"offline server\n")
    # A receipt naming another server is only as good as that server's answer: here, none.
    moved = text.replace(f"server: {live_server.url}", "server: http://127.0.0.1:9/")
    path = tmp_path / "moved.asc"
    path.write_text(moved)
    code, _, err = verify(capsys, path)
    assert code == 1 and "cannot check" in err and "127.0.0.1:9" in err
    path.write_text(text.replace(f"server: {live_server.url}", "server: file:///etc/passwd"))
    code, _, err = verify(capsys, path)
    assert code == 2 and "http://" in err


# --------------------------------------------------------------------------- git stamps


def write_object(repo: Path, kind: str, text: str) -> str:
    r = subprocess.run(["git", "hash-object", "-w", "--stdin", "-t", kind], cwd=repo,
                       input=text, capture_output=True, text=True, timeout=60, check=True)
    return r.stdout.strip()


def test_git_tag_and_commit_stamps(live_server: Server, other_server: Server, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo")
    head = git(repo, "rev-parse", "HEAD").strip()
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()

    tag = post(live_server, {"request": "stamp-tag-v1", "commit": head, "tagname": "stamp-1"})
    git(repo, "update-ref", "refs/tags/stamp-1", write_object(repo, "tag", tag))
    stamp = post(live_server, {"request": "stamp-branch-v1", "commit": head, "tree": tree})
    git(repo, "update-ref", "refs/heads/ts", write_object(repo, "commit", stamp))

    for target, kind in (("stamp-1", "tag"), ("ts", "commit")):
        code, out, err = verify(capsys, target, "--key", TEST_PUBLIC_KEY, "--repo", repo)
        assert code == 0, err
        assert f"valid {kind} stamp" in out and f"stamps commit: {head}" in out
        t = int(re.search(r"^time: .*\((\d+)\)$", out, re.MULTILINE).group(1))  # type: ignore[union-attr]
        assert abs(t - time.time()) < 60 and TEST_FPR in out and TEST_UID in out

    other_key = server_key(other_server, tmp_path / "other-key.asc")
    code, _, err = verify(capsys, "stamp-1", "--key", other_key, "--repo", repo)
    assert code == 1, err
    code, _, err = verify(capsys, "ts", "--key", other_key, "--repo", repo)
    assert code == 1, err

    # A stamp of the other server verifies with its key only.
    other = post(other_server, {"request": "stamp-branch-v1", "commit": head, "tree": tree})
    git(repo, "update-ref", "refs/heads/other-ts", write_object(repo, "commit", other))
    assert verify(capsys, "other-ts", "--key", other_key, "--repo", repo)[0] == 0
    assert verify(capsys, "other-ts", "--key", TEST_PUBLIC_KEY, "--repo", repo)[0] == 1

    # Not stamps, or no way to check them: malformed.
    for args in (("main", "--key", TEST_PUBLIC_KEY),        # an unsigned commit
                 ("no-such-ref", "--key", TEST_PUBLIC_KEY),
                 ("HEAD^{tree}", "--key", TEST_PUBLIC_KEY),
                 ("ts",),                                     # no --key
                 ("ts", "--key", tmp_path / "missing.asc"),
                 ("ts", "--key", TEST_PUBLIC_KEY, "--digest", "00" * 32)):
        code, _, err = verify(capsys, *args, "--repo", repo)
        assert code == 2, f"{args}: {err}"
        assert len(err.splitlines()) == 1

    # A real tag stamp without --key (and no key pinned) is not malformed: it says what is
    # missing.
    assert verify(capsys, "stamp-1", "--repo", repo) == (
        2, "", "stampd verify: a git stamp is checked against the server's key: give --key "
        f"FILE (none is pinned in {repo} by stampd stamp or stampd hook install)\n")
