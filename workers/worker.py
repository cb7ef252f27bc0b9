"""One signing worker process: its own gpg-agent, a persistent Assuan connection, one loop.

Started by `workers.pool.WorkerPool` as ``python -m workers.worker`` with its `WorkerConfig` as
JSON on stdin (never in its command line or environment: it holds the key's passphrase and the
database DSN) and a private 0700 home directory. The worker

1. starts a gpg-agent in that home and imports the secret key from the key store, checking
   that it is the key of the store's public key file (a key it cannot load or that is another
   key: it writes why to ``<home>/status`` and exits with `EXIT_KEY_UNUSABLE`),
2. connects to the dispatcher's Unix socket and says hello (or, with database dispatch, claims
   jobs from the ``jobs`` table: `serve_db`),
3. builds and signs every job it receives (no process spawn per signature),
4. exits non-zero as soon as its agent is gone, and stops its agent when it exits.

The supervisor removes the home (and kills a left-over agent) after the process is reaped. The
worker dies with its supervisor (SIGKILL, set by the supervisor), and its agent with it (the
same, `workers.agents.base.die_with_parent`); a worker that finds its supervisor gone all the
same (where that signal is not to be had) stops its agent and removes its home itself: nobody
else would until the next supervisor starts.

`check_key` is the supervisor's start-up check of one key: the same start, then one test
signature through the agent, verified against the key's public key file; for the TSA key, it
then makes the key's self-signed TSA certificate if it has none (`workers.tsa`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from formats import cleartext, manifests, openpgp
from formats.jobs import (
    MAX_MANIFEST_FRAME,
    CommitJob,
    FrameBuffer,
    GitJob,
    Hello,
    Job,
    MalformedMessage,
    ManifestJob,
    ReceiptJob,
    Result,
    TagJob,
    TimestampJob,
    decode_frame,
    job_from_dict,
)
from formats.sshsig import SshPublicKey
from workers import jobtable
from workers.agents.gpg import AssuanConnection, GpgAgent
from workers.agents.ssh import SshAgent, SshAgentConnection
from workers.config import ConfigError, WorkerConfig
from workers.errors import AgentError
from workers.keys.keyset import (
    RECEIPT_NAMESPACE,
    KeyUnusable,
    SshKeyStore,
    TsaError,
    verify_openpgp,
)
from workers.keys.store import KeyStore, KeyStoreError

if TYPE_CHECKING:
    from workers import tsa

log = logging.getLogger(__name__)

# Bytes asked of the dispatcher socket at a time. Python allocates the whole size for every
# recv: 1 MiB was an mmap, a page fault and a munmap per read (about 12 us); 64 KiB comes from
# the heap. A large manifest job arrives in more reads, appended to one buffer.
RECV_SIZE = 1 << 16
# What makes a worker refuse one job as malformed (the others of its batch are still signed).
REFUSED = (MalformedMessage, ValueError, UnicodeError)

EXIT_CONFIG = 2
EXIT_AGENT_DIED = 3
EXIT_NO_DISPATCHER = 4
EXIT_KEY_UNUSABLE = 5  # the key cannot be loaded, or is not its public key's (see STATUS_FILE)
AGENT_PID_FILE = "agent.pid"
# One line the supervisor reads after the worker exited: READY once the key is loaded, or
# UNUSABLE and the one-line reason why it cannot be.
STATUS_FILE = "status"
READY = "ready"
UNUSABLE = "unusable"


class Signer:
    """Builds and signs git objects, receipts and time-stamp tokens with one key held by one
    agent.

    Subclasses say how a payload is signed (OpenPGP or SSH) and which user id goes into the
    tagger/committer lines. The TSA key's signer also has ``chain``, its TSA certificates (DER,
    its own first), and makes RFC 3161 time-stamp tokens; without one it refuses them."""

    chain: list[bytes] | None = None
    _tsa_key: tsa.TsaKey | None = None

    def uid(self, job: GitJob) -> str:
        raise NotImplementedError

    def signature(self, payload: bytes, t: int) -> str:
        raise NotImplementedError

    def receipt(self, text: str, t: int) -> str:
        raise NotImplementedError

    def timestamp(self, job: TimestampJob) -> str:
        """The RFC 3161 token of ``job`` (DER), in base64."""
        if not self.chain:
            raise MalformedMessage("this key has no TSA certificate")
        from workers import tsa  # (imported by the TSA key's worker only: asn1crypto is 0.1 s)

        token = tsa.build_token(job, self.tsa_key(), self.chain)
        return base64.b64encode(token).decode("ascii")

    def tsa_key(self) -> tsa.TsaKey:
        """The key as a TSA signs with it (made once); `tsa.TsaError` when it cannot be a TSA
        key."""
        if self._tsa_key is None:
            self._tsa_key = self.make_tsa_key()
        return self._tsa_key

    def make_tsa_key(self) -> tsa.TsaKey:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        raise NotImplementedError

    def manifest(self, header: str, lines: str, t: int) -> str:
        """``header`` + ``lines`` signed, the lines left out of the answer
        (`ManifestJob.signed` puts them back)."""
        raise NotImplementedError

    def build_manifest(self, job: ManifestJob) -> str:
        """Only a well-formed manifest is signed: its lines are checksum lines of its
        algorithm, its header parses and names this worker's key."""
        manifests.check_structure(job.lines, job.algorithm)
        header = job.header()
        if header.key != self.fingerprint:
            raise MalformedMessage("the manifest names another key")
        text = header.text()
        manifests.parse_header(text)
        return self.manifest(text, job.lines, job.time)

    def build_many(self, jobs: Sequence[Job]) -> list[str | Exception]:
        """The signed object of each of ``jobs``, or the `REFUSED` error that made it
        malformed; the agent's errors propagate. Time-stamp tokens are signed in one agent
        round trip (`tsa.build_tokens`); signers whose agent signs several git objects so
        override this."""
        out: list[str | Exception | None] = [None] * len(jobs)
        tokens: list[tuple[int, TimestampJob]] = []
        for i, job in enumerate(jobs):
            if isinstance(job, TimestampJob) and self.chain:
                tokens.append((i, job))
                continue
            try:
                out[i] = self.build(job)
            except REFUSED as e:
                out[i] = e
        if tokens:
            from workers import tsa

            built = tsa.build_tokens([job for _, job in tokens], self.tsa_key(), self.chain or [])
            for (i, _), token in zip(tokens, built, strict=True):
                out[i] = token if isinstance(token, Exception) \
                    else base64.b64encode(token).decode("ascii")
        return [o if o is not None else RuntimeError("not built") for o in out]

    def build(self, job: Job) -> str:
        """The signed object of ``job`` (ASCII text)."""
        if isinstance(job, ReceiptJob):
            return self.receipt(job.text, job.time)
        if isinstance(job, ManifestJob):
            return self.build_manifest(job)
        if isinstance(job, TimestampJob):
            return self.timestamp(job)
        payload = job.payload(self.uid(job))
        return job.embed(payload, self.signature(payload, job.time)).decode("ascii")


