"""`stampd audit`: verify a copy of the public log from the clone alone plus the keys it holds.

The log (see docs/log.md; written by `server.log.repository`,
`server.log.committer`) is a git repository. Its ``main`` branch is a linear chain of log
commits, each signed by the server key that its own ``pubkey.asc`` holds, with the period's
``hashes.log`` (and ``digests.log``). Each branch ``<name>-timestamps`` is a merge chain of
stamp-branch-v1 stamps of main commits made by peer ``<name>``, whose key the server pinned as
``peers/<name>.asc`` in the main tree.

Which refs: in a clone with remote-tracking refs (``git fetch`` moves those, not the local
branches) the remote's ``refs/remotes/<remote>/main`` and ``<name>-timestamps`` refs, what the
remote published; the remote is the local main's upstream remote, else ``origin``, else the only
one (see `audited_refs`). In a bare or mirror clone, or the server's own ``log.git``, the local
``refs/heads/``.

`audit` runs every check and collects every failure (it does not stop at the first one); each
failure names the commit it concerns and the rule it breaks (``[<check>/<rule>] <commit> ...``):

1. **main**: linear; every commit carries exactly one OpenPGP ``gpgsig`` that `git verify-commit`
   accepts with the key of the commit's own ``pubkey.asc`` (one key, nothing else in the
   keyring); the signature time equals the committer time; the key is the root commit's key.
2. **files**: ``hashes.log`` holds 40-hex (SHA-1) or 64-hex (SHA-256) object ids,
   ``digests.log`` ``<algorithm> <hex>`` lines (sha256 or sha512 receipts; sha384, and sha1
   where allowed, from RFC 3161); both
   sorted and unique, one entry per newline-terminated line.
3. **peers**: every commit of a ``<name>-timestamps`` branch is signed by the peer's pinned key,
   with the signature time equal to its committer time; its last parent is a main commit whose
   tree it carries; its first parent (if it has two) is the previous stamp of the chain.
   A stamp's key is the one the log published for the peer: ``peers/<name>.asc`` of the first
   main commit at or after the stamped one that has it (a key pinned on first contact is
   published only from the next log commit on), else of the newest one before it; the log must
   publish one key per peer (a change is a failure). ``<name>.asc`` from a directory the auditor
   passes (``--peer-keys``) wins over the log's. With no key at all, stamps of the main head
   await the key's publication (not verified, covering nothing, not a failure); stamps of
   earlier main commits fail.
4. **coverage** (a report, never a failure): for each main commit, the earliest valid peer stamp
   of it or of a later main commit, and the window ``stamp time - log commit time`` in which the
   server could have backdated it.

Signatures are checked with the real ``git verify-commit --raw`` and ``gpg`` in temporary
keyrings (one per key, ``no-autostart``: no agent is started). The repository's own config
cannot choose the verifying program: ``gpg.program`` is forced on the command line.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pygit2
from pygit2.enums import RepositoryOpenFlag

from client.errors import CommandError
from client.gpg import GpgError, SignatureStatus, TempGpgHome

MAIN = "main"
PEER_SUFFIX = "-timestamps"
REMOTE = "origin"
REMOTES_PREFIX = "refs/remotes/"
HASH_LINE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 repositories
DIGEST_LINE = re.compile(
    r"sha1 [0-9a-f]{40}|sha256 [0-9a-f]{64}|sha384 [0-9a-f]{96}|sha512 [0-9a-f]{128}")
PEER_NAME = re.compile(r"[A-Za-z0-9_][-A-Za-z0-9._]{0,99}")
LOG_NUMBER = re.compile(r"stampd log commit (\d+)\n")
SIG_BEGIN = b"-----BEGIN PGP SIGNATURE-----"
SIG_HEADERS = (b"gpgsig", b"gpgsig-sha256")
URL = re.compile(r"https?://", re.IGNORECASE)
GIT_TIMEOUT = 120.0
CLONE_TIMEOUT = 600.0
MAX_LINE_PROBLEMS = 5

# Checks (groups of failures), in report order.
MAIN_CHECK = "main"
FILES_CHECK = "files"
PEERS_CHECK = "peers"
CHECKS = (MAIN_CHECK, FILES_CHECK, PEERS_CHECK)


class AuditError(CommandError):
    """Base class of the errors that stop an audit before any check could run:
    ``stampd audit: <message>``, exit status 2."""

    exit_code = 2


class TargetError(AuditError):
    """The target is not a readable git repository, cannot be cloned, or has no main branch."""


class KeyFileError(AuditError):
    """An armored key file does not hold exactly one OpenPGP public key."""


# -- report -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    """One failed check: the check group, the rule broken (a short name, listed in
    docs/log.md), and the commit it concerns (with the peer branch and the file, if any).

    Written ``[<check>/<rule>] <commit> [<ref>] [<path>]: <message>``."""

    check: str
    rule: str
    message: str
    commit: str
    path: str | None = None
    ref: str | None = None

    def __str__(self) -> str:
        where = " ".join(x for x in (self.commit, self.ref, self.path) if x)
        return f"[{self.check}/{self.rule}] {where}: {self.message}"


@dataclass(frozen=True)
class PeerStamp:
    """A verified stamp of a main commit by a peer."""

    peer: str
    commit: str
    stamped: str
    time: int


@dataclass
class LogEntry:
    """One main commit and its earliest covering peer stamp (None: uncovered)."""

    commit: str
    number: int | None
    time: int
    hashes: int
    digests: int
    stamp: PeerStamp | None = None

    @property
    def window(self) -> int | None:
        """Seconds between the log commit and its earliest peer stamp."""
        return None if self.stamp is None else self.stamp.time - self.time


@dataclass
class PeerSummary:
    """What was found on one peer branch."""

    name: str
    ref: str
    commits: int = 0
    valid: int = 0
    pending: int = 0  # stamps of the main head awaiting the publication of the peer's key
    fingerprint: str | None = None
    key_source: str | None = None


@dataclass
class AuditReport:
    """The result of `audit`: the log (oldest commit first), the peers and all failures."""

    target: str
    head: str
    fingerprint: str | None
    log: list[LogEntry] = field(default_factory=list)
    peers: list[PeerSummary] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    main_ref: str = f"refs/heads/{MAIN}"

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def uncovered(self) -> list[str]:
        return [e.commit for e in self.log if e.stamp is None]

    def failures_of(self, check: str) -> list[Failure]:
        return [f for f in self.failures if f.check == check]

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "ok": self.ok,
            "head": self.head,
            "main_ref": self.main_ref,
            "server_fingerprint": self.fingerprint,
            "log": [{**asdict(e), "window": e.window} for e in self.log],
            "uncovered": self.uncovered,
            "peers": [asdict(p) for p in self.peers],
            "failures": [asdict(f) for f in self.failures],
        }

    def render(self) -> str:
        """Human-readable report: one line per check group, the window table, the failures."""
        out = [f"audit of {self.target}: main ({self.main_ref}) at {self.head}, "
               f"{len(self.log)} log commits, server key {self.fingerprint or 'unknown'}"]
        out.append(_status_line(
            f"main: {len(self.log)} commits signed by the server key",
            self.failures_of(MAIN_CHECK)))
        out.append(_status_line(
            f"files: hashes.log/digests.log of {len(self.log)} commits sorted and unique",
            self.failures_of(FILES_CHECK)))
        peer_failures = self.failures_of(PEERS_CHECK)
        if not self.peers:
            out.append(_status_line("peers: no peer branches", peer_failures))
        for p in self.peers:
            if p.fingerprint:
                key = f"key {p.fingerprint} from {p.key_source}"
            elif p.pending:  # only without any key: then a stamp has none to verify it
                key = (f"key not yet in the log, {p.pending} stamp(s) of the main head "
                       "awaiting its publication by the next log commit (not verified, "
                       "covering nothing)")
            else:
                key = "no pinned key"
            mine = [f for f in peer_failures if f.ref == p.ref]
            out.append(_status_line(
                f"peer {p.name} ({p.ref}): {p.valid} of {p.commits} stamps valid, {key}", mine))
        rest = [f for f in peer_failures if f.ref not in {p.ref for p in self.peers}]
        if rest:
            out.append(_status_line("peers", rest))
        covered = len(self.log) - len(self.uncovered)
        out.append(f"coverage: {covered} of {len(self.log)} log commits stamped by a peer"
                   + (f", {len(self.uncovered)} uncovered" if self.uncovered else ""))
        out.append("")
        out.append(f"  {'#':>6}  {'log commit':12}  {'log time (UTC)':19}  {'peer':12}  "
                   f"{'stamp time (UTC)':19}  window")
        for e in reversed(self.log):
            number = "-" if e.number is None else str(e.number)
            if e.stamp is None:
                tail = f"{'-':12}  {'-':19}  uncovered"
            else:
                tail = (f"{e.stamp.peer:12}  {_utc(e.stamp.time)}  "
                        f"{_duration(e.window or 0)}")
            out.append(f"  {number:>6}  {e.commit[:12]}  {_utc(e.time)}  {tail}")
        if self.failures:
            out.append("")
            out.append(f"FAILED: {len(self.failures)} problem(s)")
            out.extend(f"  {f}" for f in self.failures)
        else:
            out.append("")
            out.append("OK: no problems found")
        return "\n".join(out)


def _status_line(what: str, failures: Sequence[Failure]) -> str:
    return f"{what}: " + (f"FAILED ({len(failures)})" if failures else "ok")


def _utc(t: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _duration(seconds: int) -> str:
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s} s"
    if s < 3600:
        return f"{sign}{s // 60} min {s % 60} s"
    return f"{sign}{s // 3600} h {s % 3600 // 60} min"


# -- keys and signatures ------------------------------------------------------------------------
@dataclass(frozen=True)
class Keyring:
    """A GNUPGHOME holding exactly one public key."""

    home: Path
    fingerprint: str


@dataclass(frozen=True)
class SignatureCheck:
    """The outcome of `git verify-commit --raw` in one keyring."""

    valid: bool
    fingerprint: str | None  # primary key fingerprint from VALIDSIG
    created: int | None
    problem: str | None


class Keyrings:
    """Temporary single-key GNUPGHOMEs, one per distinct armored key; removed on `close`."""

    def __init__(self) -> None:
        self._homes: list[TempGpgHome] = []
        self._cache: dict[bytes, Keyring | KeyFileError] = {}

    def close(self) -> None:
        for home in self._homes:
            home.close()
        self._homes.clear()

    def __enter__(self) -> Keyrings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, armored: bytes) -> Keyring:
        """The keyring of ``armored``; raise `KeyFileError` unless it holds exactly one key."""
        digest = hashlib.sha256(armored).digest()
        if digest not in self._cache:
            try:
                self._cache[digest] = self._create(armored)
            except KeyFileError as e:
                self._cache[digest] = e
        found = self._cache[digest]
        if isinstance(found, KeyFileError):
            raise found
        return found

    def _create(self, armored: bytes) -> Keyring:
        # No agent or dirmngr (a public keyring needs none; gpg.conf says so to the gpg that
        # git starts too); no trust database.
        try:
            home = TempGpgHome("stampd-a", conf=("trust-model always",))
            self._homes.append(home)
            if not home.import_keys(armored).ok:
                raise KeyFileError("is not an armored OpenPGP public key")
            keys = home.list_keys()
        except GpgError as e:
            raise AuditError(e.message) from None
        if len(keys) != 1:
            raise KeyFileError(f"holds {len(keys)} public keys, expected exactly one")
        return Keyring(home.path, keys[0].fingerprint)


def _gpg_problem(status: SignatureStatus, fingerprint: str) -> str:
    """A short explanation of why gpg did not accept a signature."""
    for words in status.records:
        if len(words) < 2:
            continue
        kw = words[0]
        # ERRSIG <keyid> <pkalgo> <hashalgo> <class> <time> <rc> [<fpr>]
        rc = words[6] if kw == "ERRSIG" and len(words) > 6 else None
        signer = words[7] if rc is not None and len(words) > 7 and words[7] != "-" \
            else words[1]
        if kw == "BADSIG":
            return "BAD signature (the commit was changed after it was signed)"
        if rc == "9" or kw == "NO_PUBKEY":
            return f"made by key {signer}, not by {fingerprint}"
        if kw == "EXPKEYSIG":
            return f"made by expired key {words[1]}"
        if kw == "REVKEYSIG":
            return f"made by revoked key {words[1]}"
        if kw == "EXPSIG":
            return "the signature has expired"
        if kw == "ERRSIG":
            return f"gpg cannot check the signature by {signer} (ERRSIG rc={rc})"
    return "gpg did not accept the signature"


def verify_commit(git_dir: Path, commit: str, keyring: Keyring) -> SignatureCheck:
    """`git verify-commit --raw` with ``keyring`` as GNUPGHOME; parse gpg's status lines."""
    env = {**os.environ, "GNUPGHOME": str(keyring.home), "LC_ALL": "C"}
    r = subprocess.run(
        ["git", "-c", "gpg.program=gpg", "-c", "gpg.openpgp.program=gpg",
         "--git-dir", str(git_dir), "verify-commit", "--raw", commit],
        capture_output=True, env=env, timeout=GIT_TIMEOUT, check=False,
    )
    status = SignatureStatus.parse(r.stderr.decode("utf-8", "replace"))
    if r.returncode != 0 or not status.validsig:
        return SignatureCheck(False, None, None, _gpg_problem(status, keyring.fingerprint))
    if status.validsig != 1 or status.goodsig != 1:
        return SignatureCheck(False, None, None, f"holds {max(status.validsig, status.goodsig)} "
                              "signatures, expected one")
    if not status.valid_sigs:  # a VALIDSIG line gpg would not write
        return SignatureCheck(False, None, None, "gpg's VALIDSIG status line is malformed")
    sig = status.valid_sigs[0]
    return SignatureCheck(True, sig.primary, sig.created, None)


