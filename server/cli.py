"""The ``stampd`` command line. Only this module (and ``__main__`` blocks) may exit."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from server.settings import Settings
from workers.config import LOG_LEVELS, DispatchConfig, PoolConfig
from workers.keys.keyset import ServedKey

log = logging.getLogger("stampd")


# Secrets that child processes must not inherit (they get what they need in their config).
SECRET_ENV = ("STAMPD_PASSPHRASE", "STAMPD_DATABASE_URL")


def child_env() -> dict[str, str]:
    """The environment of the worker processes: ours without the secrets. (They read no
    ``STAMPD_*`` variable; their configuration comes on stdin, see `pool_config`.)"""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


def pool_config(settings: Settings) -> PoolConfig:
    """What the worker supervisor and its workers need of ``settings``, and the current log
    level (``--log-level`` or ``STAMPD_LOG_LEVEL``). Reads the passphrase file."""
    if settings.dispatch == "database":
        from server.dispatch.database import psycopg_dsn

        dispatch = DispatchConfig("database", dsn=psycopg_dsn(settings.db_url))
    else:
        dispatch = DispatchConfig("socket",
                                  sockets=tuple(p.resolve() for p in settings.dispatch_sockets))
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    return PoolConfig(
        workers=settings.worker_count,
        keys_dir=settings.keys_dir.resolve(),
        runtime_dir=settings.worker_homes_dir.resolve(),
        dispatch=dispatch,
        extra_keys=tuple(settings.extra_key_specs),
        extra_key_workers=settings.extra_key_workers,
        passphrase=settings.read_passphrase(),
        log_level=level if level in LOG_LEVELS else "INFO",
        tsa_key=settings.tsa_spec,
        tsa_subject=settings.tsa_common_name if settings.tsa_spec is not None else None,
        tsa_days=settings.tsa_cert_days,
    )


def build_settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "data_dir", "workers", "api_processes", "database_url",
                 "commit_interval", "own_url", "key_uid", "key_algo", "peers"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return Settings(**overrides)


def _setup_logging(level: str | None = None) -> None:
    from server.api.processes import setup_logging

    setup_logging(level or os.environ.get("STAMPD_LOG_LEVEL", "INFO"))


def _prepare(settings: Settings, signs_here: bool = True) -> list[ServedKey]:
    """Data directory, keys (generated on first start; a host that keeps only public keys
    never gets new ones, and must not sign: ``signs_here``), migrated database, log
    repository. Returns the keys this server serves."""
    from server import db
    from server.log.repository import LogRepository
    from server.signing_keys import serving_keys
    from workers.keys.keyset import ensure_extra_keys
    from workers.keys.store import KeyStore

    settings.data_dir.mkdir(parents=True, exist_ok=True)
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
    from client.errors import CommandError
    from server import db

    current = db.current_revision(engine)
    if current != db.SCHEMA_HEAD:
        raise CommandError(f"the database is at schema revision {current or 'none'}, not "
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


class PoolProcess:
    """Runs the worker supervisor (``python -m workers.pool``, its `PoolConfig` on stdin) as a
    child process and restarts it if it dies.

    `start` waits until the first supervisor has checked every key (one test signature each,
    made in the supervisor's agents and verified against the key's public key file) and raises
    `CommandError` with its one-line reason when one cannot sign: nothing is served then.
    (The private keys stay out of this process: the supervisor only reports.)"""

    START_TIMEOUT = 300.0  # for the key check; each of its steps has a deadline of its own

    def __init__(self, settings: Settings) -> None:
        self.config = pool_config(settings)
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pool-watch", daemon=True)

    def _spawn(self, check_keys: bool = False) -> None:
        from workers.pool import send_config

        argv = [sys.executable, "-m", "workers.pool"]
        if not check_keys:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=child_env())
            send_config(self.proc, self.config.to_json())
            return
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen([*argv, "--check-keys", "--report-fd", str(write_fd)],
                                         stdin=subprocess.PIPE, env=child_env(),
                                         pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        send_config(self.proc, self.config.to_json())
        line = _read_report(read_fd, self.START_TIMEOUT)
        if line == "ok":
            return
        from client.errors import CommandError

        proc, self.proc = self.proc, None
        try:
            code = proc.wait(timeout=30 if line else 0.1)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
        raise CommandError(line or f"the worker supervisor exited with {code} before it "
                           "started its workers")

    def start(self) -> None:
        self._spawn(check_keys=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            assert self.proc is not None
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            log.error("worker supervisor exited with %s; restarting it", code)
            if self._stopping.wait(1.0):
                return
            self._spawn()

    def stop(self) -> None:
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _read_report(fd: int, timeout: float) -> str:
    """The one line the supervisor writes to ``fd`` (then closed); empty when it exited, or
    did not answer within ``timeout`` seconds, without writing one."""
    import select

    deadline = time.monotonic() + timeout
    data = b""
    try:
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return _one_line(data.decode("utf-8", "replace").partition("\n")[0])


def _require_programs(settings: Settings, signs_here: bool = True) -> None:
    """Fail at once, in one line, when a program this host runs is missing or too old: gpg
    (every host reads OpenPGP keys), gpg-agent and gpgconf where keys sign, the OpenSSH tools
    where SSH keys sign (`workers.agents.programs`)."""
    from workers.agents.programs import GNUPG, OPENSSH, require

    needed = list(GNUPG) if signs_here else [p for p in GNUPG if p.name == "gpg"]
    if signs_here and any(spec.format == "ssh" for spec in settings.extra_key_specs):
        needed += OPENSSH
    require(needed)


def cmd_serve(args: argparse.Namespace) -> int:
    from server.api.processes import run_uvicorn, serve_processes

    settings = build_settings(args)
    count = settings.api_process_count
    settings = settings.model_copy(update={"api_processes": count})  # (the same in each)
    _check_listen(settings.host, settings.port)
    _require_programs(settings, signs_here=not args.no_workers)
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
    if count > 1:
        try:
            serve_processes(settings, logging.getLevelName(logging.getLogger()
                                                            .getEffectiveLevel()), child_env())
        finally:
            if pool is not None:
                pool.stop()
        return 0

    # uvicorn handles SIGTERM/SIGINT itself and re-raises the signal when it is done; with
    # this handler in place the re-raised signal unwinds through `finally` (stopping the
    # pool) instead of killing the process.
    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    # (Imported only here: with several HTTP processes each imports the app, the supervisor
    # need not.)
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

    from client.errors import CommandError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as e:
            raise CommandError(f"cannot listen on {host}:{port}: {e.strerror} "
                               "(set --port/STAMPD_PORT or --host/STAMPD_HOST)") from None


def _safe_url(url: str) -> str:
    """A database URL without its password, for the log."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _key_summary(keys: list[ServedKey]) -> str:
    return ", ".join(f"{k.id} {k.fingerprint}" for k in keys)