class OpenPgpSigner(Signer):
    """OpenPGP signatures; with ``chain``, RFC 3161 time-stamp tokens too."""

    def __init__(self, key: openpgp.KeyInfo, conn: AssuanConnection,
                 chain: list[bytes] | None = None) -> None:
        self.key = key
        self.conn = conn
        self.chain = chain

    def _sign(self, hash_algo: int, digest: bytes) -> list[int]:
        return self.conn.sign(self.key.keygrip, hash_algo, digest)

    def make_tsa_key(self) -> tsa.TsaKey:
        from workers import tsa

        return tsa.openpgp_agent_key(self.key, self.conn)

    def uid(self, job: GitJob) -> str:
        return self.key.uid  # the client checks the uid of the key it fetched

    def build_many(self, jobs: Sequence[Job]) -> list[str | Exception]:
        """Git objects are signed in one agent round trip (`AssuanConnection.sign_many`),
        time-stamp tokens in another (`Signer.build_many`), other jobs one by one."""
        out: list[str | Exception | None] = [None] * len(jobs)
        prepared: list[tuple[int, GitJob, bytes, openpgp.PreparedSignature]] = []
        for i, job in enumerate(jobs):
            try:
                if isinstance(job, TagJob | CommitJob):
                    payload = job.payload(self.uid(job))
                    prepared.append((i, job, payload,
                                     openpgp.prepare_signature(payload, self.key, job.time)))
            except REFUSED as e:
                out[i] = e
        others = [i for i, job in enumerate(jobs) if not isinstance(job, TagJob | CommitJob)]
        if others:  # receipts, manifests one by one, time-stamp tokens in one round trip
            for i, o in zip(others, super().build_many([jobs[i] for i in others]), strict=True):
                out[i] = o
        if prepared:
            values = self.conn.sign_many(self.key.keygrip, prepared[0][3].hash_algo,
                                         [p.digest for _, _, _, p in prepared])
            for (i, job, payload, p), v in zip(prepared, values, strict=True):
                try:
                    signature = openpgp.finish_signature(p, self.key, v)
                    out[i] = job.embed(payload, signature).decode("ascii")
                except REFUSED as e:
                    out[i] = e
        return [o if o is not None else RuntimeError("not built") for o in out]

    def signature(self, payload: bytes, t: int) -> str:
        return openpgp.detached_signature(payload, self.key, t, self._sign)

    def receipt(self, text: str, t: int) -> str:
        return cleartext.clearsign(text, self.key, t, self._sign)

    @property
    def fingerprint(self) -> str:
        return self.key.fingerprint

    def manifest(self, header: str, lines: str, t: int) -> str:
        # No line of a manifest starts with "-" (check_structure): nothing is dash-escaped.
        head, signature = cleartext.clearsign_parts(header + lines, self.key, t, self._sign)
        return head + header + signature


