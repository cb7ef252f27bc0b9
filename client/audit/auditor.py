"""The checks of `stampd audit` (see `client.audit`): the main chain, its files and signatures,
each peer branch with the key the log published for the peer, and the coverage of main commits
by peer stamps; `audit` runs them all and collects every failure."""

from __future__ import annotations

import bisect
import contextlib
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pygit2

from client.audit.errors import EmptyLog, KeyFileError, TargetError
from client.audit.logfiles import DIGEST_LINE, HASH_LINE, check_lines
from client.audit.mailstamps import check_mail_branch
from client.audit.report import (
    FILES_CHECK,
    MAIN_CHECK,
    PEERS_CHECK,
    TLOG_CHECK,
    AuditReport,
    Failure,
    LogEntry,
    PeerStamp,
    PeerSummary,
    TlogSummary,
)
from client.audit.repository import (
    REMOTE,
    SIG_BEGIN,
    AuditedRefs,
    audited_refs,
    open_repository,
    read_blob,
    ref_commit,
    ref_target,
    signature_headers,
    upstream_remote,
)
from client.audit.signatures import Keyring, Keyrings, SignatureCheck, verify_commit
from client.audit.state import SeenCheckpoints
from client.audit.tlog import (
    HttpSource,
    LogCommitStamps,
    TlogOptions,
    base_url,
    check_tlog,
    server_of,
)

PEER_NAME = re.compile(r"[A-Za-z0-9_][-A-Za-z0-9._]{0,99}")
LOG_NUMBER = re.compile(r"stampd log commit (\d+)\n")


class _Auditor:
    def __init__(self, repo: pygit2.Repository, target: str, peer_keys: Path | None,
                 keyrings: Keyrings, jobs: int, tlog: TlogOptions | None = None) -> None:
        self.repo = repo
        self.tlog = tlog
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
        sigs = signature_headers(raw)
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
            key = read_blob(self.repo, c.tree, "pubkey.asc")
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
            root_key = read_blob(self.repo, chain[0].tree, "pubkey.asc")
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
            data = read_blob(self.repo, c.tree, path)
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
            data = read_blob(self.repo, c.tree, path)
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
        head = ref_commit(self.repo, ref)
        tip = head or ref_target(self.repo, ref)  # what ref-level failures name
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

    # -- 5: the transparency log -------------------------------------------------------------
    def log_stamps(self, chain: Sequence[pygit2.Commit]) -> list[LogCommitStamps]:
        """What each log commit lists (lines that are not ids or digests are left out: the
        files check reports them)."""
        out = []
        for c in chain:
            hashes = read_blob(self.repo, c.tree, "hashes.log") or b""
            digests = read_blob(self.repo, c.tree, "digests.log") or b""
            out.append(LogCommitStamps(
                str(c.id), c.commit_time,
                frozenset(x for x in hashes.decode("ascii", "replace").split("\n")
                          if HASH_LINE.fullmatch(x)),
                frozenset(x for x in digests.decode("ascii", "replace").split("\n")
                          if DIGEST_LINE.fullmatch(x)),
                read_blob(self.repo, c.tree, "tlog-checkpoint")))
        return out

    def check_tlog(self, chain: Sequence[pygit2.Commit], refs: AuditedRefs | None,
                   options: TlogOptions) -> TlogSummary:
        server = options.server
        if server is None:
            server = server_of(self.target)
        if server is None:
            remote = (refs.remote if refs is not None else None) or REMOTE
            with contextlib.suppress(KeyError, ValueError, pygit2.GitError):
                server = server_of(self.repo.remotes[remote].url or "")
        if server is None:
            return TlogSummary(warnings=["no server: the target is no http(s) URL of a "
                                         "log.git, nor its remote's; give --server URL"])
        state = SeenCheckpoints.load(options.state) if options.state is not None else None

        def fail(rule: str, message: str, commit: str = "", path: str | None = None) -> None:
            self.fail(TLOG_CHECK, rule, message, commit, path)

        summary = check_tlog(HttpSource(base_url(server)), self.log_stamps(chain), state,
                             fail, jobs=self.jobs, slack=options.slack)
        if state is not None and summary.size is not None:
            state.save()
        return summary

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
        for name, ref in refs.mail.items():
            summary, valid = check_mail_branch(self.repo, self.keyrings, self.fail, name, ref,
                                               chain, main_index)
            report.mail.append(summary)
            stamps.extend(valid)
        self.cover(entries, stamps, main_index)
        if self.tlog is not None:
            report.tlog = self.check_tlog(chain, refs, self.tlog)
        report.failures = self.failures
        return report

    def run_empty(self, tlog: TlogOptions) -> AuditReport:
        """A log with no commit yet (a new server's, for its first STAMPD_COMMIT_INTERVAL):
        its transparency log, which has entries from the first stamp on, is checked alone."""
        report = AuditReport(self.target, None, None)
        report.tlog = self.check_tlog([], None, tlog)
        report.failures = self.failures
        return report


def audit(repo_path: Path | str, peer_keys: Path | None = None, *,
          target: str | None = None, jobs: int | None = None,
          tlog: TlogOptions | None = None) -> AuditReport:
    """Audit the log repository at ``repo_path`` (bare or not); raise `TargetError` if it is
    not a readable git repository or has no main branch, `EmptyLog` if it has no branch at all
    (no log commit yet) and ``tlog`` is None; with ``tlog``, the report of such a log is of its
    transparency log alone (``head`` None, `AuditReport.empty`). Errors name ``target`` (the
    URL of a cloned log) if given.

    ``peer_keys``: a directory of ``<name>.asc`` files, the auditor's own copies of peer keys.
    For a peer, such a file takes precedence over the log's pin ``peers/<name>.asc`` (a
    different pin in the log is a failure); without either, the peer's branch fails.

    ``tlog``: check the server's transparency log too (`client.audit.tlog`); None: not
    checked."""
    repo = open_repository(repo_path)
    try:
        refs = audited_refs(list(repo.references), upstream_remote(repo),
                            target or str(repo_path))
    except EmptyLog:
        if tlog is None:
            raise
        refs = None
    head = ref_commit(repo, refs.main) if refs is not None else None
    if refs is not None and head is None:
        raise TargetError(f"{repo_path}: {refs.main} does not point to a commit")
    with Keyrings() as keyrings:
        auditor = _Auditor(repo, target or str(repo_path), peer_keys, keyrings,
                           jobs or min(8, os.cpu_count() or 1), tlog)
        if refs is None or head is None:
            assert tlog is not None
            return auditor.run_empty(tlog)
        return auditor.run(head, refs)