# -- git objects --------------------------------------------------------------------------------
def _signature_headers(raw: bytes) -> list[bytes]:
    """Values (first line) of the signature headers of a raw commit object."""
    head = raw.split(b"\n\n", 1)[0]
    found = []
    for line in head.split(b"\n"):
        name, _, value = line.partition(b" ")
        if name in SIG_HEADERS:
            found.append(value)
    return found


def _blob(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> bytes | None:
    try:
        obj = tree[path]
    except KeyError:
        return None
    blob = repo[obj.id]
    return blob.data if isinstance(blob, pygit2.Blob) else None


def check_lines(data: bytes, pattern: re.Pattern[str], what: str) -> list[str]:
    """Problems of a sorted-unique line file (``hashes.log``, ``digests.log``); [] if none."""
    problems: list[str] = []
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return ["is not ASCII"]
    if text and not text.endswith("\n"):
        problems.append("does not end with a newline")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    previous: str | None = None
    extra = 0
    for number, line in enumerate(lines, 1):
        problem = None
        if not pattern.fullmatch(line):
            problem = f"line {number} is not {what}: {line[:80]!r}"
        elif previous is not None and line == previous:
            problem = f"line {number} repeats line {number - 1} ({line[:20]}...)"
        elif previous is not None and line < previous:
            problem = f"line {number} is not sorted (it sorts before line {number - 1})"
        if problem:
            if len(problems) < MAX_LINE_PROBLEMS:
                problems.append(problem)
            else:
                extra += 1
        previous = line
    if extra:
        problems.append(f"and {extra} more problem(s)")
    return problems


# -- the audit --------------------------------------------------------------------------------
def open_repository(path: Path | str) -> pygit2.Repository:
    """Open exactly ``path`` (no search in parent directories); raise `TargetError`."""
    try:
        return pygit2.Repository(str(path), RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, KeyError, ValueError, OSError) as e:
        raise TargetError(f"{path} is not a readable git repository: {e}") from None


def _ref_commit(repo: pygit2.Repository, name: str) -> str | None:
    try:
        ref = repo.references[name].resolve()
        obj = repo[ref.target].peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return str(obj.id)


def _ref_target(repo: pygit2.Repository, name: str) -> str:
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
    return AuditedRefs(main, peers, remote)


def _upstream_remote(repo: pygit2.Repository) -> str | None:
    """The remote of the local main's upstream (``branch.main.remote``), if configured."""
    try:
        value = repo.config[f"branch.{MAIN}.remote"]
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return value if isinstance(value, str) else None


class _Auditor:
    def __init__(self, repo: pygit2.Repository, target: str, peer_keys: Path | None,
                 keyrings: Keyrings, jobs: int) -> None:
        self.repo = repo
        self.git_dir = Path(repo.path)
        self.target = target
        self.peer_keys = peer_keys
        self.keyrings = keyrings
        self.jobs = jobs
        self.failures: list[Failure] = []

    def fail(self, check: str, rule: str, message: str, commit: str,
             path: str | None = None, ref: str | None = None) -> None:
        self.failures.append(Failure(check, rule, message, commit, path, ref))

    def commit(self, oid: str) -> pygit2.Commit:
        obj = self.repo[oid]
        assert isinstance(obj, pygit2.Commit)
        return obj

    def parent(self, child: str, oid: str, check: str, ref: str | None = None
               ) -> pygit2.Commit | None:
        """The parent ``oid`` of ``child``; a failure if the clone lacks it (shallow)."""
        try:
            obj = self.repo[oid]
        except (KeyError, ValueError):
            obj = None
        if isinstance(obj, pygit2.Commit):
            return obj
        self.fail(check, "missing-parent", f"parent {oid} is missing or not a commit "
                  "(incomplete or shallow clone?)", child, ref=ref)
        return None

    def verify_all(self, jobs: Sequence[tuple[str, Keyring]]) -> list[SignatureCheck]:
        """Verify many commits concurrently (each check is a git and a gpg process)."""
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(lambda j: verify_commit(self.git_dir, j[0], j[1]), jobs))

    def signature_header(self, oid: str, check: str, ref: str | None = None) -> bool:
        """Exactly one OpenPGP signature header; a failure otherwise."""
        raw = self.repo[oid].read_raw()
        sigs = _signature_headers(raw)
        if not sigs:
            self.fail(check, "unsigned", "is not signed (no gpgsig header)", oid, ref=ref)
            return False
        if len(sigs) > 1:
            self.fail(check, "one-signature", f"has {len(sigs)} signature headers, expected "
                      "exactly one", oid, ref=ref)
            return False
        if not sigs[0].startswith(SIG_BEGIN):
            self.fail(check, "not-openpgp", "gpgsig is not an OpenPGP signature", oid, ref=ref)
            return False
        return True

    # -- 1 and 2: main -----------------------------------------------------------------------
    def main_chain(self, head: str) -> list[pygit2.Commit]:
        """First-parent chain from ``head``, oldest first; a merge is a failure."""
        chain = []
        commit: pygit2.Commit | None = self.commit(head)
        while commit is not None:
            chain.append(commit)
            if len(commit.parent_ids) > 1:
                self.fail(MAIN_CHECK, "linear", f"is a merge of {len(commit.parent_ids)} "
                          "commits; the main branch must be linear", str(commit.id))
            commit = (self.parent(str(commit.id), str(commit.parent_ids[0]), MAIN_CHECK)
                      if commit.parent_ids else None)
        chain.reverse()
        return chain

    def check_main(self, chain: Sequence[pygit2.Commit]) -> tuple[str | None, list[LogEntry]]:
        entries: list[LogEntry] = []
        jobs: list[tuple[str, Keyring]] = []
        for c in chain:
            oid = str(c.id)
            hashes, digests = self.check_files(c)
            match = LOG_NUMBER.match(c.message)
            entries.append(LogEntry(oid, int(match.group(1)) if match else None,
                                    c.commit_time, hashes, digests))
            signed = self.signature_header(oid, MAIN_CHECK)
            key = _blob(self.repo, c.tree, "pubkey.asc")
            if key is None:
                self.fail(MAIN_CHECK, "pubkey-missing", "has no pubkey.asc: its signature "
                          "cannot be checked", oid, "pubkey.asc")
                continue
            try:
                keyring = self.keyrings.get(key)
            except KeyFileError as e:
                self.fail(MAIN_CHECK, "pubkey-invalid", e.message, oid, "pubkey.asc")
                continue
            if signed:
                jobs.append((oid, keyring))
        results = dict(zip([j[0] for j in jobs], self.verify_all(jobs), strict=True))
        keys = dict(jobs)

        root_fpr: str | None = None
        if chain:
            root_key = _blob(self.repo, chain[0].tree, "pubkey.asc")
            with contextlib.suppress(KeyFileError):
                root_fpr = self.keyrings.get(root_key).fingerprint if root_key else None
        previous = root_fpr
        for c in chain:
            oid = str(c.id)
            if oid not in results:
                continue
            check = results[oid]
            expected = keys[oid].fingerprint
            if not check.valid:
                self.fail(MAIN_CHECK, "bad-signature", "signature does not verify with the key "
                          f"of its pubkey.asc ({expected}): {check.problem}", oid)
                continue
            if check.fingerprint != expected:
                self.fail(MAIN_CHECK, "signer", f"signed by {check.fingerprint}, but its "
                          f"pubkey.asc holds {expected}", oid)
            if check.created != c.commit_time:
                self.fail(MAIN_CHECK, "signature-time", f"signature time {check.created} "
                          f"differs from the committer time {c.commit_time}", oid)
            if previous is None:
                previous = check.fingerprint
            if check.fingerprint != previous:
                self.fail(MAIN_CHECK, "key-changed", f"server key changed at {oid}: signed by "
                          f"{check.fingerprint}, the root commit's key is {root_fpr}", oid,
                          "pubkey.asc")
                previous = check.fingerprint
        return root_fpr, entries

    def check_files(self, c: pygit2.Commit) -> tuple[int, int]:
        """Check ``hashes.log`` and ``digests.log``; return their line counts."""
        oid = str(c.id)
        counts = []
        for path, pattern, what, required in (
            ("hashes.log", HASH_LINE, "a 40- or 64-digit lowercase hex object id", True),
            ("digests.log", DIGEST_LINE, "'sha1|sha256|sha384|sha512 <lowercase hex digest>'",
             False),
        ):
            data = _blob(self.repo, c.tree, path)
            if data is None:
                if required:
                    self.fail(FILES_CHECK, "missing", "is missing", oid, path)
                counts.append(0)
                continue
            for problem in check_lines(data, pattern, what):
                self.fail(FILES_CHECK, "format", problem, oid, path)
            counts.append(data.count(b"\n"))
        return counts[0], counts[1]

    # -- 3: peers ----------------------------------------------------------------------------
    def published_keys(self, name: str, ref: str, chain: Sequence[pygit2.Commit]
                       ) -> list[tuple[int, str, Keyring]]:
        """The keys the log published for peer ``name``: (main index, commit, key) of every main
        commit holding ``peers/<name>.asc``, oldest first. A published key that differs from
        the one published before it is a failure (rule ``key-changed``)."""
        path = f"peers/{name}.asc"
        found: list[tuple[int, str, Keyring]] = []
        for i, c in enumerate(chain):
            data = _blob(self.repo, c.tree, path)
            if data is None:
                continue
            oid = str(c.id)
            try:
                keyring = self.keyrings.get(data)
            except KeyFileError as e:
                self.fail(PEERS_CHECK, "key-invalid", e.message, oid, path, ref)
                continue
            if found and found[-1][2].fingerprint != keyring.fingerprint:
                before = found[-1]
                self.fail(PEERS_CHECK, "key-changed", f"the log's key for peer {name} changed: "
                          f"{keyring.fingerprint} here, {before[2].fingerprint} in {before[1]}; "
                          "a peer's pinned key must not change", oid, path, ref)
            found.append((i, oid, keyring))
        return found

    def check_peer(self, name: str, ref: str, chain: Sequence[pygit2.Commit],
                   main_index: dict[str, int]) -> tuple[PeerSummary, list[PeerStamp]]:
        """Check one peer branch. Each stamp is verified with the key the log published for
        the peer: ``peers/<name>.asc`` of the first main commit at or after the stamped one
        that has it (the key is pinned on first contact, after the commit that contact stamps
        was made, and published from the next log commit on), else of the newest one before
        it; an auditor's ``--peer-keys`` file wins for every stamp, and each published key
        that differs from it is a failure. Without any key, stamps of the main head await the
        key's publication (not verified, no coverage, no failure); any other stamp is a
        failure (``key-missing``)."""
        summary = PeerSummary(name, ref)
        head = _ref_commit(self.repo, ref)
        tip = head or _ref_target(self.repo, ref)  # what ref-level failures name
        if not PEER_NAME.fullmatch(name) or ".." in name:
            self.fail(PEERS_CHECK, "peer-name", f"unsupported peer name {name!r}", tip, ref=ref)
            return summary, []

        path = f"peers/{name}.asc"
        published = self.published_keys(name, ref, chain)
        given: tuple[Keyring, str] | None = None
        usable = True
        file = self.peer_keys / f"{name}.asc" if self.peer_keys is not None else None
        if file is not None and file.is_file():
            try:
                given = (self.keyrings.get(file.read_bytes()), str(file))
            except KeyFileError as e:
                self.fail(PEERS_CHECK, "key-invalid", f"{file} {e.message}; the branch's stamps "
                          "are not verified", tip, ref=ref)
                usable = False
        if given is not None:
            shown: str | None = None
            for _, oid, keyring in published:
                if keyring.fingerprint not in (shown, given[0].fingerprint):
                    self.fail(PEERS_CHECK, "key-mismatch", f"the log pins {keyring.fingerprint} "
                              f"({path} in {oid}), but {given[1]} holds {given[0].fingerprint}",
                              oid, path, ref)
                shown = keyring.fingerprint
            summary.fingerprint, summary.key_source = given[0].fingerprint, given[1]
        elif published:
            summary.fingerprint = published[-1][2].fingerprint
            summary.key_source = f"{path} in {published[-1][1]}"
        indexes = [i for i, _, _ in published]

        def key_for(stamped: str) -> Keyring | None:
            if given is not None:
                return given[0]
            if not published:
                return None
            i = main_index.get(stamped)
            at = len(published) if i is None else bisect.bisect_left(indexes, i)
            return published[min(at, len(published) - 1)][2]

        if head is None:
            self.fail(PEERS_CHECK, "ref", "does not point to a commit", tip, ref=ref)
        # (stamp, stamped main commit, whether its shape is right), newest first
        stamps: list[tuple[pygit2.Commit, str, bool]] = []
        c: pygit2.Commit | None = self.commit(head) if head else None
        while c is not None:
            oid = str(c.id)
            summary.commits += 1
            parents = [str(p) for p in c.parent_ids]
            previous: str | None = None
            if len(parents) == 2:
                previous = parents[0]
            elif len(parents) != 1:
                self.fail(PEERS_CHECK, "parents", f"has {len(parents)} parents; a stamp has the "
                          "stamped main commit as last parent, after the previous stamp", oid,
                          ref=ref)
                break
            stamped = parents[-1]
            shaped = True
            if stamped not in main_index:
                self.fail(PEERS_CHECK, "not-main", f"stamps {stamped}, which is not a commit of "
                          "the main branch", oid, ref=ref)
                shaped = False
            elif c.tree_id != self.commit(stamped).tree_id:
                self.fail(PEERS_CHECK, "tree", f"has tree {c.tree_id}, but the stamped main "
                          f"commit {stamped} has tree {self.commit(stamped).tree_id}", oid,
                          ref=ref)
                shaped = False
            if previous is not None and previous in main_index:
                self.fail(PEERS_CHECK, "chain", f"first parent {previous} is a main commit, not "
                          "the previous stamp of the branch", oid, ref=ref)
                previous = None
                shaped = False
            if self.signature_header(oid, PEERS_CHECK, ref):
                stamps.append((c, stamped, shaped))
            c = self.parent(oid, previous, PEERS_CHECK, ref) if previous else None

        if not usable:
            return summary, []
        last = len(chain) - 1
        jobs: list[tuple[pygit2.Commit, str, bool, Keyring]] = []
        missing: list[str] = []
        for c, stamped, shaped in stamps:
            key = key_for(stamped)
            if key is not None:
                jobs.append((c, stamped, shaped, key))
            elif main_index.get(stamped) == last:
                summary.pending += 1
            else:
                missing.append(str(c.id))
        if missing:
            self.fail(PEERS_CHECK, "key-missing", f"no pinned key for peer {name}: no {path} in "
                      "any main commit" + (f" and no {name}.asc in {self.peer_keys}"
                                           if self.peer_keys else "")
                      + f"; {len(missing)} stamp(s) of main commits that have later ones cannot "
                      "be verified (the log publishes a pinned key from the commit after the "
                      "pin on: only stamps of the main head may await it)", missing[0], ref=ref)
        results = self.verify_all([(str(c.id), keyring) for c, _, _, keyring in jobs])
        valid: list[PeerStamp] = []
        for (c, stamped, shaped, keyring), check in zip(jobs, results, strict=True):
            oid = str(c.id)
            if not check.valid:
                self.fail(PEERS_CHECK, "bad-signature", f"signature does not verify with peer "
                          f"{name}'s key {keyring.fingerprint}: {check.problem}", oid, ref=ref)
            elif check.fingerprint != keyring.fingerprint:
                self.fail(PEERS_CHECK, "signer", f"signed by {check.fingerprint}, not by peer "
                          f"{name}'s key {keyring.fingerprint}", oid, ref=ref)
            elif check.created != c.commit_time:
                self.fail(PEERS_CHECK, "signature-time", f"signature time {check.created} "
                          f"differs from the committer time {c.commit_time}", oid, ref=ref)
            elif shaped:
                valid.append(PeerStamp(name, oid, stamped, c.commit_time))
        summary.valid = len(valid)
        return summary, valid

    # -- 4: coverage ---------------------------------------------------------------------------
    @staticmethod
    def cover(entries: list[LogEntry], stamps: Sequence[PeerStamp],
              main_index: dict[str, int]) -> None:
        """Give each entry the earliest stamp of it or of a later main commit."""
        best: list[PeerStamp | None] = [None] * len(entries)
        for s in stamps:
            i = main_index[s.stamped]
            current = best[i]
            if current is None or (s.time, s.peer) < (current.time, current.peer):
                best[i] = s
        earliest: PeerStamp | None = None
        for i in range(len(entries) - 1, -1, -1):
            here = best[i]
            if here is not None and (earliest is None or
                                     (here.time, here.peer) < (earliest.time, earliest.peer)):
                earliest = here
            entries[i].stamp = earliest

    def run(self, head: str, refs: AuditedRefs) -> AuditReport:
        chain = self.main_chain(head)
        fingerprint, entries = self.check_main(chain)
        main_index = {str(c.id): i for i, c in enumerate(chain)}
        report = AuditReport(self.target, head, fingerprint, entries, main_ref=refs.main)
        stamps: list[PeerStamp] = []
        for name, ref in refs.peers.items():
            summary, valid = self.check_peer(name, ref, chain, main_index)
            report.peers.append(summary)
            stamps.extend(valid)
        self.cover(entries, stamps, main_index)
        report.failures = self.failures
        return report