class SshSigner(Signer):
    """SSHSIG signatures: namespace ``git`` for git objects, ``stampd`` for receipts. A
    receipt is the statement followed by its armored SSH signature. With ``chain``, RFC 3161
    time-stamp tokens too (an ECDSA key)."""

    def __init__(self, key: SshPublicKey, conn: SshAgentConnection,
                 chain: list[bytes] | None = None) -> None:
        self.key = key
        self.conn = conn
        self.chain = chain

    def uid(self, job: GitJob) -> str:
        if job.uid is None:
            raise MalformedMessage("an SSH-signed job needs a uid")
        return job.uid

    def signature(self, payload: bytes, t: int) -> str:
        return self.conn.sshsig(self.key, payload, "git")

    def receipt(self, text: str, t: int) -> str:
        return text + self.conn.sshsig(self.key, text.encode("utf-8"), RECEIPT_NAMESPACE)

    @property
    def fingerprint(self) -> str:
        return self.key.fingerprint

    def manifest(self, header: str, lines: str, t: int) -> str:
        return header + self.conn.sshsig(self.key, (header + lines).encode("utf-8"),
                                         RECEIPT_NAMESPACE)

    def make_tsa_key(self) -> tsa.TsaKey:
        from workers import tsa

        return tsa.ssh_agent_key(self.key, self.conn)


