"""The errors of ``stampd stamp``: no stamp (exit status 1), an unusable argument (2), an
answer refused (3)."""

from __future__ import annotations

from client.errors import CommandError


class StampFailed(CommandError):
    """No stamp: ``stampd stamp: <message>``, exit status 1 (the server could not be reached
    or answered an error, the server's key changed, git or gpg failed)."""


class UsageError(StampFailed):
    """An unusable argument or repository (no server, a bad name, an unknown commit, a tag
    that exists, a commit the branch stamps already): exit status 2."""

    exit_code = 2


class AnswerRefused(StampFailed):
    """The server answered, but not with a stamp that passes the checks: exit status 3;
    nothing was stored."""

    exit_code = 3
    kind = "refused"