def audit(repo_path: Path | str, peer_keys: Path | None = None, *,
          target: str | None = None, jobs: int | None = None) -> AuditReport:
    """Audit the log repository at ``repo_path`` (bare or not); raise `TargetError` if it is
    not a readable git repository or has no main branch.

    ``peer_keys``: a directory of ``<name>.asc`` files, the auditor's own copies of peer keys.
    For a peer, such a file takes precedence over the log's pin ``peers/<name>.asc`` (a
    different pin in the log is a failure); without either, the peer's branch fails."""
    repo = open_repository(repo_path)
    refs = audited_refs(list(repo.references), _upstream_remote(repo), str(repo_path))
    head = _ref_commit(repo, refs.main)
    if head is None:
        raise TargetError(f"{repo_path}: {refs.main} does not point to a commit")
    with Keyrings() as keyrings:
        auditor = _Auditor(repo, target or str(repo_path), peer_keys, keyrings,
                           jobs or min(8, os.cpu_count() or 1))
        return auditor.run(head, refs)


@contextlib.contextmanager
def local_copy(target: str) -> Iterator[Path]:
    """The target as a local path: itself, or a temporary bare clone of an http(s) URL."""
    if not URL.match(target):
        yield Path(target)
        return
    tmp = Path(tempfile.mkdtemp(prefix="stampd-audit-clone-"))
    try:
        dest = tmp / "log.git"
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        try:
            r = subprocess.run(["git", "clone", "--bare", "--quiet", "--", target, str(dest)],
                               capture_output=True, text=True, env=env,
                               timeout=CLONE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise TargetError(f"cloning {target} timed out") from None
        if r.returncode != 0:
            raise TargetError(f"cannot clone {target}: {r.stderr.strip()}")
        yield dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_audit(args: argparse.Namespace) -> int:
    """``stampd audit TARGET [--json] [--peer-keys DIR]``: 0 ok, 1 failures; an unreadable
    target raises an `AuditError` (exit status 2)."""
    target = str(args.target)
    peer_keys = getattr(args, "peer_keys", None)
    with local_copy(target) as path:
        report = audit(path, Path(peer_keys) if peer_keys else None, target=target)
    if getattr(args, "json", False):
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1