def cmd_worker(args: argparse.Namespace) -> int:
    from server import db
    from workers.pool import WorkerPool

    settings = build_settings(args)
    _require_programs(settings)
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

    from client.errors import CommandError
    from workers import tsa
    from workers.formats import tsp

    settings = build_settings(args)
    spec = settings.tsa_spec
    if spec is None:
        raise CommandError("RFC 3161 is off (STAMPD_TSA=false)", exit_code=EXIT_USAGE)
    key_dir = settings.keys_dir / spec.id
    if not tsa.secret_key_file(key_dir, spec.format).exists():
        raise CommandError(f"no TSA key in {key_dir}: start `stampd serve` (or `stampd worker`) "
                           "once on this host to generate it")
    pem = b""
    if args.tsa_command == "import-cert":
        try:
            pem = args.file.read_bytes()
        except OSError as e:
            raise CommandError(f"cannot read {args.file}: {e.strerror}") from None
    _require_programs(settings)
    with tempfile.TemporaryDirectory(prefix="stampd-tsa-") as home, \
            tsa.open_key(key_dir, spec.format, Path(home), settings.read_passphrase()) as key:
        if args.tsa_command == "csr":
            print(tsp.pem(tsa.csr(key, settings.tsa_common_name), "CERTIFICATE REQUEST"), end="")
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
    settings.data_dir.mkdir(parents=True, exist_ok=True)
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

    from workers.keys.keyset import SshKeyStore, allowed_signers, key_dir, served_keys
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
    from client.errors import CommandError
    from workers.keys.store import KeyStore

    settings = build_settings(args)
    store = KeyStore(settings.keys_dir)
    if args.keys_command == "generate":
        if store.exists() and not args.force:
            raise CommandError(f"a key exists in {store.dir}; use --force to replace it")
        store.generate(settings.key_uid, settings.key_algo, settings.read_passphrase())
    elif args.keys_command == "import":
        store.import_key(args.file, settings.read_passphrase())
    from workers.keys.keyset import allowed_signers, served_keys, stored_key_specs

    # The configured extra keys, and any other the data directory holds.
    specs = settings.extra_key_specs
    specs += [s for s in stored_key_specs(settings.keys_dir) if s not in specs]
    keys = served_keys(settings.keys_dir, specs)
    if args.keys_command == "export-public":
        export_public(settings.keys_dir, specs, args.dir)
        return 0
    if args.keys_command == "register":
        from server import db

        settings.data_dir.mkdir(parents=True, exist_ok=True)
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
            raise CommandError(f"no SSH key in {settings.keys_dir} "
                               "(set STAMPD_EXTRA_KEYS=ssh:ed25519 and start the server once)")
        print(signers, end="")
        return 0
    key = store.public_key()
    print(f"fingerprint: {key.fingerprint}\nuser id:     {key.uid}\n"
          f"algorithm:   {key.algorithm}\npublic key:  {store.public_key_file}")
    for extra in keys[1:]:
        print(f"\nkey {extra.id}:\n  format:      {extra.format}\n"
              f"  fingerprint: {extra.fingerprint}\n  algorithm:   {extra.algorithm}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="stampd",
        description="stampd: a timestamping server for git (Zeitgitter protocol) and digests. "
        "`stampd serve` runs it (data in ./var by default); `stampd stamp`, `verify`, "
        "`audit` and `hook` are for users of any stampd server. Every setting is also an "
        "environment variable STAMPD_<NAME>.",
        epilog="Exit status: 0 success; 1 the command failed (one line on stderr says why); "
        "2 bad arguments or settings. stamp, verify and audit have their own (see their --help).")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (STAMPD_LOG_LEVEL)")
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, inner: bool = False) -> None:
        """The data directory and database options. Commands with subcommands (db, keys)
        take them before or after the subcommand: ``keys --data-dir D show`` and
        ``keys show --data-dir D`` (an inner option only overrides when given)."""
        default = argparse.SUPPRESS if inner else None
        p.add_argument("--data-dir", type=Path, default=default,
                       help="data directory (STAMPD_DATA_DIR)")
        p.add_argument("--database-url", default=default,
                       help="SQLAlchemy URL (STAMPD_DATABASE_URL)")

    serve = sub.add_parser("serve", help="HTTP API, worker pool and log committer")
    common(serve)
    serve.add_argument("--host", help="listen address (STAMPD_HOST)")
    serve.add_argument("--port", type=int, help="listen port (STAMPD_PORT)")
    serve.add_argument("--workers", type=int, help="signing processes, 0 = CPUs (STAMPD_WORKERS)")
    serve.add_argument("--api-processes", type=int,
                       help="HTTP processes sharing the port, 0 = one per three CPUs "
                       "(STAMPD_API_PROCESSES)")
    serve.add_argument("--commit-interval", type=float,
                       help="seconds between log commits (STAMPD_COMMIT_INTERVAL)")
    serve.add_argument("--own-url", help="public URL written into stamps (STAMPD_OWN_URL)")
    serve.add_argument("--peers", help="peers stamping our log: name=URL[#FPR],... "
                       "(STAMPD_PEERS)")
    serve.add_argument("--no-workers", action="store_true",
                       help="run no worker pool here (workers come from `stampd worker`)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="only the signing worker pool")
    common(worker)
    worker.add_argument("--workers", type=int, help="signing processes (STAMPD_WORKERS)")
    worker.add_argument("--api-processes", type=int,
                        help="HTTP processes of the stampd serve --no-workers whose dispatchers "
                        "the workers serve; give it the same value (STAMPD_API_PROCESSES)")
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
    gen.add_argument("--key-uid", help="user id, 'Name <email>'")
    gen.add_argument("--key-algo", help="gpg algorithm name, e.g. ed25519, rsa4096")
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

    verify = sub.add_parser(
        "verify", help="check a digest receipt, a manifest (SHA256SUMS.asc), an RFC 3161 "
        "time-stamp token, or a git tag/commit stamp in a repository",
        description="Exit status: 0 valid, 1 invalid (bad signature, wrong key, wrong time, "
        "digest mismatch, a manifest's files missing or changed (--dir), a token not from the "
        "--chain TSA) or could not be checked (server key not obtainable, gpg missing, a token "
        "checked without --chain, unsupported), 2 malformed (not a "
        "receipt, token or stamp of a known format, or an unusable argument), 3 a valid RFC "
        "3161 token whose imprint is not in the --log yet.")
    verify.add_argument("target", help="a receipt or manifest file ('-' for stdin), an RFC "
                        "3161 response (.tsr) or token, or a git tag/commit")
    what = verify.add_mutually_exclusive_group()
    what.add_argument("--file", "--data", dest="file", type=Path,
                      help="check that the receipt's digest (the token's imprint) is this "
                      "file's")
    what.add_argument("--digest", help="check that the receipt or token is for this hex digest")
    verify.add_argument("--key", type=Path,
                        help="public key file of the server (offline); default: fetch it "
                        "from the server URL in the receipt")
    verify.add_argument("--repo", type=Path, default=Path("."),
                        help="git repository holding a tag/commit target (default: .)")
    verify.add_argument("--chain", type=Path,
                        help="RFC 3161 token: the certificates to trust (PEM: the TSA's "
                        "GET /tsa.pem, or its CA's certificate)")
    verify.add_argument("--dir", type=Path, default=None,
                        help="manifest (SHA256SUMS.asc): also hash the files it names, "
                        "relative to DIR, and report missing and changed ones")
    verify.add_argument("--log",
                        help="RFC 3161 token: a clone of the server's log (path or http(s) "
                        "URL, as for `stampd audit`): name the log commit publishing the "
                        "imprint")
    verify.set_defaults(func=_cmd("client.verify", "cmd_verify"))

    audit = sub.add_parser(
        "audit", help="verify a log repository (a clone or its URL) and its peer stamps",
        description="Exit status: 0 all checks passed, 1 a check failed, 2 the audit could not "
        "run (the target is not a readable log repository, cannot be cloned or has no main "
        "branch; gpg missing).")
    audit.add_argument("target", help="path of a log clone, or its http(s) URL")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.add_argument("--peer-keys", type=Path,
                       help="directory of <peer>.asc keys, overriding peers/<peer>.asc in the log")
    audit.set_defaults(func=_cmd("client.audit", "cmd_audit"))

    stampp = sub.add_parser(
        "stamp", help="stamp files (one signed manifest, SHA256SUMS.asc), or obtain a tag or "
        "branch stamp of a commit, from a stampd (or Zeitgitter) server; the answer is checked "
        "before anything is stored",
        usage="stampd stamp FILE|DIR... [-o FILE] [--algorithm sha256|sha512] [options]\n"
        "       stampd stamp (--tag NAME | --branch NAME) [COMMIT] [options]",
        description="Files: hashed here (directories recursively), sent as one manifest "
        "(POST /v1/manifests), and the signed answer written to SHA256SUMS.asc once its "
        "signature, header and lines are checked. Git: OpenPGP or SSH stamps (--format ssh), "
        "SHA-1 or SHA-256 repositories. "
        "Exit status: 0 stored; 1 not stamped (server unreachable or answered an error, its "
        "key changed from the pinned one, git or gpg failed); 2 an unusable argument or "
        "repository (no server, a bad name, an unknown commit, an existing tag, a commit the "
        "branch stamps already, an unreadable file or one whose name a manifest cannot hold); "
        "3 the server's answer was refused (not the object or the lines asked for, a time off "
        "by 30 s or more, a signature that does not verify with the trusted key): "
        "nothing was stored.")
    which = stampp.add_mutually_exclusive_group()
    which.add_argument("--tag", metavar="NAME", help="make the stamp the tag refs/tags/NAME")
    which.add_argument("--branch", metavar="NAME",
                       help="add the stamp to the timestamp branch NAME (a merge chain: its "
                       "parents are the branch's previous stamp and COMMIT)")
    stampp.add_argument("paths", nargs="*", metavar="FILE|DIR | COMMIT",
                        help="the files and directories to stamp; with --tag/--branch the "
                        "commit to stamp (default: HEAD)")
    stampp.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                        help="files: where to write the signed manifest (default: "
                        "SHA256SUMS.asc, SHA512SUMS.asc with --algorithm sha512)")
    stampp.add_argument("--algorithm", choices=("sha256", "sha512"), default=None,
                        help="files: the digest algorithm (default: sha256)")
    stampp.add_argument("--server", default=None,
                        help="server URL (default: $STAMPD_SERVER, else git config "
                        "timestamp.server)")
    stampp.add_argument("--format", choices=("openpgp", "ssh"), default=None,
                        help="the stamp's signature (default: openpgp; ssh with --key "
                        "SHA256:...)")
    stampp.add_argument("--key", default=None, metavar="FILE|SHA256:...",
                        help="the key to trust instead of the pinned one (trust on first use): "
                        "an armored OpenPGP public key file; with --format ssh a .pub or "
                        "allowed-signers file, or the fingerprint of one of the server's SSH "
                        "keys")
    stampp.add_argument("--repo", type=Path, default=Path("."),
                        help="the git repository (default: .); for files, where keys are "
                        "pinned and timestamp.server is read")
    stampp.set_defaults(func=_cmd("client.stamp", "cmd_stamp"))

    hook = sub.add_parser("hook", help="the post-commit hook that stamps every commit")
    hooksub = hook.add_subparsers(dest="hook_command", required=True)
    install = hooksub.add_parser(
        "install", help="install the post-commit hook",
        description="Exit status: 0 installed, 1 not installed (not a git repository, a foreign "
        "hook without --force, the server key could not be fetched or has changed), 2 an "
        "unusable --server URL or --branch name.")
    install.add_argument("--server", default="http://127.0.0.1:8080",
                         help="stampd (or any Zeitgitter) server URL")
    install.add_argument("--branch", default=None,
                         help="timestamp branch (default: the name `git timestamp` derives "
                         "from the server URL, e.g. localhost-8080-timestamps)")
    install.add_argument("--repo", type=Path, default=Path("."))
    install.add_argument("--force", action="store_true",
                         help="install over an existing post-commit hook that is not ours: it "
                         "is kept as post-commit.user and runs before stampd's; or trust a "
                         "changed server key")
    install.add_argument("--format", choices=("openpgp", "ssh"), default="openpgp",
                         help="the stamps' signatures: OpenPGP (checked with gpg) or SSH "
                         "(checked with ssh-keygen; the server must have an SSH key)")
    install.add_argument("--key", default=None,
                         help="with --format ssh: the server's SSH key to use, SHA256:... "
                         "(default: its first SSH key)")
    install.set_defaults(func=_cmd("client.hook", "cmd_install"))
    uninstall = hooksub.add_parser(
        "uninstall", help="remove stampd's post-commit hook",
        description="A hook kept as post-commit.user is put back. Exit status: 0 removed (or "
        "no hook to remove), 1 the hook is not stampd's, or the repository is unusable.")
    uninstall.add_argument("--repo", type=Path, default=Path("."))
    uninstall.set_defaults(func=_cmd("client.hook", "cmd_uninstall"))
    return ap


