"""``stampd hook install|uninstall``: the post-commit hook that stamps every commit.

The same script is installed as ``post-commit`` (``git commit``, and each commit ``git rebase``,
``cherry-pick`` and ``revert`` make), ``post-merge`` (a merge commit of ``git merge`` or ``git
pull``, which runs no post-commit hook) and ``post-applypatch`` (each commit of ``git am``): so
every new commit, signed ones included, is stamped when it is made, not only by the next
``git commit``'s stamp (docs/signatures.md: a signature's stamp must come before its key's end).

The hook itself (``client/hooks/post-commit``) is a POSIX sh script that needs only git, curl and
gpg. Installing it pins the server's key (trust on first use): the key is fetched once with
``get-public-key-v1``, imported into a keyring under the git directory
(``<git common dir>/stampd/gnupg``, mode 0700), and its fingerprint and user id are written to
the repository's git config (``stampd.server``, ``stampd.branch``, ``stampd.fingerprint``,
``stampd.uid``), which the hook reads.

The server's transparency-log key (``GET /tlog/vkey``) is pinned as ``stampd.tlogkey`` (none
for a server without a log), and ``stampd.proofwait`` (``--proof-wait``, default 3 s) says how
long the hook waits after each stamp for its proof, which it keeps unchecked as a note on the
stamp under ``refs/notes/stampd-tlog`` (``stampd verify`` checks it).

With ``--format ssh`` the stamps are SSH-signed: the server's SSH key (``--key``, or its first)
is pinned as one allowed-signers line in ``<git common dir>/stampd/allowed_signers``
(``stampd.format``, ``stampd.key``), and the hook checks stamps with ``ssh-keygen``.

An existing ``post-commit`` hook that is not stampd's is never replaced silently: ``install``
refuses unless ``--force``, which keeps it as ``post-commit.user``; stampd's hook runs it first
on every commit (a chain, not a dead backup). ``uninstall`` removes only a hook carrying stampd's
marker line, and puts ``post-commit.user`` back (or a ``post-commit.stampd-backup`` left by
earlier versions).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from client.errors import CommandError
from client.gpg import GpgError, GpgHome, TempGpgHome
from client.verify.errors import CannotCheck, Malformed, VerifyError
from client.verify.keys import (
    KEYRING_PREFIX,
    fetch_allowed_signers,
    fetch_public_key,
    ssh_keys_from,
)
from client.verify.tlog import MAX_WAIT, NOTES_REF, ProofUnavailable, fetch_vkey

HOOK = "post-commit"
# Every hook git runs after it made a commit: stampd's script is each of them.
HOOKS = (HOOK, "post-merge", "post-applypatch")
MARKER = "# stampd-post-commit-hook v1"
MARKER_PREFIX = "# stampd-post-commit-hook "
USER_SUFFIX = ".user"  # the user's own hook, which stampd's runs first
BACKUP_SUFFIX = ".stampd-backup"  # where versions before the chain kept it (restored too)
# git's signature programs, wrapped to check at a stamp's time (client.verify.gitprogram)
WRAPPERS = {"gpg.ssh.program": ("ssh", Path("stampd") / "ssh-program"),
            "gpg.program": ("openpgp", Path("stampd") / "gpg-program")}
KEYRING = Path("stampd") / "gnupg"
KEY_FILE = Path("stampd") / "server-key.asc"
ALLOWED_SIGNERS = Path("stampd") / "allowed_signers"


class HookError(CommandError):
    """Installing or removing the hook failed: ``stampd hook install|uninstall: <message>``,
    exit status 1, or the ``exit_code`` given (2 for an unusable argument)."""


def hook_script() -> str:
    """The shipped hook script (package data ``client/hooks/post-commit``)."""
    text = resources.files("client").joinpath("hooks", HOOK).read_text(encoding="ascii")
    if MARKER not in text.splitlines():
        raise HookError("the packaged hook script lacks its marker line")
    return text


def is_ours(path: Path) -> bool:
    """Whether the hook file at ``path`` carries stampd's marker line."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return any(line.startswith(MARKER_PREFIX) for line in head.splitlines()[:5])


