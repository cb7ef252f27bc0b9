"""Bad arguments and settings of the server's commands: one line, a documented exit code, no
traceback, and nothing made in the data directory (no key, no database) by a start that fails.

The fuzz runs `stampd.cli.main` in this process on a few thousand generated argument lists;
`test_a_handful_in_subprocesses` runs the issue's examples as the operator would."""

from __future__ import annotations

import os
import random
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stampd.cli import EXIT_FAILED, EXIT_USAGE, main
from tests.helpers import ROOT

DOCUMENTED = {0, EXIT_FAILED, EXIT_USAGE}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No STAMPD_* setting from the caller's environment; the working directory a fresh
    folder (the default data directory ./var would be made there)."""
    for name in list(os.environ):
        if name.startswith("STAMPD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`main`'s exit status (argparse's too) and its stderr."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: usage errors (2), --help (0)
        code = e.code if isinstance(e.code, int) else EXIT_FAILED
    return code, capsys.readouterr().err


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize(("argv", "code", "line"), [
    (["--port", "99999"], EXIT_USAGE,
     "stampd serve: invalid setting: --port: Input should be less than or equal to 65535\n"),
    (["--port", "-1"], EXIT_USAGE,
     "stampd serve: invalid setting: --port: Input should be greater than or equal to 0\n"),
    (["--workers", "-1"], EXIT_USAGE,
     "stampd serve: invalid setting: --workers: Input should be greater than or equal to 0\n"),
    (["--database-url", "mysql://u@h/db"], EXIT_USAGE,
     "stampd serve: invalid setting: --database-url: unsupported database 'mysql': stampd "
     "runs on SQLite or PostgreSQL (sqlite:///PATH or postgresql://USER@HOST/NAME)\n"),
    (["--database-url", "postgress://u:secret@h/db"], EXIT_USAGE,
     "stampd serve: invalid setting: --database-url: unsupported database 'postgress': "
     "stampd runs on SQLite or PostgreSQL (sqlite:///PATH or postgresql://USER@HOST/NAME); "
     "did you mean postgresql://?\n"),
    (["--database-url", "postgresql+psycopg2://u@h/db"], EXIT_USAGE,
     "stampd serve: invalid setting: --database-url: unsupported driver 'psycopg2': stampd "
     "uses postgresql+psycopg:// (or just postgresql://)\n"),
])
def test_a_bad_option_is_one_line_naming_it(
        clean_env: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
        line: str) -> None:
    data = clean_env / "d"
    assert run(["serve", "--data-dir", str(data), *argv], capsys) == (code, line)
    assert not data.exists()


def test_a_bad_variable_is_named_as_a_variable(
        clean_env: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAMPD_WORKERS", "-2")
    assert run(["serve"], capsys) == (EXIT_USAGE, "stampd serve: invalid setting: "
                                      "STAMPD_WORKERS: Input should be greater than or equal "
                                      "to 0\n")
    monkeypatch.setenv("STAMPD_LOG_LEVEL", "loud")
    assert run(["keys", "show"], capsys) == (EXIT_USAGE, "stampd keys: invalid setting: "
                                             "STAMPD_LOG_LEVEL: 'loud' is not one of DEBUG, "
                                             "INFO, WARNING, ERROR, CRITICAL\n")
    assert tree(clean_env) == []


def test_bad_log_settings_are_one_line(
        clean_env: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = clean_env / "d"
    monkeypatch.setenv("STAMPD_TLOG_ORIGIN", "my log")
    assert run(["serve", "--data-dir", str(data)], capsys) == (
        EXIT_USAGE, "stampd serve: invalid setting: STAMPD_TLOG_ORIGIN: tlog_origin must be a "
        "note key name: no white space, no '+', no control character\n")
    monkeypatch.delenv("STAMPD_TLOG_ORIGIN")
    monkeypatch.setenv("STAMPD_TLOG", "maybe")
    code, err = run(["worker", "--data-dir", str(data)], capsys)
    assert code == EXIT_USAGE and err.count("\n") == 1
    assert err.startswith("stampd worker: invalid setting: STAMPD_TLOG: ")
    monkeypatch.delenv("STAMPD_TLOG")
    code, err = run(["serve", "--data-dir", str(data), "--own-url", "http://x/a+b"], capsys)
    assert code == EXIT_USAGE and err.count("\n") == 1 and "set STAMPD_TLOG_ORIGIN" in err
    assert not data.exists()


def test_a_failed_start_leaves_the_data_dir_as_it_was(
        clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing is made before every check passed: an absent data directory stays absent, an
    existing one unchanged (no key generated before the database URL was found wrong). `serve`
    listens on port 0 (any free port): the default 8080 may be taken, by a `make serve` beside
    the tests, and would then be refused first."""
    absent = clean_env / "absent"
    existing = clean_env / "existing"
    (existing / "keep").mkdir(parents=True)
    with socket.socket() as closed:  # a port nothing listens on: PostgreSQL is not there
        closed.bind(("127.0.0.1", 0))
        dead_pg = f"postgresql://stampd@127.0.0.1:{closed.getsockname()[1]}/stampd"
    for url, code in (("postgress://u@h/db", EXIT_USAGE), ("mysql://u@h/db", EXIT_USAGE),
                      (f"sqlite:///{clean_env}/no/such/folder/j.sqlite3", EXIT_USAGE),
                      (dead_pg, EXIT_FAILED)):
        for data in (absent, existing):
            for command in (["serve", "--port", "0"], ["worker"]):
                got, err = run([*command, "--data-dir", str(data), "--database-url", url],
                               capsys)
                assert (got, err.count("\n")) == (code, 1), err
                assert "Traceback" not in err
        assert not absent.exists()
        assert tree(existing) == ["keep"]


