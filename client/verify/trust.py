"""The server keys ``stampd verify`` trusts when no ``--key`` is given: those pinned in the
repository (``--repo``, default ``.``), else the ones fetched from the server the receipt or
manifest names; and the pins themselves, which ``stampd stamp`` writes (`keep_key`).

Trust on first use, as ``git timestamp`` does it: ``stampd stamp`` pins a server's OpenPGP key
by its fingerprint as git config ``timestamper.<pin>.keyid`` (`pin_name`: git timestamp's name
and variable), its SSH key as ``timestamper.<pin>.sshkey``, its transparency-log key as
``timestamper.<pin>.tlogkey`` (`client.verify.tlog`), and keeps the public keys themselves in
the git directory, ``<git common dir>/stampd/keys/<pin>.asc`` and ``<pin>.pub``, so that they
can be checked against with the server stopped. ``stampd hook install`` pins its server's key
as ``stampd.fingerprint`` (SSH: ``stampd.key``), kept in ``<git common dir>/stampd/
server-key.asc`` (SSH: ``stampd/allowed_signers``; `client.hook`).

A kept key counts only where it is the pinned one (a pin changed by hand is not overruled by
an old file). A pin without a kept key (made by ``git timestamp``, or by a stampd before keys
were kept) still holds: the key is fetched and must be the pinned one.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from client.gpg import TempGpgHome
from client.verify.errors import CannotCheck, Usage
from client.verify.keys import (
    KEYRING_PREFIX,
    fetch_allowed_signers,
    fetch_public_key,
    gpg_checks,
    public_key_url,
    ssh_keys_from,
)
from formats.sshsig import SshPublicKey

KEPT = Path("stampd") / "keys"  # in the git common directory: <pin>.asc, <pin>.pub
HOOK_KEY = Path("stampd") / "server-key.asc"  # `stampd hook install`'s (client.hook)
HOOK_SIGNERS = Path("stampd") / "allowed_signers"
FORMATS = {"openpgp": ("keyid", ".asc"), "ssh": ("sshkey", ".pub")}


def pin_name(server: str) -> str:
    """The git config subsection ``git timestamp`` pins a server's key under: the URL without
    scheme and trailing slashes, every character other than 0-9 and a-z as ``-``."""
    name = re.sub(r"^https?://", "", server).rstrip("/")
    return "".join(c if c.isdigit() or "a" <= c <= "z" else "-" for c in name)


def pin_variable(server: str, fmt: str = "openpgp") -> str:
    """The git config variable that pins ``server``'s OpenPGP (``fmt``) or SSH key."""
    return f"timestamper.{pin_name(server)}.{FORMATS[fmt][0]}"


def _git(repo: Path, *args: str) -> list[str]:
    """The lines git prints, none where it fails (no repository, no such variable)."""
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                           timeout=60, check=False)
    except FileNotFoundError:
        return []
    return r.stdout.splitlines() if r.returncode == 0 else []


def common_dir(repo: Path) -> Path | None:
    """The repository's git common directory (shared by its worktrees); None outside one."""
    found = _git(repo, "rev-parse", "--git-common-dir")  # (relative to repo, or absolute)
    return (repo / found[0]).resolve() if found else None


def kept_key_path(common: Path, server: str, fmt: str) -> Path:
    return common / KEPT / f"{pin_name(server)}{FORMATS[fmt][1]}"


