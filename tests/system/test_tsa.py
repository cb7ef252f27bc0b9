"""RFC 3161 against a real server, with real clients: `openssl ts` and curl, rfc3161-client.

The server starts with the product's defaults for RFC 3161 (on, an ECDSA P-256 key generated on
first start, a self-signed certificate made through the agent); one more for each other kind of
TSA key: an RSA-3072 OpenPGP key, and an ECDSA P-256 key held by ssh-agent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from rfc3161_client import TimestampRequestBuilder, VerifierBuilder, decode_timestamp_response

from stampd import cli
from tests.helpers import Server, log_commits, run_stampd, seed_data_dir, start_server, wait_for

pytestmark = pytest.mark.slow

TSQ = "application/timestamp-query"


def _server(data: Path, key: str | None = None, commit_interval: float = 3600) -> Server:
    env = {"STAMPD_TSA": "true"}
    if key is not None:
        env["STAMPD_TSA_KEY"] = key
    return start_server(data, workers=1, commit_interval=commit_interval, extra_env=env)


@pytest.fixture(scope="module")
def tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _server(seed_data_dir(tmp_path_factory.mktemp("tsa") / "data"))
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["openpgp:rsa3072", "ssh:ecdsa-p256"])
def tsa_other(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[str, Server]]:
    """A server whose TSA key is another kind than the default: (its STAMPD_TSA_KEY, it)."""
    key: str = request.param
    data = seed_data_dir(tmp_path_factory.mktemp(key.replace(":", "-")) / "data")
    server = _server(data, key=key, commit_interval=2)
    yield key, server
    server.stop()


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)


def post(url: str, query: Path, answer: Path, ctype: str = TSQ) -> tuple[int, str]:
    """POST a query file with curl; (HTTP status, Content-Type); the body goes to ``answer``."""
    r = subprocess.run(["curl", "-sS", "-o", str(answer), "-w", "%{http_code} %{content_type}",
                        "-H", f"Content-Type: {ctype}", "--data-binary", f"@{query}", url],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    status, _, got = r.stdout.partition(" ")
    return int(status), got


def chain(server: Server, path: Path) -> Path:
    r = subprocess.run(["curl", "-sS", "-f", "-o", str(path), server.url + "tsa.pem"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return path


def journal_rows(server: Server) -> int:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return int(db.execute("select count(*) from stamps where kind='tsa'").fetchone()[0])


@pytest.mark.parametrize("path", ["", "tsr"])
@pytest.mark.parametrize("alg", ["sha256", "sha384", "sha512"])
@pytest.mark.parametrize("cert", [True, False])
@pytest.mark.parametrize("nonce", [True, False])
def test_openssl_ts_verifies_a_token(tsa: Server, tmp_path: Path, path: str, alg: str,
                                     cert: bool, nonce: bool) -> None:
    data = tmp_path / "file.txt"
    data.write_bytes(os.urandom(200))
    query = ["openssl", "ts", "-query", "-data", "file.txt", f"-{alg}", "-out", "q.tsq"]
    query += ["-cert"] if cert else []
    query += [] if nonce else ["-no_nonce"]
    assert run(*query, cwd=tmp_path).returncode == 0
    status, ctype = post(tsa.url + path, tmp_path / "q.tsq", tmp_path / "r.tsr")
    assert (status, ctype) == (200, "application/timestamp-reply")
    text = run("openssl", "ts", "-reply", "-in", "r.tsr", "-text", cwd=tmp_path)
    assert "Status: Granted." in text.stdout, text.stdout + text.stderr
    assert ("Nonce: 0x" in text.stdout) == nonce
    assert "Accuracy: 0x01 seconds" in text.stdout
    chain(tsa, tmp_path / "tsa.pem")
    verify = ["openssl", "ts", "-verify", "-data", "file.txt", "-in", "r.tsr",
              "-CAfile", "tsa.pem"]
    if not cert:  # the token does not carry the certificate: OpenSSL must be given it
        verify += ["-untrusted", "tsa.pem"]
    r = run(*verify, cwd=tmp_path)
    assert "Verification: OK" in r.stdout, r.stdout + r.stderr
    # the query itself (imprint and nonce) matches the token
    r = run("openssl", "ts", "-verify", "-queryfile", "q.tsq", "-in", "r.tsr", "-CAfile",
            "tsa.pem", *([] if cert else ["-untrusted", "tsa.pem"]), cwd=tmp_path)
    assert "Verification: OK" in r.stdout, r.stdout + r.stderr
    # another file's data does not verify
    data.write_bytes(b"tampered")
    r = run(*verify, cwd=tmp_path)
    assert "Verification: OK" not in r.stdout


@pytest.mark.parametrize("cert", [True, False])
def test_other_tsa_keys(tsa_other: tuple[str, Server], tmp_path: Path, cert: bool) -> None:
    key, server = tsa_other
    (tmp_path / "f").write_bytes(key.encode())
    assert run("openssl", "ts", "-query", "-data", "f", "-sha256", "-out", "q.tsq",
               *(["-cert"] if cert else []), cwd=tmp_path).returncode == 0
    assert post(server.url, tmp_path / "q.tsq", tmp_path / "r.tsr")[0] == 200
    chain(server, tmp_path / "tsa.pem")
    r = run("openssl", "ts", "-verify", "-data", "f", "-in", "r.tsr", "-CAfile", "tsa.pem",
            *([] if cert else ["-untrusted", "tsa.pem"]), cwd=tmp_path)
    assert "Verification: OK" in r.stdout, r.stdout + r.stderr
    text = run("openssl", "x509", "-in", "tsa.pem", "-noout", "-text", cwd=tmp_path).stdout
    assert "X509v3 Extended Key Usage: critical\n                Time Stamping" in text
    if key == "openpgp:rsa3072":
        assert "rsaEncryption" in text and "Public-Key: (3072 bit)" in text
    else:  # the certificate holds the key of the ssh public key file, and ssh-agent signed it
        assert "id-ecPublicKey" in text and "NIST CURVE: P-256" in text
        assert "Signature Algorithm: ecdsa-with-SHA256" in text
        ssh_public = serialization.load_ssh_public_key(
            (server.data_dir / "keys" / "ssh-ecdsa-p256" / "id.pub").read_bytes())
        certificate = x509.load_pem_x509_certificate((tmp_path / "tsa.pem").read_bytes())
        assert certificate.public_key() == ssh_public
        certificate.verify_directly_issued_by(certificate)


def test_the_certificate_has_the_critical_time_stamping_eku(tsa: Server, tmp_path: Path) -> None:
    text = run("openssl", "x509", "-in", str(chain(tsa, tmp_path / "tsa.pem")), "-noout",
               "-text", cwd=tmp_path).stdout
    assert "X509v3 Extended Key Usage: critical\n                Time Stamping" in text
    assert "id-ecPublicKey" in text and "NIST CURVE: P-256" in text
    assert f"CN = stampd TSA at {tsa.url}" in text


def test_rfc3161_client_verifies_a_token(tsa: Server, tmp_path: Path) -> None:
    """sigstore's verifier: the token, its nonce and the certificate, against the published
    chain."""
    rfc3161_client_verifies(tsa, tmp_path)


def test_rfc3161_client_verifies_tokens_of_other_keys(tsa_other: tuple[str, Server],
                                                       tmp_path: Path) -> None:
    rfc3161_client_verifies(tsa_other[1], tmp_path)


def rfc3161_client_verifies(tsa: Server, tmp_path: Path) -> None:
    message = b"stamped by rfc3161-client"
    digest = hashlib.sha512(message).digest()  # the client's default imprint algorithm
    request = TimestampRequestBuilder().data(message).nonce(nonce=True).cert_request(
        cert_request=True).build()
    (tmp_path / "q.tsq").write_bytes(request.as_bytes())
    assert post(tsa.url + "tsr", tmp_path / "q.tsq", tmp_path / "r.tsr")[0] == 200
    response = decode_timestamp_response((tmp_path / "r.tsr").read_bytes())
    assert response.tst_info.message_imprint.message == digest
    assert response.tst_info.nonce == request.nonce
    certificate = x509.load_pem_x509_certificate(chain(tsa, tmp_path / "tsa.pem").read_bytes())
    verifier = VerifierBuilder().add_root_certificate(certificate).tsa_certificate(
        certificate).build()
    assert verifier.verify_message(response, message)


def test_a_refused_query_is_a_rejection_and_leaves_no_row(tsa: Server, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"sha1")
    assert run("openssl", "ts", "-query", "-data", "f", "-sha1", "-out", "q.tsq",
               cwd=tmp_path).returncode == 0
    before = journal_rows(tsa)
    assert post(tsa.url, tmp_path / "q.tsq", tmp_path / "r.tsr") == \
        (200, "application/timestamp-reply")
    text = run("openssl", "ts", "-reply", "-in", "r.tsr", "-text", cwd=tmp_path).stdout
    assert "Status: Rejected." in text and "unrecognized or unsupported algorithm" in text
    # another policy, and bytes that are no query at all
    assert run("openssl", "ts", "-query", "-data", "f", "-sha256", "-tspolicy", "1.2.3.4",
               "-out", "p.tsq", cwd=tmp_path).returncode == 0
    assert post(tsa.url, tmp_path / "p.tsq", tmp_path / "p.tsr")[0] == 200
    assert "Status: Rejected." in run("openssl", "ts", "-reply", "-in", "p.tsr", "-text",
                                      cwd=tmp_path).stdout
    (tmp_path / "junk.tsq").write_bytes(b"\x30\x03junk")
    assert post(tsa.url + "tsr", tmp_path / "junk.tsq", tmp_path / "j.tsr")[0] == 200
    text = run("openssl", "ts", "-reply", "-in", "j.tsr", "-text", cwd=tmp_path).stdout
    assert "Status: Rejected." in text and "the data submitted has the wrong format" in text
    assert journal_rows(tsa) == before


def test_http_errors_answer_a_timestamp_reply(tsa: Server, tmp_path: Path) -> None:
    (tmp_path / "big.tsq").write_bytes(b"\x30" * 5000)
    status, ctype = post(tsa.url + "tsr", tmp_path / "big.tsq", tmp_path / "r.tsr")
    assert (status, ctype) == (413, "application/timestamp-reply")
    # /tsr takes only queries; POST / with a form is the Zeitgitter protocol, unchanged
    status, _ = post(tsa.url + "tsr", tmp_path / "big.tsq", tmp_path / "r2",
                     ctype="application/x-www-form-urlencoded")
    assert status == 415


def _ask(url: str, body: bytes, ctype: str) -> tuple[int, str]:
    """POST ``body``; (HTTP status, the answer as text)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _stamp_rows(server: Server) -> int:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return int(db.execute("select count(*) from stamps").fetchone()[0])


