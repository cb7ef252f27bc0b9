"""The README's quick start, run as written against a real server.

README.md marks each code block this test runs with a line ``<!-- readme-test: NAME -->``
just before its fence, so that the README and the test cannot drift apart: the test reads the
blocks from README.md and runs their text, in one ``bash`` per block (``set -o pipefail``, so a
failure anywhere in a pipeline counts), a command line at a time. Every command must exit 0,
unless its comment documents another status (``# exit 3 ...``); a comment ``# ... TEXT``
documents a line of its output (``N``, ``S`` standing for numbers). What each block says it
leaves behind (files, a verified signature) is checked after it.

What is not literal, and why:

- ``make serve`` blocks: the test starts what it runs (the Makefile's ``serve`` recipe,
  ``$(BIN)/stampd serve``: the venv's ``stampd serve``) in the background, in a directory
  standing for the clone, so its data is in ``./var`` there as the README says, on the
  embedded defaults but for ``STAMPD_PORT`` (a free port) and ``STAMPD_RUNTIME_DIR`` (a short
  temporary directory, by which the test finds and stops every process of the server).
  ``make test`` is this suite.
- ``http://127.0.0.1:8080`` in the blocks becomes that server's URL.
- ``$PWD/.venv/bin`` (run "in the stampd clone") becomes the bin directory of the venv running
  this test (``.venv/bin`` of the checkout under ``make test``); ``PYTHONPATH`` names this
  checkout, so that the venv's ``stampd`` runs its code.
- ``HOME`` is a temporary directory (the ``git timestamp`` client writes ``~/.gitconfig`` and
  imports the server key into ``~/.gnupg``); its gpg-agent is stopped at the end. Its
  ``~/.gitconfig`` starts with a user name and e-mail address, as a git user's has.
- ``TMPDIR`` is a temporary directory too (``mktemp -d`` makes the git repository there).

Nothing else is made by the test: the blocks after ``make serve`` run in the README's order as
one terminal session, which starts in the directory ``make serve`` ran in (holding nothing but
``./var``); what a block exports and where it moves to (``cd``) hold for the blocks after it,
and the git repository, ``release/`` and ``FILE`` that they stamp are made by the blocks
themselves.

The block "Installing the client alone" (``pip install .``) is not run here: ``make
client-only`` checks that install (docs/development.md).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    Server,
    free_port,
    kill_pids,
    pids_mentioning,
    short_tmpdir,
)

README = ROOT / "README.md"
README_URL = "http://127.0.0.1:8080"
MARK = re.compile(r"^<!-- readme-test: ([\w-]+) -->\n```(\w*)\n(.*?)^```$", re.M | re.S)


def readme_blocks() -> dict[str, str]:
    """The marked blocks of README.md by name (each name once; every marker before a fence)."""
    text = README.read_text()
    blocks: dict[str, str] = {}
    for name, lang, body in MARK.findall(text):
        assert lang == "sh", f"README block {name} is not a sh block"
        assert name not in blocks, f"README marks two blocks {name}"
        blocks[name] = body
    assert text.count("<!-- readme-test:") == len(blocks), "a readme-test marker before no fence"
    return blocks


@dataclass
class Ran:
    line: str
    rc: int
    out: str
    err: str


@dataclass
class Shell:
    """Runs README blocks as a user would, with the substitutions of the module docstring, one
    after the other as one terminal session: each in the directory the last one left, with the
    environment it left."""

    url: str
    home: Path
    venv_bin: Path
    cwd: Path  # where the next block runs: where the last one left the session
    tmp: Path  # TMPDIR
    out: Path  # each block's commands' output, exit status and the session after it
    exported: dict[str, str] | None = None  # the environment the last block left
    blocks: int = 0

    def env(self) -> dict[str, str]:
        if self.exported is not None:
            return dict(self.exported)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("STAMPD_", "GNUPG", "GIT_"))}
        env.update(HOME=str(self.home), PYTHONPATH=str(ROOT), LC_ALL="C.UTF-8",
                   TMPDIR=str(self.tmp))
        return env

    def run(self, block: str) -> list[Ran]:
        """Each command line of ``block``, in one shell; fails unless each exits with its
        documented status and prints its documented output."""
        text = block.replace(README_URL, self.url.rstrip("/"))
        text = text.replace("$PWD/.venv/bin", str(self.venv_bin))
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        assert lines and not any(ln.rstrip().endswith("\\") for ln in lines), block
        self.blocks += 1
        out = self.out / str(self.blocks)
        out.mkdir(parents=True)
        script = ["set -o pipefail"]
        for i, line in enumerate(lines):
            script += [f"{{ {line}\n}} >{out}/{i}.out 2>{out}/{i}.err </dev/null",
                       f"echo $? >{out}/{i}.rc"]
        script += [f"env -0 >{out}/env", f"pwd >{out}/pwd"]
        subprocess.run(["bash", "-c", "\n".join(script)], cwd=self.cwd, env=self.env(),
                       timeout=120, check=True)
        self.exported = dict(v.split("=", 1) for v in
                             (out / "env").read_text().split("\0") if "=" in v)
        self.cwd = Path((out / "pwd").read_text().rstrip("\n"))
        ran = [Ran(line, int((out / f"{i}.rc").read_text()), (out / f"{i}.out").read_text(),
                   (out / f"{i}.err").read_text()) for i, line in enumerate(lines)]
        for r in ran:
            documented = re.search(r"#.*\bexit (\d+)", r.line)
            want = int(documented.group(1)) if documented else 0
            assert r.rc == want, f"README: `{r.line}` exited {r.rc}, not {want}:\n{r.err}{r.out}"
            shown = re.search(r"#\s*\.\.\.\s*(.+)$", r.line)
            if shown:
                pattern = r"\s+".join(re.escape(w) for w in shown.group(1).split())
                pattern = re.sub(r"\b[A-Z]\b", r"\\d+", pattern)
                assert re.search(pattern, r.out), \
                    f"README: `{r.line}` printed no line like {shown.group(1)!r}:\n{r.out}"
        return ran


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    path = short_tmpdir("rd")
    yield path
    # The gpg-agent that gpg started for the HOME of the blocks, and anything else of ours.
    home = path / "home"
    if (home / ".gnupg").exists():
        subprocess.run(["gpgconf", "--homedir", str(home / ".gnupg"), "--kill", "all"],
                       capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + 10  # (an agent told to stop takes a moment)
    while (left := pids_mentioning(str(path))) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_pids(left)
    shutil.rmtree(path, ignore_errors=True)
    assert left == [], f"processes left running in {path}: {left}"


@pytest.fixture(scope="module")
def served(base: Path) -> Iterator[Server]:
    """`make serve`, as the README's first block says: the venv's ``stampd serve`` on the
    embedded defaults, data in ``./var`` of the directory it runs in."""
    blocks = readme_blocks()
    assert re.search(r"^make serve +# .*serves on http://127\.0\.0\.1:8080/ \(data in \./var\)",
                     blocks["serve"], re.M), blocks["serve"]
    recipe = re.search(r"^serve:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and recipe.group(1) == "$(BIN)/stampd serve", recipe
    clone, runtime = base / "clone", base / "rt"
    clone.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAMPD_")}
    env.update(STAMPD_PORT=str(port), STAMPD_RUNTIME_DIR=str(runtime), PYTHONPATH=str(ROOT))
    log_path = base / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "stampd"), "serve"],
                                cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(proc, port, clone / "var", runtime, log_path, 1, env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def shell(base: Path, served: Server) -> Shell:
    home, tmp = base / "home", base / "tmp"
    home.mkdir(mode=0o700)
    tmp.mkdir(mode=0o700)
    (home / ".gitconfig").write_text("[user]\n\tname = README\n\temail = readme@example.org\n")
    return Shell(served.url, home, Path(sys.executable).parent, cwd=served.data_dir.parent,
                 tmp=tmp, out=base / "ran")


def test_make_serve_keeps_everything_in_var(served: Server) -> None:
    assert (served.data_dir / "keys").is_dir()
    assert (served.data_dir / "stampd.sqlite3").is_file()
    assert (served.data_dir / "log.git").is_dir()
    assert stat.S_IMODE(served.data_dir.stat().st_mode) == 0o700  # (the keys are in there)


def test_the_quick_start_as_written(shell: Shell, served: Server) -> None:
    """Every marked block after `make serve`, in the README's order, as one terminal session
    (`Shell`) starting in the directory `make serve` ran in; then what each block promises is
    checked, where the session then is."""
    def git_checks(here: Path, ran: list[Ran]) -> None:
        assert here.parent == shell.tmp and (here / ".git").is_dir(), here  # (mktemp -d)
        verified = [r for r in ran if r.line.startswith(("git verify-tag", "git verify-commit"))]
        assert len(verified) == 2
        for r in verified:
            assert 'Good signature from "stampd Timestamping Service' in r.err, r.err

    def tlog_checks(here: Path, ran: list[Ran]) -> None:
        assert (here / "SHA256SUMS.asc").is_file()
        assert (here / "SHA256SUMS.asc.tlog-proof").is_file()
        vkey = next(r.out for r in ran if "/tlog/vkey" in r.line)
        port = shell.url.rstrip("/").rsplit(":", 1)[1]
        assert re.fullmatch(rf"127\.0\.0\.1:{port}/tlog\+[0-9a-f]{{8}}\+[A-Za-z0-9+/]+=*\n?",
                            vkey), vkey

    def empty_log_checks(here: Path, ran: list[Ran]) -> None:
        assert "nothing to check yet" in ran[0].err, ran[0].err

    def everyday_checks(here: Path, ran: list[Ran]) -> None:
        manifest = here / "SHA256SUMS.asc"
        assert manifest.stat().st_mode & 0o777 == 0o644  # (published beside the files)
        stock = next(r for r in ran if r.line.startswith("gpg --decrypt"))
        assert stock.out.splitlines() == ["release/notes.txt: OK"], stock.out
        assert "improperly formatted" not in stock.err and "Good signature" in stock.err
        checked = next(r for r in ran if "--dir ." in r.line).out
        assert re.search(r"^files: .*\b1\b.* match", checked, re.M), checked
        assert "CHANGED" not in checked and "MISSING" not in checked, checked
        tag = subprocess.run(["git", "cat-file", "-p", "v1.0-stamp"], cwd=here,
                             capture_output=True, text=True, timeout=30, check=False)
        assert tag.returncode == 0 and "BEGIN PGP SIGNATURE" in tag.stdout, tag.stderr
        assert (here / ".git" / "hooks" / "post-commit").is_file()
        assert "nothing to check yet" in ran[-1].err, ran[-1].err

    def curl_checks(here: Path, ran: list[Ran]) -> None:
        receipt = (here / "FILE.receipt.asc").read_text()
        assert receipt.startswith("-----BEGIN PGP SIGNED MESSAGE-----\n"), receipt
        assert 'Good signature from "stampd Timestamping Service' in ran[-1].err, ran[-1].err

    checks = {"git": git_checks, "tlog": tlog_checks, "empty-log": empty_log_checks,
              "everyday": everyday_checks, "curl": curl_checks}
    blocks = readme_blocks()
    assert next(iter(blocks)) == "serve", "the README's first block is no longer make serve"
    assert set(blocks) - {"serve"} == set(checks), \
        f"README blocks the test checks nothing of: {set(blocks) - {'serve'} - set(checks)}; " \
        f"no longer marked: {set(checks) - set(blocks)}"
    assert sorted(p.name for p in shell.cwd.iterdir()) == ["var"]  # (a fresh directory)
    for name, block in list(blocks.items())[1:]:
        ran = shell.run(block)
        checks[name](shell.cwd, ran)


def test_verify_token_log_says_not_in_the_log_yet(shell: Shell, base: Path) -> None:
    """The README's sentence on the empty log, for an RFC 3161 token (``openssl ts``, as
    docs/tsa.md's quick use makes one)."""
    assert ("`stampd verify TOKEN --log` that the token is not in the log\nyet (exit 3)"
            in README.read_text())
    work = base / "token"
    work.mkdir()
    (work / "FILE").write_bytes(b"a file stamped by a TSA\n")
    url = shell.url.rstrip("/")
    script = (f"set -eo pipefail\n"
              f"export PATH='{shell.venv_bin}':\"$PATH\"\n"
              "openssl ts -query -data FILE -sha256 -cert 2>/dev/null | curl -sS --fail "
              "-H 'Content-Type: application/timestamp-query' --data-binary @- -o FILE.tsr "
              f"{url}/tsr\n"
              f"curl -sS --fail -o tsa.pem {url}/tsa.pem\n"
              f"stampd verify FILE.tsr --data FILE --chain tsa.pem --log {url}/log.git\n")
    r = subprocess.run(["bash", "-c", script], cwd=work, env=shell.env(), capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("stampd verify: not in the log yet: sha256 "), r.stderr
    assert r.stderr.count("\n") == 1 and "has no commit yet" in r.stderr, r.stderr