class Dispatchers:
    """The worker's connections to the dispatchers of this host's HTTP processes: one Unix
    socket each (`DispatchConfig.sockets`). Jobs are taken from them in turn and each answer
    goes back on the connection its job came on. A connection that drops (its HTTP process
    died; the dispatcher gives the jobs it held to other workers) is tried again every
    `RETRY` seconds while the others are served; the worker stops when none has been left
    for `ALONE_FOR` seconds (an HTTP process is restarted within about a second; when the
    server stops, the supervisor stops the workers in that time).

    ``hello`` is the frame sent first on every new connection."""

    RETRY = 0.5
    ALONE_FOR = 5.0

    def __init__(self, paths: tuple[Path, ...], hello: bytes, name: str) -> None:
        self.paths = paths
        self.hello = hello
        self.name = name
        self.links: dict[Path, tuple[socket.socket, FrameBuffer]] = {}
        self.lost: dict[Path, float] = {}  # path -> when to try it again (monotonic)
        self._turn = 0

    def connect(self, deadline: float) -> None:
        """Connect to every dispatcher; wait (bounded) until at least one answers. Those that
        do not yet are tried again while serving. Raises what the last attempt raised when
        none answered by ``deadline``."""
        delay = 0.05
        while True:
            error: OSError | None = None
            for path in self.paths:
                try:
                    self._open(path)
                except (FileNotFoundError, ConnectionRefusedError) as e:
                    error = e
                    self.lost[path] = 0.0
            if self.links or error is None:
                return
            if time.monotonic() > deadline:
                raise error
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _open(self, path: Path) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            sock.sendall(self.hello)
        except OSError:
            sock.close()
            raise
        self.lost.pop(path, None)
        # (only a manifest job may be that large)
        self.links[path] = (sock, FrameBuffer(MAX_MANIFEST_FRAME))

    def drop(self, path: Path, why: str) -> None:
        sock, _ = self.links.pop(path)
        sock.close()
        self.lost[path] = time.monotonic() + self.RETRY
        log.warning("worker %s: dispatcher %s %s", self.name, path.name, why)

    def _retry_lost(self) -> None:
        now = time.monotonic()
        for path, when in list(self.lost.items()):
            if when <= now:
                try:
                    self._open(path)
                    log.info("worker %s: dispatcher %s is back", self.name, path.name)
                except OSError:
                    self.lost[path] = now + self.RETRY

    def _ready_frames(self) -> tuple[Path, list[dict[str, Any]]] | None:
        """Every whole job already received on one connection, taking the connections in
        turn."""
        paths = list(self.links)
        for i in range(len(paths)):
            path = paths[(self._turn + i) % len(paths)]
            frames = self.links[path][1]
            messages = []
            while (message := frames.next()) is not None:
                messages.append(message)
            if messages:
                self._turn = (self._turn + i + 1) % len(paths)
                return path, messages
        return None

    def next_jobs(self, timeout: float) -> tuple[Path, list[dict[str, Any]]] | None:
        """The jobs that have arrived on one connection (at least one), and that connection;
        None after ``timeout`` seconds with none, or when no connection is left (`links` is
        then empty)."""
        found = self._ready_frames()
        if found is not None:
            return found
        if self.lost:
            self._retry_lost()
        if not self.links:
            return None
        by_fd = {sock: path for path, (sock, _) in self.links.items()}
        ready, _, _ = select.select(list(by_fd), [], [], timeout)
        for sock in ready:
            path = by_fd[sock]
            try:
                data = sock.recv(RECV_SIZE)
            except OSError as e:
                self.drop(path, f"cannot be read from ({e.strerror})")
                continue
            if not data:
                self.drop(path, "closed the connection")
                continue
            self.links[path][1].feed(data)
        return self._ready_frames()

    def answer(self, path: Path, frame: bytes) -> None:
        link = self.links.get(path)
        if link is None:
            return  # its dispatcher is gone, and gave the job to another worker
        try:
            link[0].sendall(frame)
        except OSError as e:
            self.drop(path, f"cannot be written to ({e.strerror})")

    def close(self) -> None:
        for sock, _ in self.links.values():
            sock.close()
        self.links.clear()


def idle_check(agent: GpgAgent | SshAgent, parent: int, name: str) -> int | None:
    """The exit status a waiting worker must exit with: its agent died, or its supervisor
    (whose child it is) is gone. None: carry on."""
    if not agent.running:
        log.error("worker %s: agent %s is gone", name, agent.pid)
        return EXIT_AGENT_DIED
    if os.getppid() != parent:
        log.error("worker %s: supervisor is gone", name)
        return EXIT_NO_DISPATCHER
    return None