def _keys(server: Server) -> dict[str, dict[str, Any]]:
    status, body = server.get_json("/v1/keys")
    assert status == 200
    return {k["id"]: k for k in body["keys"]}  # type: ignore[attr-defined]


def test_the_tsa_key_signs_tokens_only(tsa: Server) -> None:
    """Keys are separated by purpose: a stamp request naming the TSA key with key= is refused
    with the usual answer for a key the server cannot use, and nothing is signed or recorded."""
    keys = _keys(tsa)
    tsa_key = keys["openpgp-nistp256"]
    assert tsa_key["purpose"] == "rfc3161" and keys["primary"]["purpose"] == "stamps"
    fpr = tsa_key["fingerprint"]
    before = _stamp_rows(tsa)
    form = "application/x-www-form-urlencoded"
    answers = {
        "zeitgitter tag": _ask(tsa.url, urllib.parse.urlencode({
            "request": "stamp-tag-v1", "commit": "a" * 40, "tagname": "t", "key": fpr}).encode(),
            form),
        "v1 form": _ask(tsa.url + "v1/stamps", urllib.parse.urlencode(
            {"sha256": "b" * 64, "key": fpr}).encode(), form),
        "v1 json": _ask(tsa.url + "v1/stamps", json.dumps(
            {"sha256": "c" * 64, "key": fpr}).encode(), "application/json"),
        "manifest": _ask(f"{tsa.url}v1/manifests?key={fpr}",
                         f"{'d' * 64}  f\n".encode(), "text/plain"),
    }
    for what, (status, text) in answers.items():
        assert status == (406 if what == "zeitgitter tag" else 400), (what, status, text)
        assert fpr in text and "RFC 3161 time-stamp tokens only" in text, (what, text)
    assert _stamp_rows(tsa) == before
    # the primary key still signs when named
    status, text = _ask(tsa.url + "v1/stamps", urllib.parse.urlencode(
        {"sha256": "e" * 64, "key": keys["primary"]["fingerprint"]}).encode(), form)
    assert status == 200, text