# -- the fuzz ---------------------------------------------------------------------------------

# Values that are wrong for every command that takes the option, found before anything is made.
POISON = [
    ["--port", "99999"], ["--port", "-1"], ["--port", "abc"], ["--port", ""], ["--port", "1e3"],
    ["--port", "65536"], ["--workers", "-1"], ["--workers", "x"], ["--workers", "1.5"],
    ["--api-processes", "-3"], ["--api-processes", "65"], ["--api-processes", "many"],
    ["--commit-interval", "0"], ["--commit-interval", "-1"], ["--commit-interval", "nan"],
    ["--commit-interval", "x"], ["--database-url", "mysql://u@h/db"],
    ["--database-url", "postgress://h/x"], ["--database-url", "nonsense"],
    ["--database-url", ""], ["--database-url", "sqlite"], ["--database-url", "://"],
    ["--database-url", "postgresql+psycopg2://h/x"], ["--database-url", "postgresql://u@h:x/d"],
    ["--database-url", "sqlite+foo:///x"], ["--database-url", "oracle://h/\u00e9"],
    ["--peers", "bad peer"], ["--peers", "a=ftp://x"], ["--peers", "A=http://x"],
    ["--peers", "a=http://x,a=http://y"], ["--prot", "8080"], ["--wrokers", "2"], ["-x"],
    ["--data-dir"], ["--port"], ["--database-url"], ["--no-workers=yes"], ["--", "extra"],
    ["--key-uid", "no email"], ["--key-uid", "caf\u00e9 <a@b>"],
]
ODD = ["", " ", "-", "--", "~", "..", "\u00e9\u00e8", "\u202e", "a\nb", "x" * 300, "%s%n",
       "'; DROP TABLE stamps; --", "${HOME}", "*", "\\", "0", "-1", "1e309", "inf", "nan",
       "9" * 30, "0x10", "\U0001f600", "NUL", "/dev/null", "http://x", "sqlite:///x"]
FILLERS = ["--host", "--port", "--workers", "--api-processes", "--commit-interval",
           "--own-url", "--peers", "--database-url", "--data-dir", "--log-level", "--help"]
COMMANDS = [["serve"], ["serve", "--no-workers"], ["worker"], ["db", "upgrade"], ["db", "check"],
            ["db", "downgrade"], ["keys", "show"], ["keys", "generate"], ["keys", "register"],
            ["keys", "import"], ["keys", "export-public"], ["tsa", "csr"], ["tsa", "import-cert"],
            ["tsa"], ["db"], ["keys"], []]


def fuzzed(rng: random.Random, command: list[str], data: Path) -> list[str]:
    """One poisoned argument list for ``command``: options in any order, odd values, and at
    least one value that is wrong (so that nothing may start or be made)."""
    args: list[str] = ["--data-dir", str(data)] if rng.random() < 0.7 else []
    for _ in range(rng.randrange(0, 4)):
        option = rng.choice(FILLERS)
        if option == "--help":
            continue  # (exits 0: covered once below)
        args += [option, rng.choice(ODD)] if rng.random() < 0.9 else [option]
    poison = rng.choice(POISON)
    at = rng.randrange(0, len(args) + 1)
    args[at:at] = poison
    if rng.random() < 0.3:
        args.insert(rng.randrange(0, len(args) + 1), rng.choice(ODD))  # a stray positional
    top = ["--log-level", rng.choice(["debug", "INFO", "x"])] if rng.random() < 0.1 else []
    return [*top, *command, *args]