def sign_many(signer: Signer, messages: Sequence[dict[str, Any]]) -> list[Result]:
    """The answers to several job frames (`sign` for each), their git objects signed in one
    agent round trip where the signer can (`Signer.build_many`)."""
    ids: list[int] = []
    jobs: list[Job] = []
    answers: list[Result | None] = []
    for data in messages:
        job_id = data.get("id")
        answers.append(None)
        ids.append(int(job_id) if isinstance(job_id, int) else 0)
        try:
            jobs.append(job_from_dict(data))
        except REFUSED as e:
            answers[-1] = Result(ids[-1], error=f"malformed job: {e!r}")
    built = iter(signer.build_many(jobs))
    out = []
    for job_id, answer in zip(ids, answers, strict=True):
        if answer is None:
            b = next(built)
            answer = Result(job_id, error=f"malformed job: {b!r}") if isinstance(b, Exception) \
                else Result(job_id, object=b)
        out.append(answer)
    return out


def sign(signer: Signer, job_id: int | None, data: dict[str, Any]) -> Result:
    """The answer to one job: the signed object, or a refusal of a malformed job. An agent
    failure propagates (the worker exits, and the job goes to another worker)."""
    try:
        return Result(int(job_id or 0), object=signer.build(job_from_dict(data)))
    except REFUSED as e:
        return Result(int(job_id or 0), error=f"malformed job: {e!r}")


def serve(dispatchers: Dispatchers, signer: Signer, agent: GpgAgent | SshAgent, name: str,
          parent: int | None = None) -> int:
    """Sign the jobs that come from ``dispatchers``. ``parent``: the supervisor's PID (default:
    our parent's now)."""
    parent = os.getppid() if parent is None else parent
    alone_since: float | None = None  # when the last dispatcher went
    while True:
        found = dispatchers.next_jobs(1.0)
        if found is None:
            if dispatchers.links:
                alone_since = None
            elif alone_since is None:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since > dispatchers.ALONE_FOR:
                log.warning("worker %s: no dispatcher left", name)
                return EXIT_NO_DISPATCHER
            else:
                time.sleep(dispatchers.RETRY)
            code = idle_check(agent, parent, name)
            if code is not None:
                return code
            continue
        path, messages = found
        try:
            replies = sign_many(signer, messages)
        except AgentError as e:
            log.error("worker %s: signing failed (%s); exiting so that another worker signs",
                      name, " ".join(str(e).split()))
            return EXIT_AGENT_DIED
        dispatchers.answer(path, b"".join(reply.frame() for reply in replies))


