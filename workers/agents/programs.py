"""The external programs stampd runs, and the oldest release of each that it works with.

`require` checks them once, at start, so that a missing or too old program is one line naming
it, the release needed and how to install it, rather than a worker failing again and again.

- GnuPG 2.2.8 or later: ``gpg``, ``gpgconf``, ``gpg-agent``. ``gpg --show-keys`` (2.2.8) reads
  the public keys; ``gpg-agent --supervised`` came in 2.1.16, ``gpgconf --create-socketdir`` in
  2.1.13.
- OpenSSH 8.1 or later: ``ssh-agent``, ``ssh-add``, ``ssh-keygen`` (only where SSH keys are
  served). ``ssh-keygen -Y verify`` (SSHSIG, 8.1) checks each SSH key at start.

(docs/agents.md, "Programs and releases".) GnuPG's programs each print their release
(``--version``). OpenSSH's agent and key tools print none: their release is ``ssh -V``'s (the
same package), and is taken as unknown, not as too old, when ``ssh`` is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workers.errors import WorkerError

__all__ = ["GNUPG", "OPENSSH", "Program", "ProgramError", "require", "version_of"]

_TIMEOUT = 30.0
_VERSION = re.compile(rb"(\d+)\.(\d+)(?:\.(\d+))?")


class ProgramError(WorkerError):
    """A program stampd needs is missing, too old, or does not run (a setup error).

    ``message`` is one line: the program, the release needed and how to install it."""


@dataclass(frozen=True)
class Program:
    name: str  # what is run (looked up on PATH)
    suite: str  # the project that makes it: "GnuPG", "OpenSSH"
    minimum: tuple[int, ...]
    install: str  # how to install it on Debian and Ubuntu
    # How to learn its release (the first line of the output names it); None: ask
    # ``ssh -V`` (OpenSSH's agent and key tools print none).
    version_argv: tuple[str, ...] | None = None

    @property
    def needed(self) -> str:
        return f"{self.suite} {'.'.join(map(str, self.minimum))} or later"


def _gnupg(name: str) -> Program:
    return Program(name, "GnuPG", (2, 2, 8), "apt-get install gnupg", (name, "--version"))


def _openssh(name: str) -> Program:
    return Program(name, "OpenSSH", (8, 1), "apt-get install openssh-client")


GNUPG = (_gnupg("gpg"), _gnupg("gpgconf"), _gnupg("gpg-agent"))
OPENSSH = (_openssh("ssh-agent"), _openssh("ssh-add"), _openssh("ssh-keygen"))


def parse_version(output: bytes) -> tuple[int, ...] | None:
    """The first ``X.Y[.Z]`` of the first line of a program's version output
    (``gpg (GnuPG) 2.2.40``, ``OpenSSH_9.2p1 Debian-2``); None when there is none."""
    lines = output.strip().splitlines()
    m = _VERSION.search(lines[0]) if lines else None
    if m is None:
        return None
    return tuple(int(part) for part in m.groups() if part is not None)


def _ask(argv: list[str], env: Mapping[str, str] | None) -> bytes | None:
    """stdout and stderr of ``argv``; None when it cannot be run at all."""
    try:
        r = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=_TIMEOUT,
                           check=False, env=None if env is None else dict(env))
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout + r.stderr


def version_of(program: Program, path: str, env: Mapping[str, str] | None = None
               ) -> tuple[int, ...] | None:
    """The release of ``program`` installed at ``path`` (None: unknown)."""
    if program.version_argv is not None:
        output = _ask([path, *program.version_argv[1:]], env)
        return None if output is None else parse_version(output)
    ssh = shutil.which("ssh", path=_search_path(env))
    output = None if ssh is None else _ask([ssh, "-V"], env)
    return None if output is None else parse_version(output)


def _search_path(env: Mapping[str, str] | None) -> str | None:
    return (os.environ if env is None else env).get("PATH")


def require(programs: Iterable[Program], env: Mapping[str, str] | None = None) -> None:
    """Raise `ProgramError` for the first of ``programs`` that is not on the PATH (of ``env``,
    default ours) or is older than its minimum."""
    for program in programs:
        path = shutil.which(program.name, path=_search_path(env))
        if path is None:
            raise ProgramError(f"{program.name} is not installed (not on PATH): stampd needs "
                               f"{program.needed}; install it, e.g. `{program.install}`")
        found = version_of(program, path, env)
        if found is not None and found < program.minimum:
            release = ".".join(map(str, found))
            raise ProgramError(f"{program.name} ({path}) is {program.suite} {release}, too old: "
                               f"stampd needs {program.needed}; install a newer one, e.g. "
                               f"`{program.install}` on a current distribution")
