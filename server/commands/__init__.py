"""The server's commands of the ``stampd`` command line (`stampd.cli`): serve, worker, db,
keys, tsa; and the mapping of every error they raise on purpose to an exit status."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from formats.keys import ServedKey
from server.errors import CommandFailed
from server.settings import Settings
from server.supervisor import PoolProcess, child_env, pool_config

log = logging.getLogger("stampd")


def build_settings(args: argparse.Namespace) -> Settings:
    """The settings: the environment's, overridden by the options given. A bad value fails
    in one line naming where it came from: the option (``--workers``) when one was given,
    else the variable (``STAMPD_WORKERS``)."""
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "data_dir", "workers", "api_processes", "database_url",
                 "commit_interval", "own_url", "key_uid", "key_algo", "peers"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "witness", None):  # (--witness, repeatable: the list STAMPD_WITNESSES)
        overrides["witnesses"] = ",".join(args.witness)
    if getattr(args, "witness_for", None):  # (--witness-for: STAMPD_WITNESS_FOR, overridden)
        given = [v.strip() for v in args.witness_for]
        # (an empty one is refused as the setting would be, not dropped by the join)
        overrides["witness_for"] = ",".join(given) if all(given) else ""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise CommandFailed(invalid_settings(e, given=set(overrides)), usage=True) from None


# settings whose option is not named as they are
_OPTIONS = {"witnesses": "--witness", "witness_for": "--witness-for"}


def invalid_settings(exc: ValidationError, given: Collection[str] = ()) -> str:
    """The one-line message of a pydantic ``ValidationError`` of `Settings`: each problem
    with the option that set it (names in ``given``) or else its environment variable."""
    problems = []
    for e in exc.errors():
        where = ""
        if e["loc"]:
            name = str(e["loc"][0])
            where = (_OPTIONS.get(name, f"--{name.replace('_', '-')}") if name in given
                     else f"STAMPD_{name.upper()}") + ": "
        msg = str(e["msg"]).removeprefix("Value error, ")
        problems.append(where + msg)
    return _one_line("invalid setting: " + "; ".join(problems))


def setup_logging(level: str | None = None) -> None:
    from server.api.processes import setup_logging

    setup_logging(level or os.environ.get("STAMPD_LOG_LEVEL", "INFO"))


def _make_data_dir(settings: Settings) -> None:
    """The data directory, made private (0700) if it does not exist yet: it holds the secret
    keys, the journal and the workers' homes (the systemd units make it 0700 too). Its parents
    are made as the umask says; a data directory that exists is left as it is."""
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)


def _prepare(settings: Settings, signs_here: bool = True) -> list[ServedKey]:
    """Data directory, keys (generated on first start; a host that keeps only public keys
    never gets new ones, and must not sign: ``signs_here``), migrated database, log
    repository. Returns the keys this server serves."""
    from server import db
    from server.gitlog.repository import LogRepository
    from server.signing_keys import serving_keys
    from workers.keys.keyset import ensure_extra_keys
    from workers.keys.store import KeyStore

    _make_data_dir(settings)
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
            _register_keys(settings, engine)
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


def _require_migrated(engine: Any) -> None:
    """A worker host does not migrate the shared database (API hosts and `stampd db upgrade`
    do); it refuses to start on one that is not up to date."""
    from server import db

    current = db.current_revision(engine)
    if current != db.SCHEMA_HEAD:
        raise CommandFailed(f"the database is at schema revision {current or 'none'}, not "
                           f"{db.SCHEMA_HEAD}: run `stampd db upgrade` (or start an API host) "
                           "first (if a newer stampd migrated it, run that release here)")


def _adopt_tsa_chain(settings: Settings) -> None:
    """With several hosts, a worker host whose TSA key has no certificate chain yet takes the
    one registered in the database (by the host that made it), so that every host's tokens
    name the same certificate; the worker supervisor checks it is for this key."""
    spec = settings.tsa_spec
    if settings.dispatch != "database" or spec is None:
        return
    from server import db
    from server.signing_keys import registered_certificates
    from workers.tsa import TSA_CHAIN_FILE, parse_chain, write_chain

    chain = settings.keys_dir / spec.id / TSA_CHAIN_FILE
    if chain.exists() or not chain.parent.is_dir():
        return
    engine = db.make_engine(settings.db_url)
    try:
        registered = registered_certificates(engine, spec.id)
    finally:
        engine.dispose()
    if registered:
        write_chain(chain.parent, parse_chain(registered.encode()))
        log.info("took the registered TSA certificate chain of key %s into %s", spec.id, chain)


def _register_tsa_chain(settings: Settings, replace: bool = False) -> None:
    """With several hosts, the TSA certificate chain the worker supervisor made (or found) is
    registered with the TSA key, so that API hosts without key files serve it."""
    spec = settings.tsa_spec
    if settings.dispatch != "database" or spec is None:
        return
    from server import db
    from server.signing_keys import register_certificates
    from workers.tsa import TSA_CHAIN_FILE

    chain = settings.keys_dir / spec.id / TSA_CHAIN_FILE
    if not chain.exists():  # (the supervisor's key check makes it; the server says it lacks)
        return
    engine = db.make_engine(settings.db_url)
    try:
        register_certificates(engine, spec.id, chain.read_text(), replace=replace)
    finally:
        engine.dispose()


def _register_keys(settings: Settings, engine: Any, replace: bool = False) -> int:
    """Register the public halves of the keys this host signs with (`server.signing_keys`);
    returns how many."""
    from server.signing_keys import register, this_host
    from workers.keys.keyset import served_keys

    keys = served_keys(settings.keys_dir, settings.extra_key_specs)
    register(engine, settings.keys_dir, keys, this_host(settings.data_dir), replace=replace)
    return len(keys)


def _require_programs(settings: Settings, signs_here: bool = True) -> None:
    """Fail at once, in one line, when a program this host runs is missing or too old: gpg
    (every host reads OpenPGP keys), gpg-agent and gpgconf where keys sign, the OpenSSH tools
    where SSH keys sign (`workers.agents.programs`)."""
    from workers.agents.programs import GNUPG, OPENSSH, require

    needed = list(GNUPG) if signs_here else [p for p in GNUPG if p.name == "gpg"]
    if signs_here and any(spec.format == "ssh" for spec in settings.extra_key_specs):
        needed += OPENSSH
    require(needed)


SERVE_LOCK = "serve.lock"  # in run/: held by the one `stampd serve` of a data directory
WORKERS_LOCK = "workers.lock"  # in run/: held by whichever runs its workers (serve or worker)


class DataDirLock:
    """An exclusive ``flock`` on ``<data_dir>/run/<name>``, held for as long as the process
    lives (the kernel frees it when the process dies, however it dies; the descriptor is
    close-on-exec, and a forked child closes it, so no child inherits it), with the holder's
    PID and command in the file.

    One `stampd serve` per data directory (`SERVE_LOCK`): a second would send its workers to
    the first one's dispatch socket and delete that socket when it exits. One worker pool per
    data directory (`WORKERS_LOCK`): `stampd serve` with workers, or `stampd worker` beside a
    `stampd serve --no-workers`."""

    held: set[DataDirLock] = set()  # (the locks this process holds; see _drop_in_child)

    def __init__(self, run_dir: Path, name: str, holder: str) -> None:
        self.path = run_dir / name
        self.holder = holder
        self.fd: int | None = None

    def acquire(self, create: bool = True) -> None:
        """Take the lock, or raise `CommandFailed` naming the process that holds it. With
        ``create`` false, nothing is made: where the lock file does not exist (no server ever
        ran here), nothing is taken either (take it later, when the data directory may be
        made)."""
        import fcntl

        if self.fd is not None:
            return
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0),
                         0o600)
        except FileNotFoundError:
            if create:
                raise
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            pid = held[0] if held and held[0].isdigit() else "unknown"
            raise CommandFailed(
                f"{' '.join(held[1:]) or 'another stampd'} (pid {pid}) is running on data "
                f"directory {self.path.parent.parent}: stop it first, or give this one another "
                "--data-dir") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.holder}\n".encode(), 0)
        self.fd = fd
        DataDirLock.held.add(self)

    def release(self) -> None:
        DataDirLock.held.discard(self)
        if self.fd is not None:
            os.close(self.fd)  # (frees the lock)
            self.fd = None

    @classmethod
    def _drop_in_child(cls) -> None:
        """In a child forked from a holder (the HTTP manager): close the inherited
        descriptors, or the lock would outlive the holder as long as the child."""
        for lock in cls.held:
            if lock.fd is not None:
                os.close(lock.fd)
                lock.fd = None
        cls.held.clear()


os.register_at_fork(after_in_child=DataDirLock._drop_in_child)


def _check_database(settings: Settings) -> None:
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
        _check_listen(settings.host, settings.port)
        _require_programs(settings, signs_here=not args.no_workers)
        _check_database(settings)
        _make_data_dir(settings)
        for lock in locks:
            lock.acquire()
        return _serve(args, settings)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    count = settings.api_process_count
    if count == 1:
        return _serve_one(args, settings)
    from server.api.processes import ApiManager, listeners, serve_processes

    # The HTTP manager is forked first: while this process has one thread, and before it
    # has read a key or a passphrase (server.api.processes).
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


def _start_signing(args: argparse.Namespace, settings: Settings,
                   count: int) -> tuple[list[ServedKey], PoolProcess | None]:
    """Keys, database and log prepared, the worker pool started (unless ``--no-workers``)
    once every key made a good test signature; the start-up line logged."""
    keys = _prepare(settings, signs_here=not args.no_workers)
    pool = None if args.no_workers else PoolProcess(settings)
    if pool is not None:
        _adopt_tsa_chain(settings)
        pool.start()  # after every key made a good test signature
        try:
            _register_tsa_chain(settings)
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
    from server.api.processes import run_uvicorn

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


def _check_listen(host: str, port: int) -> None:
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
                               "(set --port/STAMPD_PORT or --host/STAMPD_HOST)") from None


def _safe_url(url: str) -> str:
    """A database URL without its password, for the log."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _key_summary(keys: list[ServedKey]) -> str:
    return ", ".join(f"{k.id} {k.fingerprint}" for k in keys)