def _cmd(module: str, name: str) -> Any:
    """A command implemented in another module, imported only when it runs."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(module), name)(args))

    return run


EXIT_FAILED = 1  # the command failed (a client command's own code where it has one)
EXIT_USAGE = 2  # bad arguments or settings (argparse uses 2 as well)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def exit_status(exc: Exception) -> tuple[int, str] | None:
    """(exit code, one-line message) of an error any command may raise; None for a bug,
    which is left to propagate with its traceback."""
    from pydantic import ValidationError

    from client.errors import CommandError
    from server.errors import StampError
    from workers.agents.gpg import AgentError
    from workers.agents.programs import ProgramError
    from workers.agents.ssh import SshAgentError
    from workers.keys.store import KeyStoreError
    from workers.pool import RuntimeDirError
    from workers.tsa import TsaError

    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'STAMPD_' + str(e['loc'][0]).upper() + ': ' if e['loc'] else ''}{e['msg']}"
            for e in exc.errors())
        return EXIT_USAGE, _one_line(f"invalid setting: {problems}")
    if isinstance(exc, CommandError):
        return exc.exit_code, _one_line(str(exc))
    if isinstance(exc, TsaError):
        return EXIT_FAILED, _one_line(exc.message)
    if isinstance(exc, StampError | KeyStoreError | ProgramError):
        return EXIT_FAILED, _one_line(exc.message)
    if isinstance(exc, AgentError | SshAgentError | RuntimeDirError):
        return EXIT_FAILED, _one_line(str(exc))
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
        if "does not exist" in first:
            first += " (create it first, e.g. `createdb -h HOST -U USER NAME`)"
        # (a refused statement, e.g. a constraint, is no outage)
        what = "unavailable" if isinstance(exc, OperationalError | InterfaceError) else "error"
        return EXIT_FAILED, _one_line(f"database {what}: {first}")
    if isinstance(exc, OSError):
        return EXIT_FAILED, _one_line(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every error a command raises on purpose ends here, once: one line on
    stderr (``stampd <command>: <message>``), no traceback, and the documented exit code."""
    args = parser().parse_args(argv)
    _setup_logging(args.log_level)
    name = " ".join(n for n in (args.command, getattr(args, "hook_command", None)) if n)
    try:
        return int(args.func(args))
    except Exception as e:
        status = exit_status(e)
        if status is None:
            raise
        code, message = status
        print(f"stampd {name}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
