"""The errors that stop `stampd audit` before any check could run (exit status 2), and the
empty log: nothing to check yet (exit status 3)."""

from __future__ import annotations

from client.errors import CommandError


class AuditError(CommandError):
    """Base class of the errors that stop an audit before any check could run:
    ``stampd audit: <message>``, exit status 2."""

    exit_code = 2


class TargetError(AuditError):
    """The target is not a readable git repository, cannot be cloned, or has no main branch."""


class KeyFileError(AuditError):
    """An armored key file does not hold exactly one OpenPGP public key."""



# When a stampd server's log gets commits (docs/log.md, docs/settings.md): the server does not
# publish when its next one is due, so the messages about an empty log say the setting.
COMMIT_SCHEDULE = ("a stampd server makes a log commit every STAMPD_COMMIT_INTERVAL seconds "
                   "(3600 by default) in which it stamped something, the first one interval "
                   "after it starts")


class EmptyLog(AuditError):
    """The log has no commit yet (a new server's log, before its first log commit): nothing to
    check yet, not a failure. ``stampd audit: <message>``, exit status 3; ``meanwhile``: what
    was checked all the same (its transparency log), said after."""

    exit_code = 3

    def __init__(self, target: str, meanwhile: str = "") -> None:
        self.target = target
        super().__init__(f"{target}: the log has no commit yet, so there is nothing to check "
                         f"yet; {COMMIT_SCHEDULE}: audit again after that"
                         + (f"; {meanwhile}" if meanwhile else ""))
