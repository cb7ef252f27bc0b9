"""The ``stampd`` command line: the client's commands (`client.cli`: stamp, verify, audit, hook)
and the server's (`server.commands`: serve, worker, db, keys, tsa). The client installs alone
(``pip install stampd``); without the server's dependencies (``pip install 'stampd[server]'``)
a server command says in one line what to install.

Only this module (and ``__main__`` blocks) may exit. Every error a command raises on purpose
ends here, once: one line on stderr (``stampd <command>: <message>``), no traceback, and the
documented exit code."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import select
import signal
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from client import cli as client_cli

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

EXIT_FAILED = 1  # the command failed (a client command's own code where it has one)
EXIT_USAGE = 2  # bad arguments or settings (argparse uses 2 as well)
EXIT_PIPE = 128 + signal.SIGPIPE  # standard output's reader went away (what a shell shows for
# a tool that SIGPIPE ended: `stampd keys show | head -1` ends as `yes | head -1` does)

SERVER_COMMANDS = ("serve", "worker", "db", "keys", "tsa")
INSTALL_SERVER = "pip install 'stampd[server]'"


def version() -> str:
    """The installed distribution's version (pyproject.toml's when installed from a clone)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("stampd")
    except PackageNotFoundError:  # (run from a checkout that was never installed)
        return "(not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but help and usage written to a standard output whose reader has gone
    raise `BrokenPipeError` (argparse ignores it), so that `main` ends every command alike."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None
                       ) -> None:
        if message:
            (file or sys.stderr).write(message)


class _Version(argparse.Action):
    """``--version``: print ``stampd VERSION`` and exit 0 (the version looked up only then)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "print the version and exit"
                 ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"stampd {version()}")
        parser.exit()


class BadLogLevel(ValueError):
    """STAMPD_LOG_LEVEL is no level name."""


def _server_commands() -> ModuleType | None:
    """`server.commands`, or None where the server's dependencies are not installed."""
    try:
        from server import commands
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in {"stampd", "server", "workers", "client", "formats"}:
            raise  # a module of ours is missing: a broken install, not a client-only one
        return None
    return commands


def _not_installed(name: str) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        print(f"stampd {name}: the server is not installed here: {INSTALL_SERVER}",
              file=sys.stderr)
        return EXIT_USAGE

    return run


@functools.cache
def parser(server: ModuleType | None) -> argparse.ArgumentParser:
    """The command line's parser, with the server's commands (``server``) or their names only
    (None). Built once a process: it reads nothing from the environment, and building it takes
    ~20 ms (argparse looks a translation up for each of its ~70 strings, and it has 22
    parsers); parsing leaves it as it was."""
    ap = _Parser(
        prog="stampd",
        description="stampd: a timestamping server for git (Zeitgitter protocol) and digests. "
        "`stampd serve` runs it (data in ./var by default); `stampd stamp`, `verify`, "
        "`audit` and `hook` are for users of any stampd server. Every setting is also an "
        "environment variable STAMPD_<NAME>.",
        epilog="Exit status: 0 success; 1 the command failed (one line on stderr says why); "
        "2 bad arguments or settings; 141 standard output was closed by its reader (`| head`), "
        "quietly. stamp, verify and audit have their own (see their --help).")
    ap.add_argument("--version", action=_Version)
    ap.add_argument("--log-level", default=None, type=_log_level,
                    help="DEBUG, INFO, WARNING, ERROR (STAMPD_LOG_LEVEL)")
    sub = ap.add_subparsers(dest="command", required=True)
    if server is not None:
        server.add_commands(sub)
    else:
        for name in SERVER_COMMANDS:
            p = sub.add_parser(name, help=f"(needs the server: {INSTALL_SERVER})",
                               add_help=False)
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(func=_not_installed(name))
    client_cli.add_commands(sub)
    _own_usage(ap)
    return ap


