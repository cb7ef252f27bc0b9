"""The exit status and one-line message of every error a server command raises on purpose."""

from __future__ import annotations

import re

from pydantic import ValidationError

from server.commands.options import invalid_settings, one_line
from server.errors import CommandFailed

EXIT_FAILED = 1  # the command failed (a client command's own code where it has one)
EXIT_USAGE = 2  # bad arguments or settings (argparse uses 2 as well)


def exit_status(exc: Exception) -> tuple[int, str] | None:
    """(exit code, one-line message) of an error any command may raise; None for a bug,
    which is left to propagate with its traceback."""
    from keystore.errors import KeysError
    from server.errors import StampError
    from workers.errors import WorkerError

    if isinstance(exc, ValidationError):
        return EXIT_USAGE, invalid_settings(exc)
    if isinstance(exc, CommandFailed):
        return EXIT_USAGE if exc.usage else EXIT_FAILED, one_line(exc.message)
    # (the bases of the service's, the workers' and the key store's errors)
    if isinstance(exc, StampError | WorkerError | KeysError):
        return EXIT_FAILED, one_line(exc.message)
    from alembic.util.exc import CommandError as MigrationError
    from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, MigrationError):
        hint = ""
        if "not up to date" in str(exc):
            hint = " (run `stampd db upgrade`)"
        elif "Can't locate revision" in str(exc):  # a revision this release does not know
            hint = " (a newer stampd migrated it: run that release)"
        return EXIT_FAILED, one_line(f"database: {exc}{hint}")
    if isinstance(exc, ArgumentError):
        return EXIT_USAGE, one_line(f"invalid STAMPD_DATABASE_URL: {exc}")
    if isinstance(exc, DBAPIError):
        first = str(exc.orig or exc).strip().splitlines()[0] if str(exc.orig or exc) else ""
        if re.search(r'\brole "[^"]*" does not exist', first):
            first += " (create it first, e.g. `createuser -h HOST -U postgres USER`)"
        elif "does not exist" in first:
            first += " (create it first, e.g. `createdb -h HOST -U USER NAME`)"
        # (a refused statement, e.g. a constraint, is no outage)
        what = "unavailable" if isinstance(exc, OperationalError | InterfaceError) else "error"
        return EXIT_FAILED, one_line(f"database {what}: {first}")
    if isinstance(exc, OSError):
        return EXIT_FAILED, one_line(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    return None