def cmd_worker(args: argparse.Namespace) -> int:
    settings = build_settings(args)
    lock = DataDirLock(settings.run_dir, WORKERS_LOCK, "stampd worker")
    try:
        lock.acquire(create=False)
        _require_programs(settings)
        _check_database(settings)
        _make_data_dir(settings)
        lock.acquire()
        return _work(settings)
    finally:
        lock.release()


def _work(settings: Settings) -> int:
    from server import db
    from workers.pool import WorkerPool

    if settings.dispatch == "database":  # a worker host: API hosts serve what it registers
        engine = db.make_engine(settings.db_url)
        try:
            _require_migrated(engine)
            _register_keys(settings, engine)
        finally:
            engine.dispose()
    _adopt_tsa_chain(settings)
    pool = WorkerPool(pool_config(settings), env=child_env())
    pool.prepare(check_keys=True)  # a key that cannot sign stops the start here, in one line
    _register_tsa_chain(settings)
    return pool.run()


def cmd_tsa(args: argparse.Namespace) -> int:
    """``stampd tsa csr``: a PKCS #10 request for the TSA key, signed through an agent (PEM on
    stdout); ``stampd tsa import-cert FILE``: install a chain issued for it, after checking it
    is for this key and carries the critical time-stamping EKU (docs/tsa.md)."""
    import tempfile

    from formats.tsp import certificates
    from workers import tsa

    settings = build_settings(args)
    spec = settings.tsa_spec
    if spec is None:
        raise CommandFailed("RFC 3161 is off (STAMPD_TSA=false)", usage=True)
    key_dir = settings.keys_dir / spec.id
    if not tsa.secret_key_file(key_dir, spec.format).exists():
        raise CommandFailed(f"no TSA key in {key_dir}: start `stampd serve` (or `stampd worker`) "
                           "once on this host to generate it")
    pem = b""
    if args.tsa_command == "import-cert":
        try:
            pem = args.file.read_bytes()
        except OSError as e:
            raise CommandFailed(f"cannot read {args.file}: {e.strerror}") from None
    _require_programs(settings)
    with tempfile.TemporaryDirectory(prefix="stampd-tsa-") as home, \
            tsa.open_key(key_dir, spec.format, Path(home), settings.read_passphrase()) as key:
        if args.tsa_command == "csr":
            csr = tsa.csr(key, settings.tsa_common_name)
            print(certificates.pem(csr, "CERTIFICATE REQUEST"), end="")
            return 0
        chain = tsa.check_import(key.public_key_info, pem)
    path = tsa.write_chain(key_dir, chain)
    _register_tsa_chain(settings, replace=True)
    print(f"installed a chain of {len(chain)} certificate(s) in {path}; restart stampd to "
          "serve it")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from server import db

    settings = build_settings(args)
    if args.db_command in ("upgrade", "downgrade"):
        known = db.revisions()  # (checked before anything is made: a typo creates nothing)
        if args.revision not in (*known, "head", "base"):
            raise CommandFailed(f"unknown revision {args.revision!r}: this release knows "
                                f"{known[0]} to {known[-1]}, head and base", usage=True)
    _make_data_dir(settings)
    engine = db.make_engine(settings.db_url)
    try:
        if args.db_command == "upgrade":
            db.upgrade(engine, args.revision)
        elif args.db_command == "downgrade":
            db.downgrade(engine, args.revision)
        else:
            db.check(engine)
            print("schema matches the models")
    finally:
        engine.dispose()
    return 0


