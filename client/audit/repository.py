"""The log repository: opened (`open_repository`) or cloned from a URL, a log's or a stampd
server's (`cloned`, `local_copy`), the refs an audit reads (`audited_refs`), and what is read
from its objects (blobs of a tree, the signature headers of a raw commit)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pygit2
from pygit2.enums import RepositoryOpenFlag

from client.audit.errors import EmptyLog, TargetError
from client.fetch import tls_problem
from formats.mailstamps import BRANCH_SUFFIX as MAIL_SUFFIX

MAIN = "main"
PEER_SUFFIX = "-timestamps"
REMOTE = "origin"
REMOTES_PREFIX = "refs/remotes/"
SIG_BEGIN = b"-----BEGIN PGP SIGNATURE-----"
SIG_HEADERS = (b"gpgsig", b"gpgsig-sha256")
URL = re.compile(r"https?://", re.IGNORECASE)
CLONE_TIMEOUT = 600.0


def signature_headers(raw: bytes) -> list[bytes]:
    """Values (first line) of the signature headers of a raw commit object."""
    head = raw.split(b"\n\n", 1)[0]
    found = []
    for line in head.split(b"\n"):
        name, _, value = line.partition(b" ")
        if name in SIG_HEADERS:
            found.append(value)
    return found


def read_blob(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> bytes | None:
    try:
        obj = tree[path]
    except KeyError:
        return None
    blob = repo[obj.id]
    return blob.data if isinstance(blob, pygit2.Blob) else None



def open_repository(path: Path | str) -> pygit2.Repository:
    """Open exactly ``path`` (no search in parent directories); raise `TargetError`."""
    try:
        return pygit2.Repository(str(path), RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, KeyError, ValueError, OSError) as e:
        raise TargetError(f"{path} is not a readable git repository: {e}") from None


def ref_commit(repo: pygit2.Repository, name: str) -> str | None:
    try:
        ref = repo.references[name].resolve()
        obj = repo[ref.target].peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return str(obj.id)


def ref_target(repo: pygit2.Repository, name: str) -> str:
    """What ``name`` points to (an object id if it resolves), for failures of broken refs."""
    ref = repo.references[name]
    try:
        return str(ref.resolve().target)
    except (KeyError, ValueError, pygit2.GitError):
        return str(ref.target)


@dataclass(frozen=True)
class AuditedRefs:
    """The refs an audit reads: one namespace, the local branches or one remote's."""

    main: str  # full ref name of main
    peers: dict[str, str]  # peer name -> full ref name of its <name>-timestamps branch
    remote: str | None  # the remote whose remote-tracking refs these are; None: local refs
    # email timestamper name -> full ref name of its <name>-mailstamps branch
    mail: dict[str, str] = field(default_factory=dict)


