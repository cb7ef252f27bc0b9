"""One signing worker process: its own gpg-agent, a persistent Assuan connection, one loop.

Forked by `workers.pool.WorkerPool` (`begin`), or started as ``python -m workers.worker`` with its
`WorkerConfig` as JSON on stdin (`main`): never in its command line or environment, it holds
the key's passphrase and the database DSN. It has a private 0700 home directory. The worker

1. starts a gpg-agent in that home and imports the secret key from the key store, checking
   that it is the key of the store's public key file (a key it cannot load or that is another
   key: it writes why to ``<home>/status`` and exits with `EXIT_KEY_UNUSABLE`),
2. connects to the dispatcher's Unix socket and says hello (or, with database dispatch, claims
   jobs from the ``jobs`` table: `serve_db`),
3. builds and signs every job it receives (no process spawn per signature),
4. exits non-zero as soon as its agent is gone, and stops its agent when it exits.

The supervisor removes the home (and kills a left-over agent) after the process is reaped. The
worker dies with its supervisor (SIGKILL, set by the supervisor), and its agent with it (the
same, `procs.prctl.die_with_parent`); a worker that finds its supervisor gone all the
same (where that signal is not to be had) stops its agent and removes its home itself: nobody
else would until the next supervisor starts.

`check_key` is the supervisor's start-up check of one key: the same start, then one test
signature through the agent, verified against the key's public key file (for the log key, a
note signature, checked as plain Ed25519); for the TSA key, it then makes the key's
self-signed TSA certificate if it has none (`workers.tsa`).

This module starts the worker (its agent and key, `load_signer`, `run`, `main`); what signs is
in `workers.signer`, the dispatcher's socket in `workers.link`, the serve loops in
`workers.loop`, and what the worker tells its supervisor (exit status, status file) in
`workers.status`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from formats.jobs import Hello
from formats.keys import TLOG, WITNESS, ed25519_public_key
from keystore.keyset import KeyUnusable, SshKeyStore, verify_openpgp
from keystore.store import KeyStore, KeyStoreError
from procs.prctl import set_process_name
from workers.agents.gpg import GpgAgent
from workers.agents.ssh import SshAgent
from workers.config import ConfigError, WorkerConfig
from workers.errors import AgentError, TsaError
from workers.link import DispatcherLink
from workers.loop import serve, serve_db
from workers.signer import CosignSigner, NoteSigner, OpenPgpSigner, Signer, SshSigner
from workers.status import (
    AGENT_PID_FILE,
    EXIT_AGENT_DIED,
    EXIT_CONFIG,
    EXIT_KEY_UNUSABLE,
    EXIT_NO_DISPATCHER,
    READY,
    UNUSABLE,
    write_status,
)

log = logging.getLogger(__name__)

WORKER_NAME = "stampd-worker"  # every worker's /proc/PID/comm, as ps -o comm and top show it


def _key_files(config: WorkerConfig) -> tuple[Path, Path]:
    """The secret and public key files of the key ``config`` names."""
    if config.format == "ssh":
        store = SshKeyStore(config.key_dir)
        return store.private_key_file, store.public_key_file
    pgp = KeyStore(config.key_dir)
    return pgp.secret_key_file, pgp.public_key_file


def load_signer(agent: GpgAgent | SshAgent, config: WorkerConfig) -> tuple[Signer, str]:
    """Load the key of ``config`` into the started ``agent``: its signer and fingerprint.

    `KeyUnusable` when the key file cannot be loaded while the agent runs, or holds another key
    than the public key file (no signature is made: the fingerprints are compared); the agent's
    errors when the agent itself failed. The TSA key (``config.tsa_subject``) also loads its
    certificate chain, if it has one (`tsa.TsaError` when that is unreadable or another key's).
    The log key (``config.role`` `TLOG`) gets a `NoteSigner`: it signs checkpoint notes only,
    and must be an Ed25519 key; the witness key (`WITNESS`) likewise gets a `CosignSigner`
    (cosignatures only)."""
    secret, public = _key_files(config)
    signer: Signer
    try:
        if isinstance(agent, SshAgent):
            ssh_key = agent.add_key(secret)
            if ssh_key.blob != SshKeyStore(config.key_dir).public_key().blob:
                raise KeyStoreError(f"it holds another key than {public}")
            if config.role in (TLOG, WITNESS):
                if ssh_key.key_type != "ssh-ed25519":
                    raise KeyStoreError(f"the {config.role} key must be ssh-ed25519, not "
                                        f"{ssh_key.key_type}")
                signer = (NoteSigner if config.role == TLOG else CosignSigner)(
                    ssh_key, agent.connect())
            else:
                signer = SshSigner(ssh_key, agent.connect())
            fingerprint = ssh_key.fingerprint
        else:
            key = agent.import_secret_key(secret)
            expected = KeyStore(config.key_dir).public_key().fingerprint
            if key.fingerprint != expected:
                raise KeyStoreError(f"it holds key {key.fingerprint}, not {expected} of {public}")
            signer, fingerprint = OpenPgpSigner(key, agent.connect()), key.fingerprint
        if config.tsa_subject is not None:
            _load_chain(signer, config)
        return signer, fingerprint
    except KeyStoreError as e:
        raise KeyUnusable(config.key_id, secret, e.message) from None
    except AgentError as e:
        if not agent.running:  # the agent failed, not the key
            raise
        raise KeyUnusable(config.key_id, secret, str(e)) from None


def _load_chain(signer: Signer, config: WorkerConfig) -> None:
    """Give the TSA key's signer its certificate chain (none yet: it refuses timestamp jobs);
    `tsa.TsaError` naming the chain file when it cannot be read or is another key's."""
    from workers import tsa

    chain = tsa.read_chain(config.key_dir)
    if chain is not None:
        tsa.check_chain(config.key_dir, chain, signer.tsa_key())
    signer.chain = chain


def check_key(config: WorkerConfig, clock: Callable[[], float] = time.time) -> str:
    """The start-up check of one key: start an agent in ``config.home``, load the key, make one
    test signature through the agent and verify it against the key's public key file (so a
    secret key that does not match its public key is caught too); for the TSA key
    (``config.tsa_subject``), make its self-signed TSA certificate when it has none
    (`tsa.ensure_certificate`); stop the agent. The key's fingerprint; `KeyUnusable` (or the
    agent's errors) when it cannot sign, `tsa.TsaError` when it cannot be the TSA key or its
    certificate chain is another key's. The log key's and the witness key's test signature is
    plain Ed25519 over the message (as `NoteSigner` and `CosignSigner` make them), checked with
    ``cryptography``."""
    agent: GpgAgent | SshAgent
    agent = SshAgent(config.home) if config.format == "ssh" else \
        GpgAgent(config.home, passphrase=config.passphrase)
    secret, public = _key_files(config)
    try:
        agent.start()
        signer, fingerprint = load_signer(agent, config)
        t = int(clock())
        message = f"stampd key check: {config.key_id} {fingerprint} {t}\n".encode()
        try:
            if isinstance(signer, NoteSigner):
                note_signature = signer.note_signature(message)
            else:
                signature = signer.signature(message, t)
        except AgentError as e:
            if not agent.running:
                raise
            raise KeyUnusable(config.key_id, secret, f"its agent cannot sign with it: {e}"
                              ) from None
        try:
            if isinstance(signer, NoteSigner):
                _verify_note_signature(public, message, note_signature)
            elif isinstance(signer, OpenPgpSigner):
                verify_openpgp(public, message, signature, fingerprint)
            else:
                SshKeyStore(config.key_dir).verify(message, signature, "git")
        except KeyStoreError as e:
            raise KeyUnusable(config.key_id, secret, e.message) from None
        if config.tsa_subject is not None:
            from workers import tsa

            made = tsa.ensure_certificate(config.key_dir, signer.tsa_key(), config.tsa_subject,
                                          config.tsa_days, clock)
            if made:
                log.info("key %s: made a self-signed TSA certificate, %s", config.key_id,
                         config.key_dir / tsa.TSA_CHAIN_FILE)
        return fingerprint
    finally:
        agent.stop()


def _verify_note_signature(public: Path, message: bytes, signature: bytes) -> None:
    """Check the log key's Ed25519 signature of ``message`` against its public key file
    ``public`` (``id.pub``); `KeyStoreError` saying why it does not verify."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = ed25519_public_key(public.read_text())
    except (OSError, ValueError) as e:
        raise KeyStoreError(f"cannot read {public}: {e}") from None
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
    except InvalidSignature:
        raise KeyStoreError(f"its signature does not verify with the public key {public}"
                            ) from None


def run(config: WorkerConfig, supervisor: int | None = None) -> int:
    """Start the agent, load the key, serve jobs until the agent, the supervisor (PID
    ``supervisor``, default: our parent's now) or the dispatcher is gone; the exit status."""
    supervisor = os.getppid() if supervisor is None else supervisor
    agent: GpgAgent | SshAgent
    if config.format == "ssh":
        agent = SshAgent(config.home)
    else:
        agent = GpgAgent(config.home, passphrase=config.passphrase)
    try:
        agent.start()
        (config.home / AGENT_PID_FILE).write_text(str(agent.pid))
        signer, fingerprint = load_signer(agent, config)
        write_status(config.home, READY)
        dispatch = config.dispatch
        if dispatch.mode == "database":
            assert dispatch.dsn is not None  # (DispatchConfig checks it)
            log.info("ready: key %s (%s), agent pid %d, jobs from the database",
                     fingerprint, config.key_id, agent.pid)
            return serve_db(dispatch.dsn, signer, agent, config.name, config.key_id,
                            parent=supervisor)
        assert dispatch.socket is not None  # (DispatchConfig checks it)
        link = DispatcherLink(dispatch.socket, Hello(config.name, os.getpid(), fingerprint,
                                                     config.key_id).frame(), config.name)
        try:
            link.connect(time.monotonic() + 120)
            log.info("ready: key %s (%s), agent pid %d, jobs from %s", fingerprint,
                     config.key_id, agent.pid, dispatch.socket)
            return serve(link, signer, agent, config.name, supervisor)
        finally:
            link.close()
    except (KeyUnusable, TsaError) as e:  # the supervisor reports it, once for all attempts
        log.info("worker %s: %s", config.name, e.message)
        with contextlib.suppress(OSError):
            write_status(config.home, f"{UNUSABLE} {e.message}")
        return EXIT_KEY_UNUSABLE
    except AgentError as e:
        log.error("worker %s: the agent failed: %s", config.name, " ".join(str(e).split()))
        return EXIT_AGENT_DIED
    except (FileNotFoundError, ConnectionRefusedError):
        log.exception("cannot reach the dispatcher at %s", config.dispatch.socket)
        return EXIT_NO_DISPATCHER
    finally:
        agent.stop()
        if os.getppid() != supervisor:  # orphaned: the home and its key copy are ours to remove
            log.warning("worker %s: supervisor is gone; removing home %s", config.name,
                        config.home)
            shutil.rmtree(config.home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.worker [--name N --home H --key-id K] < config.json``. The options
    only label the process (``ps``, ``pgrep``); when given, they must match the configuration."""
    parent = os.getppid()  # first of all (the configuration should say it, though)
    ap = argparse.ArgumentParser(prog="workers.worker",
                                 description="one signing worker; its configuration (JSON) "
                                 "comes on stdin")
    ap.add_argument("--name", help="label: the worker's name")
    ap.add_argument("--home", type=Path, help="label: the worker's home")
    ap.add_argument("--key-id", help="label: the key it serves")
    args = ap.parse_args(argv)
    try:
        config = WorkerConfig.from_json(sys.stdin.buffer.read())
    except ConfigError as e:
        print(f"workers.worker: bad configuration on stdin: {e}", file=sys.stderr)
        return EXIT_CONFIG
    labels = {"--name": (args.name, config.name), "--home": (args.home, config.home),
              "--key-id": (args.key_id, config.key_id)}
    wrong = [opt for opt, (given, configured) in labels.items()
             if given is not None and given != configured]
    if wrong:
        print(f"workers.worker: {', '.join(wrong)} disagree with the configuration",
              file=sys.stderr)
        return EXIT_CONFIG
    return begin(config, parent)


def begin(config: WorkerConfig, parent: int) -> int:
    """A worker's life once it has its configuration, started as ``python -m workers.worker``
    (`main`) or forked by its supervisor (`workers.pool`): its name (`WORKER_NAME`), its log
    lines, SIGTERM as a clean exit, then `run`."""
    set_process_name(WORKER_NAME)
    logging.basicConfig(level=config.log_level, force=True,  # (a forked one: the pool's)
                        format=f"%(asctime)s worker[{config.name}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return run(config, parent if config.supervisor is None else config.supervisor)


if __name__ == "__main__":
    sys.exit(main())
