"""`stampd audit`: verify a copy of the public log from the clone alone plus the keys it holds.

The log (see docs/log.md; written by `server.gitlog.repository`,
`server.gitlog.committer`) is a git repository. Its ``main`` branch is a linear chain of log
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
4. **tlog** (`client.audit.tlog`, with `--server`, or the target's URL less ``log.git``): the
   server's transparency log: its signed checkpoint, the tree rebuilt from its entry bundles
   and its hash tiles, both logs listing the same stamps, the git log's ``tlog-checkpoint``
   files and the checkpoints seen by earlier audits (`client.audit.state`) prefixes of today's
   tree.
5. **mailstamps** (`client.audit.mailstamps`): every ``<name>-mailstamps`` branch, the replies
   of an email timestamper: a merge chain over main commits like a peer's, each reply one
   clear-signed message that gpg verifies with the key the log published as
   ``mailstampers/<name>.asc`` and that quotes the request stampd sends for the stamped commit.
6. **coverage** (a report, never a failure): for each main commit, the earliest valid stamp (a
   peer's, or an email timestamper's at its signature's time) of it or of a later main commit,
   and the window ``stamp time - log commit time`` in which the server could have backdated it.

Signatures are checked with the real ``git verify-commit --raw`` and ``gpg`` in temporary
keyrings (one per key, ``no-autostart``: no agent is started). The repository's own config
cannot choose the verifying program: ``gpg.program`` is forced on the command line.

The modules, one concern each: `errors` (what stops an audit), `repository` (opening or cloning
the log, the refs audited, reading its objects), `logfiles` (the line checks of ``hashes.log``
and ``digests.log``), `signatures` (the single-key keyrings and ``git verify-commit``),
`report` (failures and the report, as text or JSON), `tlog` (the transparency-log check),
`state` (the checkpoints seen, kept between runs), `auditor` (the checks and `audit`),
`command` (`cmd_audit`). This package gives the API that the client's other commands, the
tests and the benchmarks use.
"""

from __future__ import annotations

from client.audit.auditor import audit
from client.audit.errors import AuditError, EmptyLog, TargetError
from client.audit.report import (
    FILES_CHECK,
    MAIL_CHECK,
    MAIN_CHECK,
    PEERS_CHECK,
    TLOG_CHECK,
    AuditReport,
    Failure,
)
from client.audit.repository import local_copy

__all__ = [
    "FILES_CHECK",
    "MAIL_CHECK",
    "MAIN_CHECK",
    "PEERS_CHECK",
    "TLOG_CHECK",
    "AuditError",
    "AuditReport",
    "EmptyLog",
    "Failure",
    "TargetError",
    "audit",
    "local_copy",
]
