"""`stampd verify` of RFC 3161 tokens: from a live stampd TSA (queries made with the real
`openssl ts -query` and curl), and from TSAs that `openssl ts -reply` runs (another TSA's
self-signed certificate; an RSA TSA certified by a CA), checked offline and against a clone of
the server's log.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stampd import cli
from tests.helpers import (
    Server,
    log_commits,
    run_stampd,
    seed_data_dir,
    start_server,
    wait_for,
)

TSQ = "application/timestamp-query"


@pytest.fixture(autouse=True, scope="module")
def _tools() -> None:
    missing = [t for t in ("openssl", "curl", "git", "gpg") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"required tools missing: {', '.join(missing)}")


@pytest.fixture(scope="module")
def tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(seed_data_dir(tmp_path_factory.mktemp("tsa-verify") / "data"),
                          workers=1, commit_interval=2, extra_env={"STAMPD_TSA": "true"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tsa_pem(tsa: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chain") / "tsa.pem"
    r = subprocess.run(["curl", "-sS", "-f", "-o", str(path), tsa.url + "tsa.pem"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stdout}{r.stderr}"
    return r


def stamp(server: Server, data: Path, *, cert: bool = True, alg: str = "sha256") -> Path:
    """`openssl ts -query` for ``data``, POSTed with curl; the response saved as ``.tsr``."""
    query, answer = data.with_suffix(".tsq"), data.with_suffix(".tsr")
    run("openssl", "ts", "-query", "-data", str(data), f"-{alg}",
        *(["-cert"] if cert else []), "-out", str(query), cwd=data.parent)
    r = subprocess.run(["curl", "-sS", "-f", "-o", str(answer), "-H", f"Content-Type: {TSQ}",
                        "--data-binary", f"@{query}", server.url],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return answer


def verify(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """`stampd verify ARGS` in-process: (exit status, stdout, stderr)."""
    code = cli.main(["verify", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def error_line(err: str) -> str:
    (line,) = [ln for ln in err.splitlines() if ln.startswith("stampd verify: ")]
    assert "Traceback" not in err
    return line


def field(out: str, label: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"{label}:")]
    return line[len(label) + 1:].strip()


def test_a_token_with_its_certificate_verifies_against_the_chain(
        tsa: Server, tsa_pem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "report.pdf"
    data.write_bytes(os.urandom(3000))
    tsr = stamp(tsa, data)
    code, out, err = verify(capsys, tsr, "--data", data, "--chain", tsa_pem)
    assert code == 0, err
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    assert field(out, "valid token") == f"sha256 {digest} (a TimeStampResp)"
    assert field(out, "matches") == f"file {data}"
    assert field(out, "policy") == "2.25.178387009458913539541377305212843591845"
    assert field(out, "tsa") == f"CN=stampd TSA at {tsa.url}, O=stampd"
    assert field(out, "signature").startswith("sha256_ecdsa, certificate sha256 ")
    assert field(out, "signature").endswith("(from the token)")
    assert field(out, "certificate") == f"in --chain {tsa_pem}"
    # what openssl prints for the same token
    text = run("openssl", "ts", "-reply", "-in", str(tsr), "-text", cwd=tmp_path).stdout
    serial = int(text.split("Serial number: ")[1].split()[0], 16)
    assert field(out, "serial") == str(serial)
    time_line = field(out, "time")
    assert time_line.endswith(", accuracy 1 s") and "Z (" in time_line

    # without --chain: the signature is checked with the token's own certificate, which is
    # anchored nowhere: not shown valid (exit 1, "cannot check"), but the report is printed
    code, out, err = verify(capsys, tsr, "--data", data)
    assert code == 1
    assert error_line(err).startswith("stampd verify: cannot check: the token verifies with its "
                                      "own certificate")
    assert field(out, "token") == f"sha256 {digest} (a TimeStampResp)"
    assert field(out, "certificate").startswith("NOT ANCHORED")


def test_a_token_without_certificate_needs_the_chain(
        tsa: Server, tsa_pem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "f.bin"
    data.write_bytes(b"certReq false")
    tsr = stamp(tsa, data, cert=False, alg="sha512")
    code, out, err = verify(capsys, tsr, "--data", data, "--chain", tsa_pem)
    assert code == 0, err
    assert field(out, "signature").endswith(f"(from --chain {tsa_pem})")
    digest = hashlib.sha512(b"certReq false").hexdigest()
    code, out, err = verify(capsys, tsr, "--digest", digest.upper(), "--chain", tsa_pem)
    assert code == 0, err
    assert field(out, "matches") == "the given digest"

    code, out, err = verify(capsys, tsr, "--data", data)
    assert (code, out) == (1, "")
    assert "cannot check: the token holds no certificate" in error_line(err)
    code, _, err = verify(capsys, tsr, "--digest", hashlib.sha256(b"x").hexdigest(), "--chain",
                          tsa_pem)
    assert code == 1 and "invalid: the token's imprint is sha512" in error_line(err)
    code, _, err = verify(capsys, tsr, "--digest", "not hex", "--chain", tsa_pem)
    assert code == 2 and "malformed: --digest must be hex digits" in error_line(err)


def test_tampered_data_or_token_is_invalid(
        tsa: Server, tsa_pem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "contract.txt"
    data.write_bytes(b"pay 100\n")
    tsr = stamp(tsa, data)
    data.write_bytes(b"pay 900\n")
    code, out, err = verify(capsys, tsr, "--data", data, "--chain", tsa_pem)
    assert (code, out) == (1, "")
    assert error_line(err).startswith(f"stampd verify: invalid: sha256 of {data} is ")

    # one bit of the signed TSTInfo changed (in the imprint): the messageDigest no longer fits
    digest = hashlib.sha256(b"pay 100\n").digest()
    raw = tsr.read_bytes()
    assert raw.count(digest) == 1
    at = raw.index(digest)
    forged = tmp_path / "forged.tsr"
    forged.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    code, _, err = verify(capsys, forged, "--chain", tsa_pem)
    assert code == 1 and "invalid: the messageDigest attribute is not the sha256 of the " \
        "TSTInfo" in error_line(err)


@dataclass(frozen=True)
class OpensslTsa:
    """A TSA run by `openssl ts -reply`: its directory, config and trust anchor."""

    dir: Path
    config: Path
    anchor: Path  # what to give --chain

    def reply(self, query: Path, out: Path, *, token_only: bool = False) -> Path:
        run("openssl", "ts", "-reply", "-config", str(self.config), "-queryfile", str(query),
            *(["-token_out"] if token_only else []), "-out", str(out), cwd=self.dir)
        return out


def openssl_tsa(path: Path, *, ca: bool) -> OpensslTsa:
    """A TSA certificate with the critical timeStamping EKU: self-signed (EC P-256), or (with
    ``ca``) an RSA-2048 one issued by a test CA (EC P-256)."""
    path.mkdir()
    ext = ("[tsa]\nextendedKeyUsage=critical,timeStamping\nkeyUsage=critical,digitalSignature\n"
           "basicConstraints=CA:FALSE\n")
    (path / "ext.cnf").write_text(ext)
    if ca:
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=Test CA", "-days", "2",
            cwd=path)
        run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "tsa.key",
            "-out", "tsa.csr", "-subj", "/CN=Test RSA TSA", cwd=path)
        run("openssl", "x509", "-req", "-in", "tsa.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", "ext.cnf", "-extensions", "tsa",
            "-out", "tsa.pem", cwd=path)
    else:
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", "tsa.key", "-out", "tsa.pem", "-subj", "/CN=Another TSA",
            "-days", "2", "-addext", "extendedKeyUsage=critical,timeStamping", cwd=path)
    (path / "serial").write_text("01\n")
    config = path / "tsa.cnf"
    config.write_text(f"""[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
dir = {path}
serial = {path}/serial
crypto_device = builtin
signer_cert = {path}/tsa.pem
{f"certs = {path}/ca.pem" if ca else ""}
signer_key = {path}/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
""")
    return OpensslTsa(path, config, path / ("ca.pem" if ca else "tsa.pem"))


def test_another_tsas_tokens_and_chains_are_invalid(
        tsa: Server, tsa_pem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = openssl_tsa(tmp_path / "other", ca=False)
    data = tmp_path / "f"
    data.write_bytes(b"stamped twice")
    ours = stamp(tsa, data)
    theirs = other.reply(data.with_suffix(".tsq"), tmp_path / "theirs.tsr")
    # each against its own chain: valid (openssl's token is an outside TSA's, in the same format)
    assert verify(capsys, ours, "--data", data, "--chain", tsa_pem)[0] == 0
    code, out, err = verify(capsys, theirs, "--data", data, "--chain", other.anchor)
    assert code == 0, err
    assert field(out, "tsa") == "CN=Another TSA" and field(out, "policy") == "1.2.3.4.1"
    # crossed: invalid
    code, out, err = verify(capsys, ours, "--data", data, "--chain", other.anchor)
    assert (code, out) == (1, "")
    assert "invalid: the signer certificate (" in error_line(err)
    assert f"does not chain to a certificate in {other.anchor}" in error_line(err)
    code, out, err = verify(capsys, theirs, "--data", data, "--chain", tsa_pem)
    assert (code, out) == (1, "")
    assert "does not chain to a certificate in" in error_line(err)
    # a token without certificate, checked against another TSA's chain
    bare = stamp(tsa, data, cert=False)
    code, _, err = verify(capsys, bare, "--data", data, "--chain", other.anchor)
    assert code == 1
    assert "invalid: the signer certificate is not in the token or" in error_line(err)


def test_a_ca_issued_rsa_tsa_and_a_bare_token(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The TSA certificate is issued by a CA: --chain holds only the CA's certificate, and
    the link TSA <- CA is checked. A bare token (ContentInfo) is told from a response."""
    ca_tsa = openssl_tsa(tmp_path / "ca-tsa", ca=True)
    data = tmp_path / "f"
    data.write_bytes(b"certified")
    run("openssl", "ts", "-query", "-data", str(data), "-sha384", "-cert", "-out", "q.tsq",
        cwd=tmp_path)
    token = ca_tsa.reply(tmp_path / "q.tsq", tmp_path / "token.der", token_only=True)
    code, out, err = verify(capsys, token, "--data", data, "--chain", ca_tsa.anchor)
    assert code == 0, err
    assert field(out, "valid token").endswith("(a bare token)")
    assert field(out, "certificate") == (f"CN=Test RSA TSA <- CN=Test CA; CN=Test CA is in "
                                         f"--chain {ca_tsa.anchor}")
    assert "rsa" in field(out, "signature")
    # a CA certificate that did not issue it
    stranger = openssl_tsa(tmp_path / "stranger", ca=True)
    code, _, err = verify(capsys, token, "--data", data, "--chain", stranger.anchor)
    assert code == 1 and "invalid: the certificate CN=Test RSA TSA does not verify with the " \
        "key of its issuer CN=Test CA" in error_line(err)


def test_what_is_no_token_is_malformed(
        tsa: Server, tsa_pem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "garbage.tsr"
    garbage.write_bytes(os.urandom(500).replace(b"\x30", b"\x31"))
    code, out, err = verify(capsys, garbage, "--chain", tsa_pem)
    assert (code, out) == (2, "")
    assert error_line(err).startswith("stampd verify: malformed: not DER")
    # DER, but a query rather than a token
    data = tmp_path / "f"
    data.write_bytes(b"q")
    run("openssl", "ts", "-query", "-data", str(data), "-sha256", "-out", "q.tsq", cwd=tmp_path)
    code, _, err = verify(capsys, tmp_path / "q.tsq")
    assert code == 2 and "malformed: neither a TimeStampResp nor a token" in error_line(err)
    # a rejection holds no token
    run("openssl", "ts", "-query", "-data", str(data), "-sha1", "-out", "sha1.tsq", cwd=tmp_path)
    r = subprocess.run(["curl", "-sS", "-f", "-o", str(tmp_path / "no.tsr"), "-H",
                        f"Content-Type: {TSQ}", "--data-binary", f"@{tmp_path / 'sha1.tsq'}",
                        tsa.url], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    code, _, err = verify(capsys, tmp_path / "no.tsr", "--chain", tsa_pem)
    assert code == 2 and "malformed: the TSA refused the request: status rejection " \
        "(failInfo bad_alg)" in error_line(err)
    # --chain or --log with a receipt, --key with a token
    receipt = tmp_path / "r.receipt"
    receipt.write_text("not a receipt\n")
    code, _, err = verify(capsys, receipt, "--chain", tsa_pem)
    assert code == 2 and "--chain applies to RFC 3161 tokens" in error_line(err)
    tsr = stamp(tsa, data)
    code, _, err = verify(capsys, tsr, "--key", tsa_pem)
    assert code == 2 and "--key is for receipts" in error_line(err)


def test_the_log_names_the_commit_that_publishes_the_imprint(
        tsa: Server, tsa_pem: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "logged.bin"
    data.write_bytes(os.urandom(100))
    tsr = stamp(tsa, data, alg="sha384")
    line = f"sha384 {hashlib.sha384(data.read_bytes()).hexdigest()}"

    def publishing() -> list[str]:
        return [str(c.id) for c in log_commits(tsa.data_dir)
                if "digests.log" in c.tree
                and line in c.tree["digests.log"].data.decode()]  # type: ignore[attr-defined]

    wait_for(publishing, timeout=60, what="the imprint in digests.log")
    (commit,) = publishing()
    clone = tmp_path / "log"
    run("git", "clone", "-q", tsa.url + "log.git", str(clone), cwd=tmp_path)

    code, out, err = verify(capsys, tsr, "--data", data, "--chain", tsa_pem, "--log", clone)
    assert code == 0, err
    assert field(out, "log commit").startswith(f"{commit} (log commit ")
    assert "s after genTime" in field(out, "log commit")
    assert field(out, "log").startswith(f"{clone}, signed by ")
    assert field(out, "peer stamp") == "none yet"
    # the log's URL: cloned into a temporary directory, the same answer
    code, out, err = verify(capsys, tsr, "--chain", tsa_pem, "--log", tsa.url + "log.git")
    assert code == 0, err
    assert field(out, "log commit").startswith(commit)

    # a token newer than the clone: valid, but not in that log (yet): exit 3
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(os.urandom(100))
    new = stamp(tsa, fresh)
    code, out, err = verify(capsys, new, "--data", fresh, "--chain", tsa_pem, "--log", clone)
    assert code == 3
    assert field(out, "valid token").startswith("sha256 ")
    assert error_line(err).startswith(
        "stampd verify: not in the log yet: sha256 "
        f"{hashlib.sha256(fresh.read_bytes()).hexdigest()} is in no digests.log of {clone}")
    # a directory that is no log: malformed
    code, _, err = verify(capsys, tsr, "--chain", tsa_pem, "--log", tmp_path)
    assert code == 2 and "malformed: --log: " in error_line(err)


def test_the_stampd_command_exit_status(
        tsa: Server, tsa_pem: Path, tmp_path: Path) -> None:
    """The real command line, as a user runs it: exit status and the one line on stderr."""
    data = tmp_path / "f"
    data.write_bytes(b"command line")
    tsr = stamp(tsa, data)

    def stampd(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return run_stampd(["verify", *args])

    ok = stampd(tsr, "--data", data, "--chain", tsa_pem)
    assert ok.returncode == 0 and ok.stdout.startswith("valid token:   sha256 "), ok.stderr
    data.write_bytes(b"changed")
    bad = stampd(tsr, "--data", data, "--chain", tsa_pem)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("stampd verify: invalid: ")


def test_the_first_hour_an_empty_log_is_not_in_the_log_yet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new server's log has no commit until the first commit interval (3600 s by default)
    ends: `stampd audit` says there is nothing to check yet (exit 3) and `stampd verify --log`
    that the token is not in the log yet (exit 3), naming the log as given, not a temporary
    clone, and when the log gets commits."""
    server = start_server(seed_data_dir(tmp_path / "data"), workers=1,
                          extra_env={"STAMPD_TSA": "true"})
    try:
        server.wait_ready()
        chain = tmp_path / "tsa.pem"
        run("curl", "-sS", "-f", "-o", str(chain), server.url + "tsa.pem", cwd=tmp_path)
        data = tmp_path / "new.bin"
        data.write_bytes(os.urandom(100))
        tsr = stamp(server, data)
        url = server.url + "log.git"
        clone = tmp_path / "log"
        run("git", "clone", "-q", url, str(clone), cwd=tmp_path)  # git: "an empty repository"
        assert not log_commits(server.data_dir)

        for log in (url, str(clone)):
            code = cli.main(["audit", log])
            err = capsys.readouterr().err
            assert code == 3, err
            (line,) = err.splitlines()
            assert line.startswith(f"stampd audit: {log}: the log has no commit yet, so there "
                                   "is nothing to check yet; ")
            assert "STAMPD_COMMIT_INTERVAL seconds (3600 by default)" in line
            assert "stampd-audit-clone" not in line

            code, out, err = verify(capsys, tsr, "--data", data, "--chain", chain, "--log", log)
            assert code == 3, err
            assert field(out, "valid token").startswith("sha256 ")
            line = error_line(err)
            assert line.startswith(f"stampd verify: not in the log yet: sha256 "
                                   f"{hashlib.sha256(data.read_bytes()).hexdigest()}: the log "
                                   f"{log} has no commit yet (")
            assert "STAMPD_COMMIT_INTERVAL" in line and "stampd-audit-clone" not in line
    finally:
        server.stop()