def test_a_tsa_key_is_no_stamping_key_of_either_format(tsa_other: tuple[str, Server]) -> None:
    """Whatever the TSA key (an OpenPGP key, or one in ssh-agent with no other SSH key), it is
    listed for RFC 3161 only: format=ssh finds no SSH key to stamp with, key= naming it is
    refused, and no allowed-signers file names it."""
    spec, server = tsa_other
    keys = _keys(server)
    tsa = [k for k in keys.values() if k["purpose"] == "rfc3161"]
    assert len(tsa) == 1 and tsa[0]["format"] == spec.split(":")[0], keys
    assert tsa[0]["allowed_signers"] is None
    status, text = _ask(server.url + "v1/stamps", urllib.parse.urlencode(
        {"sha256": "f" * 64, "format": "ssh"}).encode(), "application/x-www-form-urlencoded")
    assert status == 400 and "has no ssh key" in text, text
    assert _ask(server.url + "v1/stamps", json.dumps(
        {"sha256": "f" * 64, "key": tsa[0]["fingerprint"]}).encode(),
        "application/json")[0] == 400
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(server.url + "v1/keys/allowed_signers", timeout=10)
    assert caught.value.code == 404


def test_imprints_reach_the_log_and_chain_is_published(tmp_path: Path) -> None:
    data = seed_data_dir(tmp_path / "data")
    server = _server(data, commit_interval=2)
    try:
        (tmp_path / "f").write_bytes(b"logged")
        assert run("openssl", "ts", "-query", "-data", "f", "-sha384", "-out", "q.tsq",
                   cwd=tmp_path).returncode == 0
        assert post(server.url, tmp_path / "q.tsq", tmp_path / "r.tsr")[0] == 200
        line = f"sha384 {hashlib.sha384(b'logged').hexdigest()}"

        def logged() -> bool:
            return any("digests.log" in c.tree and line in c.tree["digests.log"].data.decode()
                       for c in log_commits(data))  # type: ignore[attr-defined]

        wait_for(logged, what="the imprint in digests.log")
        tree = log_commits(data)[-1].tree
        assert tree["tsa"]["chain.pem"].data.decode() == \
            (data / "keys" / "openpgp-nistp256" / "tsa-chain.pem").read_text()  # type: ignore[index]
    finally:
        server.stop()


