"""The one error base of the client commands (``stampd verify``, ``audit``, ``hook``).

A command raises a `CommandError` and never prints or exits itself: the ``stampd`` command line
prints ``stampd <command>: <str(error)>`` as one line on stderr (no traceback) and exits with
``error.exit_code``.
"""

from __future__ import annotations


class CommandError(Exception):
    """A client command failed.

    ``message``: what went wrong, one line; ``exit_code``: the command's exit status (a class
    attribute, which an instance may override); ``kind``: a word the one-line report puts
    before the message (``"invalid: ..."``), or None. ``str()`` is that report without the
    ``stampd <command>: `` prefix.
    """

    exit_code: int = 1
    kind: str | None = None

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.kind else self.message