def keep_key(repo: Path, server: str, fmt: str, key: bytes) -> Path:
    """Keep ``server``'s public key (``fmt``: an armored OpenPGP key, or an SSH key line) beside
    its pin in the repository ``repo``, replacing what was kept; where it was kept. Raise
    `OSError` (also outside a repository)."""
    common = common_dir(repo)
    if common is None:
        raise OSError(f"{repo} is not a git repository")
    path = kept_key_path(common, server, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        os.chmod(tmp, 0o644)  # (public keys)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class Pin:
    """A server key pinned in git config (``variable`` = ``value``, a fingerprint), with the
    key kept beside it where one is kept and is the pinned one: ``openpgp`` (armored) or
    ``ssh``."""

    variable: str
    value: str
    openpgp: bytes | None = None
    ssh: SshPublicKey | None = None

    @property
    def kept(self) -> bool:
        return self.openpgp is not None or self.ssh is not None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()[:256 * 1024]
    except OSError:
        return None


def _openpgp_is(armored: bytes | None, pinned: str) -> bytes | None:
    """``armored`` when it holds the key whose fingerprint ends in ``pinned``."""
    if not armored or len(pinned) < 16:
        return None
    with gpg_checks(), TempGpgHome(KEYRING_PREFIX) as home:
        home.import_keys(armored)
        keys = home.list_keys()
    return armored if any(k.fingerprint.endswith(pinned.upper()) for k in keys) else None


def _ssh_is(text: bytes | None, pinned: str) -> SshPublicKey | None:
    if not text:
        return None
    return next((k for k in ssh_keys_from(text.decode("ascii", "replace"))
                 if k.fingerprint == pinned), None)


def _same_pin(a: str, b: str) -> bool:
    return pin_name(a) == pin_name(b)


def pins(repo: Path, fmt: str, server: str | None) -> list[Pin]:
    """The pins of ``server``'s key (``fmt``: openpgp or ssh) in ``repo``'s git config (any
    scope), ``stampd stamp``'s and ``stampd hook install``'s, each with its kept key; for
    ``server`` None, the pins of every server."""
    what, _ = FORMATS[fmt]
    found: list[tuple[str, str, str | None]] = []  # (variable, value, server's pin name)
    for line in _git(repo, "config", "--get-regexp", rf"^timestamper\..*\.{what}$"):
        variable, _, value = line.partition(" ")
        name = variable[len("timestamper."):-len(what) - 1]
        if value and (server is None or name == pin_name(server)):
            found.append((variable, value.strip(), name))
    hook_server = next(iter(_git(repo, "config", "--get", "stampd.server")), None)
    hook_variable = "stampd.fingerprint" if fmt == "openpgp" else "stampd.key"
    hook_value = next(iter(_git(repo, "config", "--get", hook_variable)), None)
    if hook_server and hook_value and (server is None or _same_pin(hook_server, server)):
        found.append((hook_variable, hook_value.strip(), None))
    common = common_dir(repo)
    result = []
    for variable, value, pinned_as in found:
        kept: bytes | None = None
        if common is not None:
            if pinned_as is not None:
                kept = _read(common / KEPT / f"{pinned_as}{FORMATS[fmt][1]}")
            else:
                kept = _read(common / (HOOK_KEY if fmt == "openpgp" else HOOK_SIGNERS))
        if fmt == "openpgp":
            result.append(Pin(variable, value, openpgp=_openpgp_is(kept, value)))
        else:
            result.append(Pin(variable, value, ssh=_ssh_is(kept, value)))
    return result


@dataclass(frozen=True)
class Trusted:
    """The keys a stamp is checked with: ``openpgp`` (armored, one key or more) and ``ssh``;
    ``origin`` says where they come from (for the report); ``fetched``: fetched from the
    server just now, its answer trusted as it is (``stampd verify`` says so on stderr)."""

    openpgp: bytes | None
    ssh: tuple[SshPublicKey, ...]
    origin: str
    fetched: bool = False


def _pinned_as(found: list[Pin]) -> str:
    return "pinned as " + ", ".join(dict.fromkeys(p.variable for p in found))


def server_keys(fmt: str, repo: Path, server: str) -> Trusted:
    """The keys of ``server`` (named by a receipt or manifest) to check its ``fmt`` signature
    with: kept beside their pins in ``repo``, else fetched (and then, where a pin without a
    kept key exists, only the pinned one). `CannotCheck` when none can be had, saying which
    option to give."""
    found = pins(repo, fmt, server)
    kept = [p for p in found if p.kept]
    if kept:
        return Trusted(b"".join(p.openpgp or b"" for p in kept) or None,
                       tuple(p.ssh for p in kept if p.ssh is not None), _pinned_as(kept))
    option = "--key KEYFILE (the server's public key)" if fmt == "openpgp" else \
        "--key FILE (the server's allowed-signers file or .pub)"
    try:
        if fmt == "openpgp":
            url = public_key_url(server)
            armored = fetch_public_key(server)
        else:
            url = f"{server.rstrip('/')}/v1/keys/allowed_signers"
            served = tuple(ssh_keys_from(fetch_allowed_signers(server)))
    except CannotCheck as e:
        none = "no key is pinned" if not found else "the pinned key is not kept"
        raise CannotCheck(f"{e.message}; {none} in {repo}: give {option}") from None
    if fmt == "openpgp":
        if not found:
            return Trusted(armored, (), f"fetched from {url}", fetched=True)
        if _openpgp_is(armored, found[0].value) is None:
            raise CannotCheck(f"the key {server} serves is not the one pinned as "
                              f"{found[0].variable} ({found[0].value}): give --key KEYFILE "
                              "holding the pinned key")
        return Trusted(armored, (), f"fetched from {url}, {_pinned_as(found[:1])}")
    if not found:
        return Trusted(None, served, f"fetched from {url}", fetched=True)
    wanted = {p.value for p in found}
    mine = tuple(k for k in served if k.fingerprint in wanted)
    if not mine:
        raise CannotCheck(f"{server} does not serve the SSH key pinned as {found[0].variable} "
                          f"({found[0].value}): give {option}")
    return Trusted(None, mine, f"fetched from {url}, {_pinned_as(found)}")


def repository_keys(fmt: str, repo: Path) -> Trusted:
    """Every key (``fmt``) kept beside a pin in ``repo``, of any server: a git stamp names no
    server. `Usage` when there is none."""
    kept = [p for p in pins(repo, fmt, None) if p.kept]
    if not kept:
        what = "--key FILE" if fmt == "openpgp" else "--key FILE (an allowed-signers file or .pub)"
        raise Usage(f"a git stamp is checked against the server's key: give {what} (none is "
                    f"pinned in {repo} by stampd stamp or stampd hook install)")
    return Trusted(b"".join(p.openpgp or b"" for p in kept) or None,
                   tuple(p.ssh for p in kept if p.ssh is not None), _pinned_as(kept))
