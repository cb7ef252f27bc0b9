"""What a server command checks before it makes anything, each failing at once in one line:
the programs, the database, the listen address."""

from __future__ import annotations

from typing import Any

from server.errors import CommandFailed
from server.settings import Settings


def require_programs(settings: Settings, signs_here: bool = True) -> None:
    """Fail at once, in one line, when a program this host runs is missing or too old: gpg
    (every host reads OpenPGP keys), gpg-agent and gpgconf where keys sign, the OpenSSH tools
    where SSH keys sign (`workers.agents.programs`)."""
    from workers.agents.programs import GNUPG, OPENSSH, require

    needed = list(GNUPG) if signs_here else [p for p in GNUPG if p.name == "gpg"]
    if signs_here and any(spec.format == "ssh" for spec in settings.extra_key_specs):
        needed += OPENSSH
    require(needed)


def check_database(settings: Settings) -> None:
    """Fail at once, before the data directory or a key is made: a database driver that does
    not load (the URL's scheme is checked with the settings), a PostgreSQL server that does
    not answer. (A SQLite file is made in the data directory, so it is checked after.)"""
    from sqlalchemy.engine import make_url

    from server import db

    url = make_url(settings.db_url)
    try:
        url.get_dialect().import_dbapi()
    except ImportError as e:
        raise CommandFailed(f"the database driver {url.get_driver_name()} is not installed "
                            f"({e})", usage=True) from None
    path = db.sqlite_path(settings.db_url)
    if path is not None:
        folder = path.resolve().parent
        if not folder.is_dir() and settings.data_dir.resolve() not in (folder, *folder.parents):
            raise CommandFailed(f"the database's folder {folder} does not exist", usage=True)
    elif url.get_backend_name() != "sqlite":
        engine = db.make_engine(settings.db_url)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()


def require_migrated(engine: Any) -> None:
    """A worker host does not migrate the shared database (API hosts and `stampd db upgrade`
    do); it refuses to start on one that is not up to date."""
    from server import db

    current = db.current_revision(engine)
    if current != db.SCHEMA_HEAD:
        raise CommandFailed(f"the database is at schema revision {current or 'none'}, not "
                           f"{db.SCHEMA_HEAD}: run `stampd db upgrade` (or start an API host) "
                           "first (if a newer stampd migrated it, run that release here)")


def check_listen(host: str, port: int,
                 what: str = "--port/STAMPD_PORT or --host/STAMPD_HOST") -> None:
    """Fail at once, before anything is prepared or started, when the address cannot be
    listened on (in use, or not an address of this host)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except (OSError, ValueError) as e:  # (ValueError: a host name IDNA cannot encode)
            reason = (e.strerror if isinstance(e, OSError) else None) or str(e) or "bad address"
            raise CommandFailed(f"cannot listen on {host}:{port}: {reason} "
                               f"(set {what})") from None