def export_public(keys_dir: Path, specs: list[Any], target: Path) -> None:
    """Copy the public half of every key in ``keys_dir`` to ``target`` in the key store's own
    layout (``pubkey.asc``, ``<id>/pubkey.asc``, ``<id>/id.pub``), so that ``target`` can be an
    API host's ``keys/``; plus ``allowed_signers`` (SSH keys) for verifiers. No secret key is
    read."""
    import shutil

    from formats.keys import allowed_signers
    from workers.keys.keyset import SshKeyStore, key_dir, served_keys
    from workers.keys.store import KeyStore

    keys = served_keys(keys_dir, specs)  # checks every public key parses
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KeyStore(keys_dir).public_key_file, target / "pubkey.asc")
    for spec in specs:
        src = key_dir(keys_dir, spec)
        public = (KeyStore(src).public_key_file if spec.format == "openpgp"
                  else SshKeyStore(src).public_key_file)
        (target / spec.id).mkdir(exist_ok=True)
        shutil.copyfile(public, target / spec.id / public.name)
    signers = allowed_signers(keys)
    if signers:
        (target / "allowed_signers").write_text(signers)
    print(f"public keys of {len(keys)} signing key(s) written to {target}")


def cmd_keys(args: argparse.Namespace) -> int:
    from workers.keys.store import KeyStore

    settings = build_settings(args)
    store = KeyStore(settings.keys_dir)
    if args.keys_command in ("generate", "import"):
        _make_data_dir(settings)
    if args.keys_command == "generate":
        if store.exists() and not args.force:
            raise CommandFailed(f"a key exists in {store.dir}; use --force to replace it")
        store.generate(settings.key_uid, settings.key_algo, settings.read_passphrase())
    elif args.keys_command == "import":
        store.import_key(args.file, settings.read_passphrase())
    from formats.keys import (
        TLOG_KEY,
        WITNESS_KEY,
        KeySpec,
        allowed_signers,
        tlog_vkey,
        witness_vkey,
    )
    from workers.keys.keyset import served_keys, stored_key_specs

    # The configured extra keys (and the log key), and any other the data directory holds.
    stored = stored_key_specs(settings.keys_dir)
    specs = settings.extra_key_specs
    specs += [s for s in stored if s not in specs]
    missing: list[KeySpec] = []
    if args.keys_command in ("show", "generate", "import"):
        # A key the server makes at its first start may not be there yet: named, not needed.
        missing = [s for s in specs if s not in stored]
        specs = [s for s in specs if s in stored]
    keys = served_keys(settings.keys_dir, specs)
    if args.keys_command == "export-public":
        export_public(settings.keys_dir, specs, args.dir)
        return 0
    if args.keys_command == "register":
        from server import db

        _make_data_dir(settings)
        engine = db.make_engine(settings.db_url)
        try:
            db.upgrade(engine)
            count = _register_keys(settings, engine, replace=args.replace)
        finally:
            engine.dispose()
        print(f"registered {count} signing key(s) in the database"
              + (" (replacing every other registration)" if args.replace else ""))
        return 0
    if getattr(args, "ssh", False):
        signers = allowed_signers(keys)
        if not signers:
            raise CommandFailed(f"no SSH key in {settings.keys_dir} "
                               "(set STAMPD_EXTRA_KEYS=ssh:ed25519 and start the server once)")
        print(signers, end="")
        return 0
    key = store.public_key()
    print(f"fingerprint: {key.fingerprint}\nuser id:     {key.uid}\n"
          f"algorithm:   {key.algorithm}\npublic key:  {store.public_key_file}")
    for extra in keys[1:]:
        print(f"\nkey {extra.id}:\n  format:      {extra.format}\n"
              f"  fingerprint: {extra.fingerprint}\n  algorithm:   {extra.algorithm}")
    for extra in keys[1:]:
        if extra.id == TLOG_KEY.id:  # what verifiers of the log's checkpoints are given
            try:
                vkey = tlog_vkey(settings.tlog_origin, extra.public)
            except ValueError as e:
                raise CommandFailed(f"the log key's verifier key: {e}", usage=True) from None
            print(f"\nlog key (tlog): {vkey}")
        if extra.id == WITNESS_KEY.id:  # what the logs witnessed and their verifiers are given
            try:
                vkey = witness_vkey(settings.witness_name, extra.public)
            except ValueError as e:
                raise CommandFailed(f"the witness key's verifier key: {e}", usage=True) from None
            print(f"\nwitness key: {vkey}")
    if missing:
        print("\nnot made yet (the server makes them at its first start): "
              + ", ".join(s.id for s in missing))
    return 0


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

    dbp = sub.add_parser("db", help="database migrations")
    common(dbp)
    dbsub = dbp.add_subparsers(dest="db_command", required=True)
    up = dbsub.add_parser("upgrade", help="migrate the database to REVISION (default: the newest)")
    up.add_argument("revision", nargs="?", default="head")
    down = dbsub.add_parser("downgrade", help="migrate the database back to REVISION")
    down.add_argument("revision")
    check = dbsub.add_parser("check", help="fail if the schema differs from the models")
    for p in (up, down, check):
        common(p, inner=True)
    dbp.set_defaults(func=cmd_db)

    keys = sub.add_parser("keys", help="the signing key")
    common(keys)
    keysub = keys.add_subparsers(dest="keys_command", required=True)
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
    for p in (show, gen, imp, export, reg):
        common(p, inner=True)
    keys.set_defaults(func=cmd_keys)

    tsap = sub.add_parser("tsa", help="the RFC 3161 certificate (docs/tsa.md)")
    common(tsap)
    tsasub = tsap.add_subparsers(dest="tsa_command", required=True)
    csrp = tsasub.add_parser("csr", help="write a certificate request for the TSA key (PEM)")
    certp = tsasub.add_parser(
        "import-cert", help="install the certificate chain a CA issued for the TSA key (PEM, "
        "the TSA certificate first)")
    certp.add_argument("file", type=Path)
    for p in (csrp, certp):
        common(p, inner=True)
    tsap.set_defaults(func=cmd_tsa)



