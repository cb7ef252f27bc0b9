"""The errors that stop `stampd audit` before any check could run (exit status 2)."""

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

