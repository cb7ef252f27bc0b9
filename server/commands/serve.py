"""``stampd serve``: the HTTP API (one process, or several sharing the port), the worker pool
and the log committer, once every check passed and the data directory is prepared."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal

from formats.keys import ServedKey
from server.commands.checks import check_database, check_listen, require_programs
from server.commands.datadir import SERVE_LOCK, WORKERS_LOCK, DataDirLock, make_data_dir
from server.commands.options import build_settings
from server.commands.registration import adopt_tsa_chain, register_keys, register_tsa_chain
from server.settings import Settings
from server.supervisor import PoolProcess, child_env

log = logging.getLogger("stampd")


def cmd_serve(args: argparse.Namespace) -> int:
    settings = build_settings(args)
    count = settings.api_process_count
    settings = settings.model_copy(update={"api_processes": count})  # (the same in each)
    with contextlib.ExitStack() as held:
        # Nothing is made before every check passed: a running server here, the address, the
        # programs, the database. (The lock is checked first where it exists, and taken for
        # good once the data directory may be made.)
        locks = [DataDirLock(settings.run_dir, SERVE_LOCK, "stampd serve")]
        if not args.no_workers:
            locks.append(DataDirLock(settings.run_dir, WORKERS_LOCK,
                                     "the worker pool of stampd serve"))
        for lock in locks:
            held.callback(lock.release)
            lock.acquire(create=False)
        check_listen(settings.host, settings.port)
        if settings.mail_inbound is not None:
            check_listen(*settings.mail_inbound.listen, what="STAMPD_MAIL_LISTEN")
        require_programs(settings, signs_here=not args.no_workers)
        check_database(settings)
        make_data_dir(settings)
        for lock in locks:
            lock.acquire()
        return _serve(args, settings)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    count = settings.api_process_count
    if count == 1:
        return _serve_one(args, settings)
    from server.http_processes import ApiManager, listeners, serve_processes

    # The HTTP manager is forked first: while this process has one thread, and before it
    # has read a key or a passphrase (server.http_processes).
    socks = listeners(settings.host, settings.port, count)
    manager = ApiManager(settings, socks, logging.getLevelName(
        logging.getLogger().getEffectiveLevel()), child_env())
    try:
        manager.start()
        _keys, pool = _start_signing(args, settings, count)
        try:
            serve_processes(manager, settings)
        finally:
            if pool is not None:
                pool.stop()
    finally:
        manager.stop()
        for sock in socks:
            sock.close()
    return 0


def _prepare(settings: Settings, signs_here: bool = True) -> list[ServedKey]:
    """Data directory, keys (generated on first start; a host that keeps only public keys
    never gets new ones, and must not sign: ``signs_here``), migrated database, log
    repository. Returns the keys this server serves."""
    from keystore.keyset import ensure_extra_keys
    from keystore.store import KeyStore
    from server import db
    from server.gitlog.repository import LogRepository
    from server.signing_keys import serving_keys

    make_data_dir(settings)
    if signs_here:  # an API host never makes a key: it serves the registered ones
        store = KeyStore(settings.keys_dir)
        passphrase = settings.read_passphrase()
        if store.ensure(settings.key_uid, settings.key_algo, passphrase):
            log.info("generated signing key %s", store.public_key().fingerprint)
        ensure_extra_keys(settings.keys_dir, settings.extra_key_specs,
                          store.public_key().uid, passphrase)
    engine = db.make_engine(settings.db_url)  # a new SQLite file is created 0600
    try:
        db.upgrade(engine)
        if signs_here:
            register_keys(settings, engine)
        keys = serving_keys(settings.keys_dir, settings.extra_key_specs, settings.dispatch,
                            engine)
    finally:
        engine.dispose()
    path = db.sqlite_path(settings.db_url)
    if path is not None and path.exists() and path.stat().st_mode & 0o077:
        log.warning("database %s is accessible to others (mode %o): chmod 600 it and its "
                    "-wal and -shm files", path, path.stat().st_mode & 0o777)
    LogRepository(settings.log_repo)
    return keys


def _start_signing(args: argparse.Namespace, settings: Settings,
                   count: int) -> tuple[list[ServedKey], PoolProcess | None]:
    """Keys, database and log prepared, the worker pool started (unless ``--no-workers``)
    once every key made a good test signature; the start-up line logged."""
    keys = _prepare(settings, signs_here=not args.no_workers)
    pool = None if args.no_workers else PoolProcess(settings)
    if pool is not None:
        adopt_tsa_chain(settings)
        pool.start()  # after every key made a good test signature
        try:
            register_tsa_chain(settings)
        except BaseException:
            pool.stop()
            raise
    log.info("serving %s from %s: database %s, keys %s, %s, %d HTTP process%s",
             settings.public_url, settings.data_dir.resolve(), _safe_url(settings.db_url),
             _key_summary(keys),
             "no workers here (--no-workers)" if args.no_workers else
             f"{settings.worker_count} workers" + (f" + {settings.extra_key_workers} per extra "
                                                   "key" if settings.extra_key_specs else ""),
             count, "" if count == 1 else "es")
    return keys, pool


def _serve_one(args: argparse.Namespace, settings: Settings) -> int:
    """One HTTP process: this one."""
    from server.http_processes import run_uvicorn

    keys, pool = _start_signing(args, settings, 1)

    # uvicorn handles SIGTERM/SIGINT itself and re-raises the signal when it is done; with
    # this handler in place the re-raised signal unwinds through `finally` (stopping the
    # pool) instead of killing the process.
    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    # (Imported only here: with several HTTP processes the HTTP manager imports the app, the
    # supervisor need not.)
    from server.api.app import create_app

    try:
        run_uvicorn(create_app(settings, before_shutdown=pool.stop if pool is not None else None,
                               keys=keys), settings)
    except SystemExit as e:
        if e.code != 128 + signal.SIGTERM:
            raise
    finally:
        if pool is not None:
            pool.stop()
    return 0


def _safe_url(url: str) -> str:
    """A database URL without its password, for the log."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _key_summary(keys: list[ServedKey]) -> str:
    return ", ".join(f"{k.id} {k.fingerprint}" for k in keys)