def audited_refs(names: Iterable[str], upstream: str | None,
                 target: str = "the repository") -> AuditedRefs:
    """Choose the refs to audit among ``names`` (every ref of the repository), fetch-aware.

    ``git fetch`` in a clone moves the remote-tracking refs (``refs/remotes/<remote>/...``),
    not the local branches; so when some remote has a remote-tracking ``main``, that remote's
    ``main`` and ``<name>-timestamps`` refs are what the remote published, and they are audited,
    never mixed with (possibly stale) local branches. The remote is the one of the local main's
    upstream (``branch.main.remote``, passed as ``upstream``) if it has a tracking main, else
    ``origin``, else the only remote with one; several others are ambiguous (`TargetError`).
    Without remote-tracking main (a bare or mirror clone, the server's own ``log.git``: there
    ``git fetch`` updates ``refs/heads/``), the local ``refs/heads/`` are audited."""
    names = sorted(set(names))
    if not any(n.startswith(("refs/heads/", REMOTES_PREFIX)) for n in names):
        raise EmptyLog(target)  # no branch at all: a log before its first commit
    tail = f"/{MAIN}"
    remotes = [n[len(REMOTES_PREFIX):-len(tail)] for n in names
               if n.startswith(REMOTES_PREFIX) and n.endswith(tail)
               and len(n) > len(REMOTES_PREFIX) + len(tail)]
    remote: str | None
    if upstream in remotes:
        remote = upstream
    elif REMOTE in remotes:
        remote = REMOTE
    elif len(remotes) == 1:
        remote = remotes[0]
    elif remotes:
        raise TargetError(
            f"{target}: several remotes have a remote-tracking '{MAIN}' "
            f"({', '.join(remotes)}), none of them '{REMOTE}' or the upstream of the local "
            f"'{MAIN}'; choose one with 'git branch --set-upstream-to=<remote>/{MAIN} {MAIN}'")
    else:
        remote = None
    prefix = "refs/heads/" if remote is None else f"{REMOTES_PREFIX}{remote}/"
    main = prefix + MAIN
    if main not in names:
        raise TargetError(f"{target} has no '{MAIN}' branch")
    peers = {n[len(prefix):-len(PEER_SUFFIX)]: n for n in names
             if n.startswith(prefix) and n.endswith(PEER_SUFFIX)}
    mail = {n[len(prefix):-len(MAIL_SUFFIX)]: n for n in names
            if n.startswith(prefix) and n.endswith(MAIL_SUFFIX)}
    return AuditedRefs(main, peers, remote, mail)


def upstream_remote(repo: pygit2.Repository) -> str | None:
    """The remote of the local main's upstream (``branch.main.remote``), if configured."""
    try:
        value = repo.config[f"branch.{MAIN}.remote"]
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return value if isinstance(value, str) else None



def clone_urls(target: str) -> list[str]:
    """The URLs to try to clone for the http(s) URL ``target``: a log's URL (ending in
    ``.git``) as it is; any other URL first as a stampd server's (the URL ``stampd stamp
    --server`` takes), whose log is ``<URL>/log.git``, then as it is (a log served without
    ``.git``)."""
    stripped = target.rstrip("/")
    if stripped.lower().endswith(".git"):
        return [target]
    return [f"{stripped}/log.git", target]


def _clone(url: str, dest: Path) -> str | None:
    """Clone ``url`` bare into ``dest``; None, or why it failed (one line of our own for
    TLS)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        r = subprocess.run(["git", "clone", "--bare", "--quiet", "--", url, str(dest)],
                           capture_output=True, text=True, env=env, timeout=CLONE_TIMEOUT,
                           check=False)
    except subprocess.TimeoutExpired:
        return f"cloning {url} timed out"
    if r.returncode == 0:
        return None
    shutil.rmtree(dest, ignore_errors=True)
    return tls_problem(url, r.stderr) or " ".join(r.stderr.split())


@contextlib.contextmanager
def cloned(target: str) -> Iterator[tuple[Path, str]]:
    """(the target as a local path, what it is called): a path itself, or a temporary bare
    clone of an http(s) URL (`clone_urls`), called by the URL cloned."""
    if not URL.match(target):
        yield Path(target), target
        return
    tmp = Path(tempfile.mkdtemp(prefix="stampd-audit-clone-"))
    try:
        dest = tmp / "log.git"
        urls = clone_urls(target)
        url, why = urls[0], _clone(urls[0], dest)
        if why is not None and len(urls) > 1:
            if _clone(urls[1], dest) is not None:  # (no log there either: the first reason)
                raise TargetError(f"cannot clone {url} (the log of a stampd server at "
                                  f"{target}), nor {target} itself: {why}")
            url, why = urls[1], None
        if why is not None:
            raise TargetError(f"cannot clone {url}: {why}")
        yield dest, url
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def local_copy(target: str) -> Iterator[Path]:
    """The target as a local path: itself, or a temporary bare clone of an http(s) URL (of a
    log, or of a stampd server: `clone_urls`)."""
    with cloned(target) as (path, _url):
        yield path