EXIT_FAILED = 1  # the command failed (a client command's own code where it has one)
EXIT_USAGE = 2  # bad arguments or settings (argparse uses 2 as well)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def exit_status(exc: Exception) -> tuple[int, str] | None:
    """(exit code, one-line message) of an error any command may raise; None for a bug,
    which is left to propagate with its traceback."""
    from server.errors import StampError
    from workers.errors import WorkerError

    if isinstance(exc, ValidationError):
        return EXIT_USAGE, invalid_settings(exc)
    if isinstance(exc, CommandFailed):
        return EXIT_USAGE if exc.usage else EXIT_FAILED, _one_line(exc.message)
    if isinstance(exc, StampError | WorkerError):  # (the service's and the workers' bases)
        return EXIT_FAILED, _one_line(exc.message)
    from alembic.util.exc import CommandError as MigrationError
    from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, MigrationError):
        hint = ""
        if "not up to date" in str(exc):
            hint = " (run `stampd db upgrade`)"
        elif "Can't locate revision" in str(exc):  # a revision this release does not know
            hint = " (a newer stampd migrated it: run that release)"
        return EXIT_FAILED, _one_line(f"database: {exc}{hint}")
    if isinstance(exc, ArgumentError):
        return EXIT_USAGE, _one_line(f"invalid STAMPD_DATABASE_URL: {exc}")
    if isinstance(exc, DBAPIError):
        first = str(exc.orig or exc).strip().splitlines()[0] if str(exc.orig or exc) else ""
        if re.search(r'\brole "[^"]*" does not exist', first):
            first += " (create it first, e.g. `createuser -h HOST -U postgres USER`)"
        elif "does not exist" in first:
            first += " (create it first, e.g. `createdb -h HOST -U USER NAME`)"
        # (a refused statement, e.g. a constraint, is no outage)
        what = "unavailable" if isinstance(exc, OperationalError | InterfaceError) else "error"
        return EXIT_FAILED, _one_line(f"database {what}: {first}")
    if isinstance(exc, OSError):
        return EXIT_FAILED, _one_line(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    return None