def stampd(data: Path, *args: str, key: str = "openpgp:nistp256"
           ) -> subprocess.CompletedProcess[str]:
    return run_stampd([*args, "--data-dir", data],
                      env={**os.environ, "STAMPD_TSA": "true", "STAMPD_TSA_KEY": key})


def test_other_keys_tokens_verify_and_reach_the_log(tsa_other: tuple[str, Server],
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`stampd verify` of a token of another kind of key, then against the log, which
    publishes that key's chain; `stampd tsa csr` and `import-cert` for that key (on a copy of
    its key files: the server keeps serving its own chain)."""
    key, server = tsa_other
    (tmp_path / "f").write_bytes(b"verified " + key.encode())
    assert run("openssl", "ts", "-query", "-data", "f", "-sha256", "-cert", "-out", "q.tsq",
               cwd=tmp_path).returncode == 0
    assert post(server.url, tmp_path / "q.tsq", tmp_path / "r.tsr")[0] == 200
    pem = chain(server, tmp_path / "tsa.pem")
    assert cli.main(["verify", str(tmp_path / "r.tsr"), "--data", str(tmp_path / "f"),
                     "--chain", str(pem)]) == 0, capsys.readouterr()
    assert "valid token:" in capsys.readouterr().out
    key_dir = server.data_dir / "keys" / key.replace(":", "-")
    line = f"sha256 {hashlib.sha256(b'verified ' + key.encode()).hexdigest()}"

    def logged() -> bool:
        return any("digests.log" in c.tree and line in c.tree["digests.log"].data.decode()
                   for c in log_commits(server.data_dir))  # type: ignore[attr-defined]

    wait_for(logged, what="the imprint in digests.log")
    tree = log_commits(server.data_dir)[-1].tree
    assert tree["tsa"]["chain.pem"].data.decode() == pem.read_text() == \
        (key_dir / "tsa-chain.pem").read_text()  # type: ignore[index]

    copy = tmp_path / "copy"
    shutil.copytree(server.data_dir / "keys", copy / "keys")
    csr = stampd(copy, "tsa", "csr", key=key)
    assert csr.returncode == 0, csr.stderr
    (tmp_path / "tsa.csr").write_text(csr.stdout)
    assert "verify OK" in run("openssl", "req", "-in", "tsa.csr", "-verify", "-noout",
                              cwd=tmp_path).stderr
    refused = stampd(copy, "tsa", "import-cert", str(tmp_path / "tsa.csr"), key=key)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    done = stampd(copy, "tsa", "import-cert", str(pem), key=key)
    assert done.returncode == 0, done.stderr


def test_a_chain_from_a_ca_is_checked_installed_and_served(tmp_path: Path) -> None:
    """`stampd tsa csr` -> a real CA (openssl) -> `stampd tsa import-cert`; tokens then verify
    against the CA's certificate alone."""
    data = seed_data_dir(tmp_path / "data")
    _server(data).stop()  # the first start makes the TSA key and its self-signed certificate
    csr = stampd(data, "tsa", "csr")
    assert csr.returncode == 0, csr.stderr
    (tmp_path / "tsa.csr").write_text(csr.stdout)
    assert "verify OK" in run("openssl", "req", "-in", "tsa.csr", "-verify", "-noout",
                              cwd=tmp_path).stderr
    assert run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
               "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
               "-subj", "/CN=Test CA", "-days", "2", cwd=tmp_path).returncode == 0
    for name, eku in (("good", "critical,timeStamping"), ("bad", "timeStamping")):
        (tmp_path / f"{name}.ext").write_text(
            f"extendedKeyUsage={eku}\nkeyUsage=critical,digitalSignature\n")
        r = run("openssl", "x509", "-req", "-in", "tsa.csr", "-CA", "ca.pem", "-CAkey",
                "ca.key", "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext",
                "-out", f"{name}.pem", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    (tmp_path / "good-chain.pem").write_text((tmp_path / "good.pem").read_text()
                                             + (tmp_path / "ca.pem").read_text())
    refused = stampd(data, "tsa", "import-cert", str(tmp_path / "bad.pem"))
    assert refused.returncode == 1
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("stampd tsa:")]
    assert "critical" in line and "Traceback" not in refused.stderr
    done = stampd(data, "tsa", "import-cert", str(tmp_path / "good-chain.pem"))
    assert done.returncode == 0, done.stderr
    server = _server(data)
    try:
        (tmp_path / "f").write_bytes(b"issued by a CA")
        assert run("openssl", "ts", "-query", "-data", "f", "-sha256", "-cert", "-out",
                   "q.tsq", cwd=tmp_path).returncode == 0
        assert post(server.url, tmp_path / "q.tsq", tmp_path / "r.tsr")[0] == 200
        assert chain(server, tmp_path / "served.pem").read_text() == \
            (tmp_path / "good-chain.pem").read_text()
    finally:
        server.stop()
    r = run("openssl", "ts", "-verify", "-data", "f", "-in", "r.tsr", "-CAfile", "ca.pem",
            cwd=tmp_path)
    assert "Verification: OK" in r.stdout, r.stdout + r.stderr