def serve_db(dsn: str, signer: Signer, agent: GpgAgent | SshAgent, name: str, key_id: str,
             beat_every: float = 2.0, parent: int | None = None) -> int:
    """The worker loop of database dispatch: claim, sign, record, notify (`workers.jobtable`).
    ``parent`` as for `serve`."""
    import psycopg

    parent = os.getppid() if parent is None else parent
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(jobtable.LISTEN_JOBS)
        # A job queued while we work is announced during one of our own statements. Without
        # a handler psycopg keeps every such notification until we next wait (under steady
        # load: never, so the worker's memory grows with every job); the handler only notes
        # that one came, so that we look for that job before waiting.
        woken = [False]

        def note(_n: psycopg.Notify) -> None:
            woken[0] = True

        conn.add_notify_handler(note)
        last_beat = 0.0
        try:
            while True:
                now = time.time()
                if now - last_beat >= beat_every:
                    conn.execute(*jobtable.heartbeat(name, key_id, os.getpid(), now))
                    last_beat = now
                row = conn.execute(*jobtable.claim(name, key_id, now)).fetchone()
                if row is not None:
                    job_id, payload = row
                    try:
                        answer = sign(signer, job_id, decode_frame(payload.encode()))
                    except AgentError as e:
                        log.error("worker %s: signing failed (%s); exiting (the job is "
                                  "requeued once our heartbeat stops)", name,
                                  " ".join(str(e).split()))
                        return EXIT_AGENT_DIED
                    except MalformedMessage as e:
                        answer = Result(job_id, error=f"malformed job: {e!r}")
                    stored = conn.execute(*jobtable.store(job_id, name, answer.object,
                                                          answer.error))
                    if stored.rowcount == 1:
                        conn.execute(*jobtable.notify_done(job_id))
                    else:  # taken over meanwhile: this signature is never issued
                        log.warning("worker %s: job %s was taken over; result dropped",
                                    name, job_id)
                    continue
                if woken[0]:  # a job was announced while we claimed: look again
                    woken[0] = False
                    continue
                for _ in conn.notifies(timeout=1.0, stop_after=1):
                    pass
                woken[0] = False  # (the handler hears the ones notifies() gave too)
                code = idle_check(agent, parent, name)
                if code is not None:
                    return code
        finally:
            with contextlib.suppress(Exception):
                conn.execute(*jobtable.forget_worker(name))


def write_status(home: Path, status: str) -> None:
    """Replace the worker's one-line status in its home (`STATUS_FILE`)."""
    tmp = home / f"{STATUS_FILE}.tmp"
    tmp.write_text(" ".join(status.split()) + "\n")
    os.replace(tmp, home / STATUS_FILE)


def read_status(home: Path) -> str | None:
    """The status a worker left in ``home``; None when it wrote none."""
    try:
        return (home / STATUS_FILE).read_text().strip() or None
    except OSError:
        return None


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
    certificate chain, if it has one (`tsa.TsaError` when that is unreadable or another key's)."""
    secret, public = _key_files(config)
    signer: Signer
    try:
        if isinstance(agent, SshAgent):
            ssh_key = agent.add_key(secret)
            if ssh_key.blob != SshKeyStore(config.key_dir).public_key().blob:
                raise KeyStoreError(f"it holds another key than {public}")
            signer, fingerprint = SshSigner(ssh_key, agent.connect()), ssh_key.fingerprint
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
    certificate chain is another key's."""
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
            signature = signer.signature(message, t)
        except AgentError as e:
            if not agent.running:
                raise
            raise KeyUnusable(config.key_id, secret, f"its agent cannot sign with it: {e}"
                              ) from None
        try:
            if isinstance(signer, OpenPgpSigner):
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
        dispatchers = Dispatchers(
            dispatch.sockets, Hello(config.name, os.getpid(), fingerprint, config.key_id).frame(),
            config.name)
        try:
            dispatchers.connect(time.monotonic() + 120)
            log.info("ready: key %s (%s), agent pid %d, %d of %d dispatchers", fingerprint,
                     config.key_id, agent.pid, len(dispatchers.links), len(dispatch.sockets))
            return serve(dispatchers, signer, agent, config.name, supervisor)
        finally:
            dispatchers.close()
    except (KeyUnusable, TsaError) as e:  # the supervisor reports it, once for all attempts
        log.info("worker %s: %s", config.name, e.message)
        with contextlib.suppress(OSError):
            write_status(config.home, f"{UNUSABLE} {e.message}")
        return EXIT_KEY_UNUSABLE
    except AgentError as e:
        log.error("worker %s: the agent failed: %s", config.name, " ".join(str(e).split()))
        return EXIT_AGENT_DIED
    except (FileNotFoundError, ConnectionRefusedError):
        log.exception("cannot reach a dispatcher at %s",
                      ", ".join(map(str, config.dispatch.sockets)))
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
    logging.basicConfig(level=config.log_level,
                        format=f"%(asctime)s worker[{config.name}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return run(config, parent if config.supervisor is None else config.supervisor)


if __name__ == "__main__":
    sys.exit(main())
