"""What `stampd audit` found: the failures, the log commits with their earliest peer stamps, the
peers; as JSON (`AuditReport.to_dict`) or text (`AuditReport.render`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from client.audit.errors import COMMIT_SCHEDULE
from client.audit.repository import MAIN

# Checks (groups of failures), in report order.
MAIN_CHECK = "main"
FILES_CHECK = "files"
PEERS_CHECK = "peers"
TLOG_CHECK = "tlog"
MAIL_CHECK = "mailstamps"  # the email timestampers' branches (client.audit.mailstamps)
CHECKS = (MAIN_CHECK, FILES_CHECK, PEERS_CHECK, MAIL_CHECK, TLOG_CHECK)


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


# What the transparency-log check found (`TlogSummary.status`).
TLOG_CHECKED = "checked"
TLOG_NOT_CHECKED = "not checked"  # no server known, or --no-tlog
TLOG_NONE = "no transparency log"  # the server answers 404 to /tlog/vkey
TLOG_NO_CHECKPOINT = "no checkpoint yet"
# The failures that show two histories of one transparency log: `stampd audit` exits 4.
FORK_RULES = frozenset({"git-checkpoint", "seen-checkpoint", "witness-fork"})
TLOG_FAILED = "failed"  # it could not be fetched or checked far enough to rebuild the tree


@dataclass
class TlogSummary:
    """What the transparency-log check (`client.audit.tlog`) found; its failures are in the
    report's ``failures`` (check ``tlog``), its warnings (not failures) in ``warnings``."""

    status: str = TLOG_NOT_CHECKED
    server: str | None = None
    origin: str | None = None
    vkey: str | None = None
    size: int | None = None
    root: str | None = None  # base64
    entries: dict[str, int] = field(default_factory=dict)  # per kind
    tiles: int = 0  # hash tiles compared with the rebuilt tree
    git_checkpoints: int = 0  # tlog-checkpoint files of log commits found consistent
    seen: int = 0  # checkpoints of earlier audits found consistent
    witnesses: int = 0  # witnesses' views of the log found consistent
    state: str | None = None  # the state file
    not_in_git_log: int = 0  # entries newer than the newest log commit (warning)
    not_in_tlog: int = 0  # stamps of the newest log commits not sequenced yet (warning)
    manifests: int = 0  # manifest entries (not matched against digests.log, see docs)
    warnings: list[str] = field(default_factory=list)


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
    """The result of `audit`: the log (oldest commit first), the peers and all failures; of a
    log with no commit yet (``head`` None: `empty`), the transparency log's alone."""

    target: str
    head: str | None
    fingerprint: str | None
    log: list[LogEntry] = field(default_factory=list)
    peers: list[PeerSummary] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    mail: list[PeerSummary] = field(default_factory=list)  # the <name>-mailstamps branches
    main_ref: str = f"refs/heads/{MAIN}"
    tlog: TlogSummary = field(default_factory=TlogSummary)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def empty(self) -> bool:
        """Whether the log has no commit yet (its transparency log alone was checked)."""
        return self.head is None

    @property
    def forked(self) -> bool:
        """Whether a failure shows two histories of the transparency log (`FORK_RULES`)."""
        return any(f.rule in FORK_RULES for f in self.failures)

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
            "mail_stampers": [asdict(m) for m in self.mail],
            "tlog": asdict(self.tlog),
            "failures": [asdict(f) for f in self.failures],
        }

    def render(self) -> str:
        """Human-readable report: one line per check group, the window table, the failures."""
        if self.empty:
            return self._render_empty()
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
        mail_failures = self.failures_of(MAIL_CHECK)
        for m in self.mail:
            key = f"key {m.fingerprint} from {m.key_source}" if m.fingerprint else "no key"
            out.append(_status_line(f"email timestamper {m.name} ({m.ref}): {m.valid} of "
                                    f"{m.commits} replies valid, {key}",
                                    [f for f in mail_failures if f.ref == m.ref]))
        rest = [f for f in mail_failures if f.ref not in {m.ref for m in self.mail}]
        if rest:
            out.append(_status_line("mailstamps", rest))
        out.extend(_tlog_lines(self.tlog, self.failures_of(TLOG_CHECK)))
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
            out.extend("  " + str(f).replace("\n", "\n    ") for f in self.failures)
        else:
            out.append("")
            out.append("OK: no problems found")
        return "\n".join(out)


    def _render_empty(self) -> str:
        out = [f"audit of {self.target}: no log commit yet ({COMMIT_SCHEDULE})",
               "main, files, peers: no log commit yet: nothing to check yet"]
        out.extend(_tlog_lines(self.tlog, self.failures_of(TLOG_CHECK), empty=True))
        out.append("")
        if self.failures:
            out.append(f"FAILED: {len(self.failures)} problem(s)")
            out.extend("  " + str(f).replace("\n", "\n    ") for f in self.failures)
        else:
            out.append("OK: no problems found in the transparency log; the git log has no "
                       "commit to check yet")
        return "\n".join(out)


def _tlog_lines(t: TlogSummary, failures: Sequence[Failure], empty: bool = False
                ) -> list[str]:
    if t.status == TLOG_NOT_CHECKED:
        why = "; ".join(t.warnings) or "not asked for"
        return [_status_line(f"tlog: not checked ({why})", failures)]
    if t.status in (TLOG_NONE, TLOG_NO_CHECKPOINT):
        return [_status_line(f"tlog: {t.server}: {t.status}", failures)]
    if t.status == TLOG_FAILED:
        head = f"tlog: {t.server}" + (f" ({t.origin})" if t.origin else "")
        return [_status_line(f"{head}: could not be checked", failures)]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(t.entries.items())) or "no entries"
    out = [_status_line(
        f"tlog: {t.origin} at size {t.size}: signed checkpoint, tree rebuilt from the entry "
        f"bundles ({kinds}), {t.tiles} hash tiles match, {t.git_checkpoints} git-log "
        f"checkpoints, {t.seen} seen before and {t.witnesses} witnesses' consistent", failures)]
    if not empty:
        out.append(f"tlog: stamps matched between the git log and the transparency log "
                   f"({t.manifests} manifest entries cannot be)"
                   + (f"; seen checkpoints kept in {t.state}" if t.state else ""))
    elif t.state:
        out.append(f"tlog: seen checkpoints kept in {t.state}")
    if t.not_in_git_log and empty:
        out.append(f"tlog: {t.not_in_git_log} entries not in the git log yet (it has no "
                   "commit yet)")
    elif t.not_in_git_log:
        out.append(f"tlog: {t.not_in_git_log} entries newer than the newest log commit: not in "
                   "the git log yet")
    if t.not_in_tlog:
        out.append(f"tlog: {t.not_in_tlog} stamps of the newest log commit(s) not in the "
                   "transparency log yet")
    out.extend(f"tlog: warning: {w}" for w in t.warnings)
    return out


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