def _own_usage(ap: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser remembers itself (``usage_parser``), so that an argument
    none of them knows is reported with the usage of the command it was given to."""
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                p.set_defaults(usage_parser=p)
                _own_usage(p)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    """A level name of `LOG_LEVELS`, in any case (argparse's ``type`` of ``--log-level``)."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def _setup_logging(server: ModuleType | None, level: str | None) -> None:
    if level is None:
        level = os.environ.get("STAMPD_LOG_LEVEL", "INFO")
        if level.upper() not in LOG_LEVELS:
            raise BadLogLevel(f"invalid setting: STAMPD_LOG_LEVEL: {level!r} is not one of "
                              f"{', '.join(LOG_LEVELS)}")
        level = level.upper()
    if server is not None:
        server.setup_logging(level)
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def exit_status(exc: Exception, server: ModuleType | None = None) -> tuple[int, str] | None:
    """(exit code, one-line message) of an error a command raised on purpose; None for a
    bug, which is left to propagate with its traceback."""
    status: tuple[int, str] | None = client_cli.exit_status(exc)
    if status is None:  # (the server's mapping is imported only for an error it may know)
        server = server or _server_commands()
        if server is not None:
            status = server.exit_status(exc)
    return status


@functools.cache
def _client_commands() -> frozenset[str]:
    """The names of the client's commands (`client.cli.add_commands`; built once a process)."""
    sub = argparse.ArgumentParser().add_subparsers()
    client_cli.add_commands(sub)
    return frozenset(sub.choices)


def _names_client_command(argv: list[str]) -> bool:
    """Whether ``argv`` runs a client command: its first word, after ``--log-level LEVEL`` if
    that comes first, names one. Anything else (a server command, top-level help, an
    abbreviated or unknown option) is not recognised here and gets the full parser."""
    rest = argv
    if rest[:1] == ["--log-level"]:
        rest = rest[2:]
    elif rest[:1] and rest[0].startswith("--log-level="):
        rest = rest[1:]
    return bool(rest) and rest[0] in _client_commands()


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (Linux reports POLLERR for
    the writing end of a pipe without readers), so that a `BrokenPipeError` was its."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # (no real file: captured, closed)
        return False


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Standard output is flushed before returning: when its
    reader has gone (``stampd keys show | head -1``), the command ends quietly, as Unix tools
    do, with `EXIT_PIPE`, whichever command it was, and nothing more is written to it."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:  # (standard output's: the flush, or passed on by _main)
        # The rest of what is buffered goes nowhere, also when Python flushes it at exit.
        with contextlib.suppress(OSError, ValueError):  # (no real file: nothing to redirect)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return EXIT_PIPE


def _main(argv: list[str] | None) -> int:
    """Run one command (`main`).

    A client command (verify, audit, stamp, hook) does not import `server.commands`: that
    import (settings, pydantic-settings, the supervisor) is ~0.3 s of CPU, most of what
    starting `stampd verify` costs. Its parser then lists the server's commands by name only;
    that list is seen in the top-level usage (the same words) and help (not shown for a
    client command). An error of a client command that the client does not map is still
    mapped by the server's `exit_status` (`exit_status` imports it then)."""
    words = sys.argv[1:] if argv is None else argv
    server = None if _names_client_command(words) else _server_commands()
    ap = parser(server)
    args, unknown = ap.parse_known_args(argv)
    if unknown:  # (argparse would print the top-level usage)
        getattr(args, "usage_parser", ap).error(f"unrecognized arguments: {' '.join(unknown)}")
    name = " ".join(n for n in (args.command, getattr(args, "hook_command", None)) if n)
    try:
        _setup_logging(server, args.log_level)
    except BadLogLevel as e:
        print(f"stampd {name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    func: Any = args.func
    try:
        return int(func(args))
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_closed():
            raise  # (`main` ends quietly)
        status = exit_status(e, server)
        if status is None:
            raise
        code, message = status
        print(f"stampd {name}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
