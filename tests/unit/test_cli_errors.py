"""One error-to-exit-code path for every command: one line, a documented code, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from client.errors import CommandError
from keystore.store import KeyStoreError
from server.errors import QueueFull
from server.settings import Settings
from stampd.cli import EXIT_FAILED, EXIT_USAGE, exit_status, main
from tests.helpers import ROOT


class Malformed(CommandError):
    exit_code = 2
    kind = "malformed"


def test_exit_status_of_each_error_family() -> None:
    with pytest.raises(ValidationError) as bad:
        Settings(key_uid="no email", peers="bad peer")
    code, message = exit_status(bad.value) or (0, "")
    assert code == EXIT_USAGE and "\n" not in message and "STAMPD_KEY_UID" in message
    assert exit_status(Malformed("two\nlines")) == (2, "malformed: two lines")
    assert exit_status(CommandError("plain")) == (EXIT_FAILED, "plain")
    assert exit_status(QueueFull("busy")) == (EXIT_FAILED, "busy")
    assert exit_status(KeyStoreError("no key")) == (EXIT_FAILED, "no key")
    assert exit_status(FileNotFoundError(2, "No such file", "/x")) == (
        EXIT_FAILED, "No such file: /x")
    assert exit_status(ZeroDivisionError()) is None  # a bug keeps its traceback
    from sqlalchemy.exc import IntegrityError, OperationalError

    down = OperationalError("SELECT 1", {}, Exception("connection refused\nmore"))
    assert exit_status(down) == (EXIT_FAILED, "database unavailable: connection refused")
    refused = IntegrityError("ALTER", {}, Exception('column "commit" contains null values'))
    assert exit_status(refused) == (EXIT_FAILED,
                                    'database error: column "commit" contains null values')


def test_main_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                              ) -> None:
    assert main(["keys", "--data-dir", str(tmp_path), "show"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("stampd keys: no public key at ") and err.count("\n") == 1


def test_options_work_before_and_after_the_subcommand(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["keys", "show", "--data-dir", str(tmp_path)],
                 ["keys", "--data-dir", str(tmp_path), "show"]):
        assert main(argv) == EXIT_FAILED
        assert capsys.readouterr().err == (
            f"stampd keys: no public key at {tmp_path}/keys/pubkey.asc\n")


def test_database_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert main(["db", "check", "--data-dir", str(tmp_path)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not up to date" in err and "stampd db upgrade" in err
    assert main(["db", "--database-url", "nonsense://x", "check"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("stampd db: invalid setting: --database-url: unsupported database "
                          "'nonsense'") and err.count("\n") == 1
    assert main(["db", "upgrade", "--data-dir", str(tmp_path)]) == 0
    assert main(["db", "check", "--data-dir", str(tmp_path)]) == 0
    import sqlite3

    with sqlite3.connect(tmp_path / "stampd.sqlite3") as conn:  # as a later release leaves it
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    capsys.readouterr()
    assert main(["db", "upgrade", "--data-dir", str(tmp_path)]) == EXIT_FAILED
    assert capsys.readouterr().err == ("stampd db: database: Can't locate revision identified by "
                                       "'9999' (a newer stampd migrated it: run that release)\n")


def test_postgres_urls_mean_psycopg() -> None:
    for url in ("postgres://u@h/db", "postgresql://u@h/db", "postgresql+psycopg://u@h/db"):
        assert Settings(database_url=url).db_url == "postgresql+psycopg://u@h/db"


def test_help_is_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "timestamping server" in out and "Only this module" not in out


def test_serve_on_a_busy_port_is_one_line_and_prepares_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["serve", "--port", str(port), "--data-dir", str(tmp_path / "d")])
    assert code == EXIT_FAILED
    err = capsys.readouterr().err
    assert err == (f"stampd serve: cannot listen on 127.0.0.1:{port}: Address already in use "
                   "(set --port/STAMPD_PORT or --host/STAMPD_HOST)\n")
    assert not (tmp_path / "d").exists()  # no key generated, no database made


def test_a_downgrade_that_would_lose_stamps_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Below revision 0002 every stamp has a commit id: with a digest stamp in the journal the
    downgrade is refused (one line, exit 1) and the schema is left as it was."""
    import sqlite3

    from server import db

    assert main(["db", "upgrade", "--data-dir", str(tmp_path)]) == 0
    with sqlite3.connect(tmp_path / "stampd.sqlite3") as conn:
        conn.execute("INSERT INTO stamps (kind, algorithm, digest, stamped_at, state, attempts)"
                     " VALUES ('digest', 'sha256', ?, 1, 'pending', 0)", ("ab" * 32,))
    capsys.readouterr()
    assert main(["db", "downgrade", "0001", "--data-dir", str(tmp_path)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err == ("stampd db: database: cannot downgrade below 0002: the journal holds 1 "
                   "stamps without a commit id (digest, manifest or RFC 3161 stamps)\n")
    engine = db.make_engine(f"sqlite:///{tmp_path / 'stampd.sqlite3'}")
    try:
        assert db.current_revision(engine) == db.SCHEMA_HEAD
    finally:
        engine.dispose()


def test_client_commands_leave_the_server_unimported(tmp_path: Path) -> None:
    """`stampd verify`, `audit`, `stamp` and `hook` (client commands, run on users' machines
    and by the tests as subprocesses) do not import `server.commands` and its settings: ~0.3 s
    of CPU each. Their errors keep their exit codes; a server command still imports it."""
    not_a_receipt = tmp_path / "x.txt"
    not_a_receipt.write_text("hello\n")
    code = (
        "import sys\n"
        "from stampd.cli import main\n"
        "def server():\n"
        "    return any(m in sys.modules for m in ('server.commands', 'server.settings'))\n"
        "print(main(['verify', sys.argv[1]]), server())\n"
        "print(main(['--log-level', 'WARNING', 'audit', sys.argv[2]]), server())\n"
        "print(main(['--log-level=warning', 'hook', 'uninstall', '--repo', sys.argv[2]]), "
        "server())\n"
        "import contextlib, io\n"
        "try:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(['keys', '--help'])\n"
        "except SystemExit as e:\n"
        "    print(e.code, server())\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(not_a_receipt), str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 4, r.stdout + r.stderr
    assert lines[0] == "2 False", r.stderr  # (malformed: `stampd verify` exits 2)
    assert lines[1].split()[1] == "False" and lines[1].split()[0] != "0", r.stderr
    assert lines[2].split()[1] == "False" and lines[2].split()[0] != "0", r.stderr
    assert lines[3] == "0 True"
    assert all(line.startswith(("stampd verify: ", "stampd audit: ", "stampd hook uninstall: "))
               for line in r.stderr.splitlines()), r.stderr


def test_a_missing_role_or_database_names_the_command_that_makes_it(
        pg_admin_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    host = pg_admin_url.split("@", 1)[1].rsplit("/", 1)[0]
    no_role = f"postgresql://stampd_no_such_role@{host}/postgres"
    assert main(["db", "--database-url", no_role, "check"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert 'role "stampd_no_such_role" does not exist' in err and err.count("\n") == 1, err
    assert "createuser" in err and "createdb" not in err, err
    no_db = f"postgresql://postgres@{host}/stampd_no_such_db"
    assert main(["db", "--database-url", no_db, "check"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert 'database "stampd_no_such_db" does not exist' in err and "createdb" in err, err


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_help_of_the_server_commands_shows_each_settings_default(
        command: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An option that sets STAMPD_<NAME> says its default (the embedded one; the variable
    overrides it)."""
    import re

    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    options = [line for line in out.splitlines() if re.search(r"\(STAMPD_[A-Z_]+", line)]
    assert len(options) >= 3, out
    for line in options:
        assert "default" in line, line
    assert re.search(r"--data-dir .*\(STAMPD_DATA_DIR; default: \./var\)", out), out
    assert re.search(r"--workers .*default: 0, one per CPU", out), out
    if command == "serve":
        assert re.search(r"--port .*\(STAMPD_PORT; default: 8080\)", out), out
        assert re.search(r"--host .*\(STAMPD_HOST; default: 127\.0\.0\.1\)", out), out
        assert re.search(r"--commit-interval COMMIT_INTERVAL\s+seconds between log commits "
                         r"\(STAMPD_COMMIT_INTERVAL; default: 3600\)", out), out


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"stampd {version('stampd')}\n"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["serve", "--help"],
                                  ["verify", "--help"], ["keys", "show"]])
def test_a_closed_stdout_ends_the_command_quietly(argv: list[str], tmp_path: Path) -> None:
    """`stampd keys show | head -1`: when the reader is gone, the command exits as Unix tools
    do, quietly (141, as the shell shows a tool that SIGPIPE ended), not with "Broken pipe"."""
    import os

    from tests.helpers import seed_data_dir

    if argv[0] == "keys":
        argv = ["keys", "--data-dir", str(seed_data_dir(tmp_path / "d")), "show"]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        r = subprocess.run([sys.executable, "-m", "stampd", *argv], cwd=ROOT, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, ""), r.stderr


def _tls_server(tmp_path: Path) -> tuple[str, object]:
    """An https server on loopback with a self-signed certificate (trusted by nobody)."""
    import datetime as dt
    import http.server
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = tmp_path / "tls.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            http.server.BaseHTTPRequestHandler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"https://127.0.0.1:{httpd.server_address[1]}", httpd


def test_tls_failures_are_one_line_saying_what_is_wrong(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """https:// against an http:// server, and a certificate nobody trusts: one line that
    says so (and which URL to give), never OpenSSL's or GnuTLS's words."""
    from tests.helpers import RoutesServer, make_repo

    plain = RoutesServer({})
    tls, httpd = _tls_server(tmp_path)
    repo = make_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("a\n")
    monkeypatch.chdir(repo)
    try:
        address = plain.url.removeprefix("http://")
        wrong = f"https://{address}"
        for argv, code in ((["stamp", "a.txt", "--server", wrong], 1),
                           (["hook", "install", "--server", wrong], 1),
                           (["audit", f"{wrong}/log.git", "--no-tlog"], 2)):
            assert main(argv) == code, argv
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert f"{address} does not speak TLS; use http://{address}" in err, err
            assert "SSL" not in err and "gnutls" not in err and "_ssl.c" not in err, err
        untrusted = tls.removeprefix("https://")
        for argv, code in ((["stamp", "a.txt", "--server", tls], 1),
                           (["audit", f"{tls}/log.git", "--no-tlog"], 2)):
            assert main(argv) == code, argv
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert f"the TLS certificate of {untrusted} is not trusted" in err, err
            assert "SSL:" not in err and "gnutls" not in err and "_ssl.c" not in err, err
    finally:
        plain.close()
        httpd.shutdown()  # type: ignore[attr-defined]
        httpd.server_close()  # type: ignore[attr-defined]