def test_the_status_page_shows_the_certificate_and_a_recipe(tsa: Server, tmp_path: Path) -> None:
    r = subprocess.run(["curl", "-sS", "-H", "Accept: text/html", tsa.url], capture_output=True,
                       text=True, timeout=60, check=True)
    der = subprocess.run(["openssl", "x509", "-outform", "DER", "-in",
                          str(chain(tsa, tmp_path / "tsa.pem"))], capture_output=True,
                         timeout=60, check=True).stdout
    assert "RFC 3161 time-stamping" in r.stdout
    assert hashlib.sha256(der).hexdigest() in r.stdout
    assert "openssl ts -verify -data FILE -in FILE.tsr -CAfile tsa.pem" in r.stdout


def test_an_unsynchronised_clock_refuses_tokens_when_required(tmp_path: Path) -> None:
    """STAMPD_TSA_REQUIRE_CLOCK_SYNC: tokens only while the kernel says the clock is
    synchronised. The kernel's answer is read here as the server reads it (the same machine),
    so the test holds whichever it is."""
    from server.stamping.rfc3161 import clock_synchronised

    synced = clock_synchronised()
    assert synced is not None, "adjtimex(2) cannot be asked on this machine"
    data = seed_data_dir(tmp_path / "data")
    server = start_server(data, workers=1, wait=False,
                          extra_env={"STAMPD_TSA": "true", "STAMPD_TSA_REQUIRE_CLOCK_SYNC": "true"})
    try:
        def readiness() -> dict[str, Any]:
            try:
                return server.get_json("/readyz")[1]
            except OSError:  # not listening yet
                return {}

        def ready_but_the_clock() -> bool:
            checks = readiness().get("checks", {})
            return "tsa" in checks and all(c["ok"] for name, c in checks.items()
                                           if name != "clock")

        # every key's worker connected and the certificate served
        wait_for(ready_but_the_clock, timeout=90, what="the server up but for the clock")
        ready = readiness()
        assert ready["checks"]["clock"]["ok"] is synced and ready["ready"] is synced, ready
        (tmp_path / "f").write_bytes(b"clock")
        assert run("openssl", "ts", "-query", "-data", "f", "-sha256", "-out", "q.tsq",
                   cwd=tmp_path).returncode == 0
        status, ctype = post(server.url + "tsr", tmp_path / "q.tsq", tmp_path / "r.tsr")
        text = run("openssl", "ts", "-reply", "-in", "r.tsr", "-text", cwd=tmp_path).stdout
        if synced:
            assert status == 200 and "Status: Granted." in text, text
        else:
            assert (status, ctype) == (503, "application/timestamp-reply")
            assert "Status: Rejected." in text and "clock is not synchronised" in text, text
            assert journal_rows(server) == 0
    finally:
        server.stop()