# Generated argument lists per command (seeded): 680 in all, a few seconds.
PER_COMMAND = 40


def test_fuzz_the_command_line(clean_env: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generated argument list ends in a documented exit status without a traceback,
    and none gets as far as serving, running workers or touching the data directory."""
    import server.commands.serve
    import server.commands.worker

    def tripwire(*_args: object) -> int:
        raise AssertionError("a poisoned argument list got past the checks")

    monkeypatch.setattr(server.commands.serve, "_serve", tripwire)
    monkeypatch.setattr(server.commands.worker, "_work", tripwire)
    data = clean_env / "d"
    (data / "keep").mkdir(parents=True)
    rng = random.Random(20240611)
    ran = 0
    for command in COMMANDS:
        for _ in range(PER_COMMAND):
            argv = fuzzed(rng, command, data)
            code, err = run(argv, capsys)
            assert code in DOCUMENTED - {0}, (argv, code, err)
            assert "Traceback" not in err, (argv, err)
            if not err.startswith("usage:"):  # (argparse: usage lines, then one error line)
                assert err.count("\n") == 1, (argv, err)
            ran += 1
        if command[:1] in (["serve"], ["worker"]):  # (db may make an empty journal)
            assert tree(data) == ["keep"], command
            assert sorted(p.name for p in clean_env.iterdir()) == ["d"], command
        assert not (data / "keys").exists() and not (clean_env / "var/keys").exists()
    assert ran == PER_COMMAND * len(COMMANDS)
    assert run(["serve", "--help"], capsys)[0] == 0


def test_odd_listen_addresses_are_one_line(clean_env: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = clean_env / "d"
    for host in ("\u00fcn\u00ef\u20ac", "a:b:c", "999.1.1.1", "no-such-host.invalid", "-",
                 "x" * 300, "http://x", "localhost ", "[::1]"):
        code, err = run(["serve", "--data-dir", str(data), "--host", host], capsys)
        assert (code, err.count("\n")) == (EXIT_FAILED, 1), (host, err)
        assert err.startswith(f"stampd serve: cannot listen on {host}:8080: "), err
    assert not data.exists()


def test_a_handful_in_subprocesses(tmp_path: Path) -> None:
    """The issue's examples, as `python -m stampd`: one line on stderr, exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAMPD_")}
    env["PYTHONPATH"] = str(ROOT)
    data = tmp_path / "d"
    for args, needle in ((["--port", "99999"], "--port"),
                         (["--database-url", "mysql://u@h/db"], "SQLite or PostgreSQL"),
                         (["--workers", "-1"], "--workers:"),
                         (["--database-url", "postgress://u@h/db"], "did you mean")):
        r = subprocess.run([sys.executable, "-m", "stampd", "serve", "--data-dir", str(data),
                            *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=env, check=False)
        assert r.returncode == EXIT_USAGE, r.stderr
        assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
        assert not data.exists()


@pytest.mark.parametrize(("argv", "prog"), [
    (["serve", "--prot", "1"], "stampd serve"), (["keys", "show", "--sssh"], "stampd keys show"),
    (["db", "upgrade", "head", "--bogus"], "stampd db upgrade"),
])
def test_a_typo_shows_the_usage_of_its_command(
        clean_env: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        prog: str) -> None:
    code, err = run(argv, capsys)
    assert code == EXIT_USAGE
    assert err.startswith(f"usage: {prog} [-h]"), err
    unknown = " ".join(argv[1:]) if argv[0] == "serve" else argv[-1]
    assert err.endswith(f"{prog}: error: unrecognized arguments: {unknown}\n"), err


@pytest.mark.parametrize("argv", [
    ["serve", "--port", "0"], ["serve", "--port", "0", "--no-workers"], ["worker"],
    ["db", "upgrade"],
])
def test_a_new_data_dir_is_private(clean_env: Path, monkeypatch: pytest.MonkeyPatch,
                                   argv: list[str]) -> None:
    """The data directory holds the secret keys, the journal and the workers' homes: a command
    that makes it makes it 0700, whatever the umask (serving and working themselves are left
    out here: the directory is made before them)."""
    import server.commands.serve
    import server.commands.worker

    monkeypatch.setattr(server.commands.serve, "_serve", lambda *_args: 0)
    monkeypatch.setattr(server.commands.worker, "_work", lambda *_args: 0)
    data = clean_env / "new" / "data"
    old = os.umask(0o022)
    try:
        assert main([*argv, "--data-dir", str(data)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE(data.parent.stat().st_mode) == 0o755  # (only the data directory)
