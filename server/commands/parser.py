"""The server's commands on the ``stampd`` command line's parser (`add_commands`), their
options' help naming each setting and its default; and the logging they run with."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.commands.db import cmd_db
from server.commands.keys import cmd_keys, cmd_tsa
from server.commands.serve import cmd_serve
from server.commands.worker import cmd_worker
from server.settings import Settings


def setup_logging(level: str | None = None) -> None:
    from server.http_processes import setup_logging

    setup_logging(level or os.environ.get("STAMPD_LOG_LEVEL", "INFO"))


def _common(p: argparse.ArgumentParser, inner: bool = False) -> None:
    """The data directory and database options. Commands with subcommands (db, keys) take
    them before or after the subcommand: ``keys --data-dir D show`` and ``keys show --data-dir
    D`` (an inner option only overrides when given)."""
    default = argparse.SUPPRESS if inner else None
    p.add_argument("--data-dir", type=Path, default=default,
                   help=_setting("data_dir", "data directory", "./var"))
    p.add_argument("--database-url", default=default,
                   help=_setting("database_url", "SQLAlchemy URL",
                                 "sqlite:///DATA_DIR/stampd.sqlite3"))


def _setting(name: str, text: str, default: str | None = None) -> str:
    """The help of an option that overrides the setting ``name``: ``TEXT (STAMPD_NAME;
    default: D)``, D its embedded default (`Settings`), or ``default`` where that says more
    (a default computed at start, a 0 that means one per CPU)."""
    if default is None:
        value = Settings.model_fields[name].default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        default = str(value) if value not in (None, "") else "none"
    return f"{text} (STAMPD_{name.upper()}; default: {default})"


def _with_subcommands(sub: Any, name: str, text: str, func: Callable[..., int]) -> Any:
    """The command ``name`` (db, keys, tsa), running ``func``, with the `_common` options;
    returns its subparsers (the subcommand in ``<name>_command``), to be given the same
    options after their own (`_common_inside`)."""
    p = sub.add_parser(name, help=text)
    _common(p)
    p.set_defaults(func=func)
    return p.add_subparsers(dest=f"{name}_command", required=True)


def _common_inside(subcommands: Any) -> None:
    """The `_common` options on each subcommand of `_with_subcommands`, after its own."""
    for p in subcommands.choices.values():
        _common(p, inner=True)


WORKERS_DEFAULT = "0, one per CPU it may run on"
API_PROCESSES_DEFAULT = "0, one per three CPUs, at least one"


def add_commands(sub: Any) -> None:
    """The server's commands (serve, worker, db, keys, tsa) on the ``stampd`` command line's
    subparsers ``sub``; each sets ``func``, which returns the exit status."""
    common = _common
    serve = sub.add_parser("serve", help="HTTP API, worker pool and log committer")
    common(serve)
    serve.add_argument("--host", help=_setting("host", "listen address"))
    serve.add_argument("--port", type=int, help=_setting("port", "listen port"))
    serve.add_argument("--workers", type=int,
                       help=_setting("workers", "signing processes", WORKERS_DEFAULT))
    serve.add_argument("--api-processes", type=int,
                       help=_setting("api_processes", "HTTP processes sharing the port",
                                     API_PROCESSES_DEFAULT))
    serve.add_argument("--commit-interval", type=float,
                       help=_setting("commit_interval", "seconds between log commits"))
    serve.add_argument("--own-url", help=_setting("own_url", "public URL written into stamps",
                                                  "http://HOST:PORT/"))
    serve.add_argument("--peers", help=_setting("peers", "peers stamping our log: "
                                                "name=URL[#FPR],..."))
    serve.add_argument("--witness", action="append", metavar="URL=VKEY",
                       help=_setting("witnesses", "a witness the transparency log sends its "
                                     "checkpoints to, by its submission prefix and cosignature "
                                     "verifier key; repeatable"))
    serve.add_argument("--witness-for", action="append", metavar="VKEY",
                       help=_setting("witness_for", "be a witness of the log of this checkpoint "
                                     "verifier key; repeatable, replaces the variable"))
    serve.add_argument("--no-workers", action="store_true",
                       help="run no worker pool here (workers come from `stampd worker`)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="only the signing worker pool")
    common(worker)
    worker.add_argument("--workers", type=int,
                        help=_setting("workers", "signing processes", WORKERS_DEFAULT))
    worker.add_argument("--api-processes", type=int,
                        help=_setting("api_processes", "HTTP processes of the stampd serve "
                                      "--no-workers whose dispatchers the workers serve; give "
                                      "it the same value", API_PROCESSES_DEFAULT))
    worker.set_defaults(func=cmd_worker)

    dbsub = _with_subcommands(sub, "db", "database migrations", cmd_db)
    up = dbsub.add_parser("upgrade", help="migrate the database to REVISION (default: the newest)")
    up.add_argument("revision", nargs="?", default="head")
    down = dbsub.add_parser("downgrade", help="migrate the database back to REVISION")
    down.add_argument("revision")
    dbsub.add_parser("check", help="fail if the schema differs from the models")
    _common_inside(dbsub)

    keysub = _with_subcommands(sub, "keys", "the signing key", cmd_keys)
    show = keysub.add_parser("show", help="fingerprint, user id, algorithm of every key")
    show.add_argument("--ssh", action="store_true",
                      help="print the allowed-signers lines of the SSH keys")
    gen = keysub.add_parser("generate", help="generate a new key (STAMPD_KEY_UID, _KEY_ALGO)")
    gen.add_argument("--key-uid", help=_setting(
        "key_uid", "user id, 'Name <email>'",
        "'stampd Timestamping Service <stampd@HOST>', HOST the host of STAMPD_OWN_URL, else "
        "this machine's name"))
    gen.add_argument("--key-algo", help=_setting("key_algo", "gpg algorithm name, e.g. ed25519, "
                                                 "rsa4096"))
    gen.add_argument("--force", action="store_true")
    imp = keysub.add_parser("import", help="import a secret key file")
    imp.add_argument("file", type=Path)
    export = keysub.add_parser(
        "export-public", help="write the public keys to DIR: a keys/ directory for an API "
        "host (no secret), and allowed_signers for verifiers")
    export.add_argument("dir", type=Path)
    reg = keysub.add_parser(
        "register", help="record this host's public keys in the database (a host that signs "
        "does so at start); --replace makes them the only registered keys, after a key was "
        "replaced on purpose")
    reg.add_argument("--replace", action="store_true")
    _common_inside(keysub)

    tsasub = _with_subcommands(sub, "tsa", "the RFC 3161 certificate (docs/tsa.md)", cmd_tsa)
    tsasub.add_parser("csr", help="write a certificate request for the TSA key (PEM)")
    certp = tsasub.add_parser(
        "import-cert", help="install the certificate chain a CA issued for the TSA key (PEM, "
        "the TSA certificate first)")
    certp.add_argument("file", type=Path)
    _common_inside(tsasub)