def _git(repo: Path, *args: str) -> str:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                           timeout=60, check=False)
    except FileNotFoundError:
        raise HookError("git is not installed") from None
    if r.returncode != 0:
        raise HookError(f"git {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r.stdout.strip()


@dataclass(frozen=True)
class RepoPaths:
    hooks: Path  # honours core.hooksPath
    common: Path  # the git common directory (shared by worktrees)

    @property
    def hook(self) -> Path:
        return self.hooks / HOOK

    def all_hooks(self) -> list[Path]:
        return [self.hooks / name for name in HOOKS]

    @property
    def keyring(self) -> Path:
        return self.common / KEYRING

    @property
    def user_hook(self) -> Path:
        return self.hooks / (HOOK + USER_SUFFIX)

    @property
    def allowed_signers(self) -> Path:
        return self.common / ALLOWED_SIGNERS


def repo_paths(repo: Path) -> RepoPaths:
    try:
        _git(repo, "rev-parse", "--git-dir")
    except HookError:
        raise HookError(f"{repo} is not inside a git repository") from None
    # A relative core.hooksPath is relative to the top of the working tree (none when bare).
    with contextlib.suppress(HookError):
        repo = Path(_git(repo, "rev-parse", "--show-toplevel"))
    hooks = Path(_git(repo, "rev-parse", "--git-path", "hooks"))
    common = Path(_git(repo, "rev-parse", "--git-common-dir"))
    return RepoPaths(hooks=hooks if hooks.is_absolute() else (repo / hooks).resolve(),
                     common=common if common.is_absolute() else (repo / common).resolve())


def _valid_name(name: str) -> bool:
    return bool(re.fullmatch(r"[_a-z][-._a-z0-9]{0,99}", name, re.IGNORECASE)) \
        and ".." not in name


def default_branch(server: str) -> str:
    """The timestamp branch `git timestamp` picks for ``server`` when it makes the name up:
    the first dot/slash-separated part of the URL after the scheme that is not empty, ``www``,
    ``igitt``, ``zeitgitter`` or contains ``stamp``, with ``:`` as ``-``, plus ``-timestamps``
    (``http://localhost:8080`` gives ``localhost-8080-timestamps``, ``https://stamps.example.org``
    gives ``example-timestamps``; a part must start with a letter or ``_``, so a bare IP address
    such as ``http://127.0.0.1:8080`` gives ``zeitgitter-timestamps``)."""
    fields = server.replace("/", ".").split(".")[1:]
    for f in fields:
        name = f.replace(":", "-")
        if name and name not in ("www", "igitt", "zeitgitter") and "stamp" not in name \
                and _valid_name(name):
            return f"{name}-timestamps"
    return "zeitgitter-timestamps"


def check_server_url(server: str) -> str:
    """``server`` if it is an http:// or https:// URL, else `HookError` (exit 2). One without
    a scheme is refused rather than guessed at (the hook would keep the guess in git config):
    the refusal names the URL meant, ``http://`` for a bare ``host:port`` (a local server),
    else ``https://``."""
    if "://" not in server:
        meant = urllib.parse.urlsplit("http://" + server)
        try:
            port = meant.port
        except ValueError:
            port = None
        if meant.hostname and all("!" <= c <= "~" for c in server):
            scheme = "http" if port is not None else "https"
            raise HookError(f"--server needs a scheme: give {scheme}://{server}, not "
                            f"{server!r}", 2)
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname \
            or any(not ("!" <= c <= "~") for c in server):
        raise HookError(f"--server must be an http:// or https:// URL, not {server!r}", 2)
    return server


@dataclass(frozen=True)
class PinnedKey:
    fingerprint: str  # primary key
    uid: str
    armored: bytes


def pin_key(server: str) -> PinnedKey:
    """Fetch the server's key and describe it; exactly one key with a printable user id."""
    try:
        armored = fetch_public_key(server)
        with TempGpgHome(KEYRING_PREFIX) as home:
            home.import_keys(armored)
            keys = home.list_keys()
    except (VerifyError, GpgError) as e:
        raise HookError(e.message) from None
    if len(keys) != 1:
        raise HookError(f"{server} answered get-public-key-v1 with {len(keys)} keys, not one")
    key = keys[0]
    if not key.uids or any(not (" " <= c <= "~") for c in key.uids[0]):
        raise HookError(f"the key of {server} has no printable user id")
    return PinnedKey(fingerprint=key.fingerprint, uid=key.uids[0], armored=armored)


def write_keyring(target: Path, key: PinnedKey) -> None:
    """Replace the keyring at ``target`` with one holding only ``key`` (mode 0700)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(target.parent, 0o700)
    fresh = Path(tempfile.mkdtemp(prefix="gnupg.", dir=target.parent))
    try:
        os.chmod(fresh, 0o700)
        try:
            imported = GpgHome(fresh).import_keys(key.armored)
        except GpgError as e:
            raise HookError(e.message) from None
        # gpg 2.2 exits 2 after a good import when it cannot reach an agent, e.g. because
        # the keyring's path is too long for a socket; the IMPORT_OK status is what counts.
        if not imported.ok:
            raise HookError(f"gpg could not import the server key: {imported.stderr[-300:]}")
        if target.exists():
            shutil.rmtree(target)
        fresh.rename(target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    (target.parent / KEY_FILE.name).write_bytes(key.armored)


def pin_ssh_key(server: str, fingerprint: str | None) -> tuple[str, str]:
    """(fingerprint, allowed-signers line) of the server's SSH key ``fingerprint``, or of its
    first SSH key."""
    try:
        text = fetch_allowed_signers(server)
    except VerifyError as e:
        raise HookError(e.message) from None
    for line in text.splitlines():
        keys = ssh_keys_from(line)
        if keys and (fingerprint is None or keys[0].fingerprint == fingerprint):
            return keys[0].fingerprint, line
    raise HookError(f"{server} has no SSH key" + (f" {fingerprint}" if fingerprint else ""))


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _config(repo: Path, name: str) -> str | None:
    try:
        return _git(repo, "config", "--local", "--get", name) or None
    except HookError:
        return None


def pin_log_key(repo: Path, server: str, proof_wait: int) -> list[str]:
    """Pin the server's transparency-log key (``GET /tlog/vkey``) as ``stampd.tlogkey`` and
    the hook's wait for a proof as ``stampd.proofwait``; a server without a log (404) unpins
    it. Return the report lines."""
    _git(repo, "config", "--local", "stampd.proofwait", str(proof_wait))
    try:
        vkey = fetch_vkey(server)
    except ProofUnavailable as e:
        if e.no_log:
            with contextlib.suppress(HookError):
                _git(repo, "config", "--local", "--unset", "stampd.tlogkey")
            return ["log:     none (the server keeps no transparency log)"]
        return [f"log:     {e.message}"]
    except (CannotCheck, Malformed) as e:
        return [f"log:     no log key pinned: {e.message}"]
    _git(repo, "config", "--local", "stampd.tlogkey", vkey)
    what = f"proofs kept as notes in {NOTES_REF}, waiting up to {proof_wait} s" \
        if proof_wait else "proofs not fetched (--proof-wait 0)"
    return [f"log key: {vkey} (pinned as stampd.tlogkey); {what}"]


def install(repo: Path, server: str, branch: str | None, force: bool, fmt: str = "openpgp",
            ssh_key: str | None = None, proof_wait: int = 3, git_verify: bool = False
            ) -> list[str]:
    """Install the hook and pin the server key; return lines describing what was done."""
    server = check_server_url(server)
    branch = branch or default_branch(server)
    paths = repo_paths(repo)
    try:
        _git(repo, "check-ref-format", f"refs/heads/{branch}")
    except HookError:
        raise HookError(f"{branch!r} is not a valid branch name", 2) from None
    hook = paths.hook
    foreign = [h for h in paths.all_hooks() if _exists(h) and not is_ours(h)]
    if foreign and not force:
        h = foreign[0]
        raise HookError(f"{h} exists and is not stampd's hook; not replacing it (use --force "
                        f"to install anyway: it is kept as {h.name}{USER_SUFFIX} and runs "
                        "before stampd's)")
    for h in foreign:
        kept = h.with_name(h.name + USER_SUFFIX)
        if _exists(kept):
            raise HookError(f"{h} is not stampd's hook, and {kept.name} exists too; "
                            "move one of them away first")
    if fmt not in ("openpgp", "ssh"):
        raise HookError(f"--format must be openpgp or ssh, not {fmt!r}", 2)
    if ssh_key is not None and fmt != "ssh":
        raise HookError("--key goes with --format ssh", 2)
    if not 0 <= proof_wait <= MAX_WAIT:
        raise HookError(f"--proof-wait must be 0 to {MAX_WAIT} seconds, not {proof_wait}", 2)
    script = hook_script()
    key = pin_key(server)
    ssh = pin_ssh_key(server, ssh_key) if fmt == "ssh" else None
    pinned = _config(repo, "stampd.fingerprint")
    if pinned and pinned != key.fingerprint and _config(repo, "stampd.server") == server \
            and not force:
        raise HookError(f"the key of {server} changed from the pinned {pinned} to "
                        f"{key.fingerprint}; if you trust the new key, use --force")
    write_keyring(paths.keyring, key)
    for name, value in (("server", server), ("branch", branch),
                        ("fingerprint", key.fingerprint), ("uid", key.uid), ("format", fmt)):
        _git(repo, "config", "--local", f"stampd.{name}", value)
    lines = []
    if ssh is not None:
        paths.allowed_signers.write_text(ssh[1] + "\n", encoding="ascii")
        _git(repo, "config", "--local", "stampd.key", ssh[0])
        lines.append(f"ssh key: {ssh[0]} (pinned in {paths.allowed_signers})")
    else:
        with contextlib.suppress(HookError):
            _git(repo, "config", "--local", "--unset", "stampd.key")
    lines += pin_log_key(repo, server, proof_wait)
    if git_verify:
        lines += install_git_verify(repo, paths, force)
    paths.hooks.mkdir(parents=True, exist_ok=True)
    for h in paths.all_hooks():
        if h in foreign:
            kept = h.with_name(h.name + USER_SUFFIX)
            h.rename(kept)
            lines.append(f"kept the previous hook as {kept}; it runs before stampd's")
        tmp = h.with_name(f".{h.name}.stampd-tmp")
        tmp.write_text(script, encoding="ascii")
        os.chmod(tmp, 0o755)
        if h.is_symlink():
            h.unlink()
        tmp.replace(h)
    others = ", ".join(HOOKS[1:])
    return [f"installed {hook} (and {others} beside it)", *lines, f"server:  {server}",
            f"branch:  {branch}",
            f"key:     {key.fingerprint} ({key.uid})",
            f"pinned:  {paths.keyring} and git config stampd.*"]


def wrapper_script(config: str, which: str) -> str:
    return (f"#!/bin/sh\n# stampd: git's {config}: a signature checked at the time its stamp "
            "proves (stampd hook install --git-verify;\n# docs/signatures.md). Remove with "
            f"stampd hook uninstall.\nexec {shlex.quote(sys.executable)} -m "
            f'client.verify.gitprogram {which} "$@"\n')


def install_git_verify(repo: Path, paths: RepoPaths, force: bool) -> list[str]:
    """Point ``gpg.ssh.program`` and ``gpg.program`` (the repository's config) at stampd's
    wrappers; one set to another program is not replaced without ``force``."""
    lines = []
    for config, (_, rel) in WRAPPERS.items():
        path = paths.common / rel
        current = _config(repo, config)
        if current not in (None, str(path)) and not force:
            raise HookError(f"{config} is {current} in {repo}; not replacing it (use --force "
                            "to point it at stampd's wrapper, which runs ssh-keygen or gpg)")
    for config, (which, rel) in WRAPPERS.items():
        path = paths.common / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(wrapper_script(config, which), encoding="utf-8")
        os.chmod(tmp, 0o755)
        tmp.replace(path)
        _git(repo, "config", "--local", config, str(path))
        lines.append(f"{config + ':':17}{path} (git verify-commit, verify-tag and log "
                     "--show-signature check at the stamp's time)")
    return lines


def uninstall_git_verify(repo: Path, paths: RepoPaths) -> list[str]:
    lines = []
    for config, (_, rel) in WRAPPERS.items():
        path = paths.common / rel
        if _config(repo, config) == str(path):
            _git(repo, "config", "--local", "--unset", config)
            lines.append(f"unset {config}")
        if path.exists():
            path.unlink()
    return lines


def uninstall(repo: Path) -> list[str]:
    """Remove stampd's hooks (putting back each user's hook they ran, or a backed-up one);
    never touch anyone else's: a post-commit hook that is not stampd's is refused, another
    hook that is not is left as it is."""
    paths = repo_paths(repo)
    hook = paths.hook
    if _exists(hook) and not is_ours(hook):
        raise HookError(f"{hook} is not stampd's hook; leaving it alone")
    lines = uninstall_git_verify(repo, paths)
    ours = [h for h in paths.all_hooks() if _exists(h) and is_ours(h)]
    if not ours:
        return [*lines, f"no post-commit hook at {hook}; nothing to do"]
    for h in ours:
        h.unlink()
        lines.append(f"removed {h}")
        for kept in (h.with_name(h.name + USER_SUFFIX), h.with_name(h.name + BACKUP_SUFFIX)):
            if _exists(kept):
                kept.rename(h)
                lines.append(f"restored the previous hook from {kept.name}")
                break
    lines.append(f"kept the timestamp branch, {paths.keyring} and git config stampd.*")
    return lines


def cmd_install(args: argparse.Namespace) -> int:
    """``stampd hook install [--server URL] [--branch NAME] [--repo DIR] [--force]``: 0 when
    installed; otherwise raise a `HookError`."""
    print("\n".join(install(args.repo, args.server, args.branch, args.force, args.format,
                             args.key, getattr(args, "proof_wait", 3),
                             getattr(args, "git_verify", False))))
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    """``stampd hook uninstall [--repo DIR]``: 0 when removed (or nothing to remove);
    otherwise raise a `HookError`."""
    print("\n".join(uninstall(args.repo)))
    return 0
