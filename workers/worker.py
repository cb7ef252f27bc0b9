"""One signing worker process: its own gpg-agent, a persistent Assuan connection, one loop.

Started by `workers.pool.WorkerPool` with a private 0700 home directory. The worker

1. starts a gpg-agent in that home and imports the secret key from the key store,
2. connects to the dispatcher's Unix socket and says hello,
3. builds and signs every job it receives (no process spawn per signature),
4. exits non-zero as soon as its agent is gone, and stops its agent when it exits.

The supervisor removes the home (and kills a left-over agent) after the process is reaped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from workers import cleartext, gitobjects, openpgp, wire
from workers.agents import AgentError, AssuanConnection, GpgAgent
from workers.keys import KeyStore
from workers.keyset import PRIMARY, RECEIPT_NAMESPACE, SshKeyStore
from workers.sshagent import SshAgent, SshAgentConnection, SshAgentError
from workers.sshsig import SshPublicKey

log = logging.getLogger(__name__)

EXIT_AGENT_DIED = 3
EXIT_NO_DISPATCHER = 4
AGENT_PID_FILE = "agent.pid"


class Signer:
    """Builds and signs git objects and receipts with one key held by one agent.

    Subclasses say how a payload is signed (OpenPGP or SSH) and which user id goes into the
    tagger/committer lines."""

    def uid(self, job: dict[str, Any]) -> str:
        raise NotImplementedError

    def signature(self, payload: bytes, t: int) -> str:
        raise NotImplementedError

    def receipt(self, text: str, t: int) -> str:
        raise NotImplementedError

    def build(self, job: dict[str, Any]) -> str:
        t = int(job["time"])
        op = job["op"]
        message = str(job.get("message", ""))
        if op == "tag":
            payload = gitobjects.tag_payload(job["commit"], job["tagname"], self.uid(job), t,
                                             message)
            obj = gitobjects.embed_tag_signature(payload, self.signature(payload, t))
        elif op == "commit":
            payload = gitobjects.commit_payload(job["tree"], job["parents"], self.uid(job), t,
                                                message)
            obj = gitobjects.embed_commit_signature(payload, self.signature(payload, t))
        elif op == "receipt":
            return self.receipt(str(job["text"]), t)
        else:
            raise ValueError(f"unknown op {op!r}")
        return obj.decode("ascii")


class OpenPgpSigner(Signer):
    def __init__(self, key: openpgp.KeyInfo, conn: AssuanConnection) -> None:
        self.key = key
        self.conn = conn

    def _sign(self, hash_algo: int, digest: bytes) -> list[int]:
        return self.conn.sign(self.key.keygrip, hash_algo, digest)

    def uid(self, job: dict[str, Any]) -> str:
        return self.key.uid  # the client checks the uid of the key it fetched

    def signature(self, payload: bytes, t: int) -> str:
        return openpgp.detached_signature(payload, self.key, t, self._sign)

    def receipt(self, text: str, t: int) -> str:
        return cleartext.clearsign(text, self.key, t, self._sign)


class SshSigner(Signer):
    """SSHSIG signatures: namespace ``git`` for git objects, ``stampd`` for receipts. A
    receipt is the statement followed by its armored SSH signature."""

    def __init__(self, key: SshPublicKey, conn: SshAgentConnection) -> None:
        self.key = key
        self.conn = conn

    def uid(self, job: dict[str, Any]) -> str:
        return str(job["uid"])

    def signature(self, payload: bytes, t: int) -> str:
        return self.conn.sshsig(self.key, payload, "git")

    def receipt(self, text: str, t: int) -> str:
        return text + self.conn.sshsig(self.key, text.encode("utf-8"), RECEIPT_NAMESPACE)


def connect(path: Path, deadline: float) -> socket.socket:
    """Connect to the dispatcher, waiting (bounded) for it to come up."""
    delay = 0.05
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


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


def serve(sock: socket.socket, signer: Signer, agent: GpgAgent | SshAgent, name: str) -> int:
    reader = wire.FrameReader(sock)
    parent = os.getppid()
    while True:
        while not reader.has_frame():
            ready, _, _ = select.select([sock], [], [], 1.0)
            if not ready:
                code = idle_check(agent, parent, name)
                if code is not None:
                    return code
                continue
            if not reader.fill():
                log.warning("worker %s: dispatcher closed the connection", name)
                return EXIT_NO_DISPATCHER
        job = reader.next_frame()
        try:
            reply: dict[str, Any] = {"id": job["id"], "object": signer.build(job)}
        except (AgentError, SshAgentError):
            log.exception("worker %s: signing failed; exiting so that another worker signs",
                          name)
            return EXIT_AGENT_DIED
        except (KeyError, ValueError, TypeError, UnicodeError) as e:
            reply = {"id": job.get("id"), "error": f"malformed job: {e!r}"}
        sock.sendall(wire.encode(reply))


CLAIM = (
    "UPDATE jobs SET state = 'claimed', worker = %(w)s, claimed_at = %(t)s, "
    "attempts = attempts + 1 WHERE id = (SELECT id FROM jobs WHERE state = 'queued' "
    "AND key_id = %(k)s ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id, payload"
)
STORE = (
    "UPDATE jobs SET state = %(s)s, result = %(r)s, error = %(e)s "
    "WHERE id = %(id)s AND worker = %(w)s AND state = 'claimed'"
)
BEAT = (
    "INSERT INTO worker_heartbeats (name, key_id, pid, started_at, last_seen) "
    "VALUES (%(w)s, %(k)s, %(p)s, %(t)s, %(t)s) "
    "ON CONFLICT (name) DO UPDATE SET last_seen = EXCLUDED.last_seen, key_id = EXCLUDED.key_id"
)


def serve_db(dsn: str, signer: Signer, agent: GpgAgent | SshAgent, name: str, key_id: str,
             beat_every: float = 2.0) -> int:
    """The worker loop of ``STAMPD_DISPATCH=database``: claim, sign, record, notify."""
    import psycopg

    parent = os.getppid()
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("LISTEN stampd_jobs")
        last_beat = 0.0
        try:
            while True:
                now = time.time()
                if now - last_beat >= beat_every:
                    conn.execute(BEAT, {"w": name, "k": key_id, "p": os.getpid(), "t": now})
                    last_beat = now
                row = conn.execute(CLAIM, {"w": name, "t": now, "k": key_id}).fetchone()
                if row is not None:
                    job_id, payload = row
                    try:
                        result, state, error = signer.build(json.loads(payload)), "done", None
                    except (AgentError, SshAgentError):
                        log.exception("worker %s: signing failed; exiting (the job is "
                                      "requeued once our heartbeat stops)", name)
                        return EXIT_AGENT_DIED
                    except (KeyError, ValueError, TypeError, UnicodeError) as e:
                        result, state, error = None, "failed", f"malformed job: {e!r}"
                    stored = conn.execute(STORE, {"s": state, "r": result, "e": error,
                                                  "id": job_id, "w": name})
                    if stored.rowcount == 1:
                        conn.execute("SELECT pg_notify('stampd_done', %s)", (str(job_id),))
                    else:  # taken over meanwhile: this signature is never issued
                        log.warning("worker %s: job %s was taken over; result dropped",
                                    name, job_id)
                    continue
                for _ in conn.notifies(timeout=1.0, stop_after=1):
                    pass
                code = idle_check(agent, parent, name)
                if code is not None:
                    return code
        finally:
            with contextlib.suppress(Exception):
                conn.execute("DELETE FROM worker_heartbeats WHERE name = %s", (name,))


def main(argv: list[str] | None = None) -> int:
    from server.settings import Settings

    ap = argparse.ArgumentParser(prog="stampd-worker")
    ap.add_argument("--name", required=True)
    ap.add_argument("--home", required=True, type=Path)
    ap.add_argument("--key-id", default=PRIMARY, help="which key of the key set to serve")
    ap.add_argument("--format", default="openpgp", choices=["openpgp", "ssh"])
    ap.add_argument("--key-dir", type=Path, help="key directory (default: the primary key)")
    args = ap.parse_args(argv)
    settings = Settings()
    logging.basicConfig(level=os.environ.get("STAMPD_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s worker[{args.name}] %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    key_dir = args.key_dir or settings.keys_dir
    agent: GpgAgent | SshAgent
    if args.format == "ssh":
        agent = SshAgent(args.home)
    else:
        agent = GpgAgent(args.home, passphrase=settings.read_passphrase())
    try:
        agent.start()
        (args.home / AGENT_PID_FILE).write_text(str(agent.pid))
        signer: Signer
        if isinstance(agent, SshAgent):
            ssh_key = agent.add_key(SshKeyStore(key_dir).private_key_file)
            signer, fingerprint = SshSigner(ssh_key, agent.connect()), ssh_key.fingerprint
        else:
            key = agent.import_secret_key(KeyStore(key_dir).secret_key_file)
            signer, fingerprint = OpenPgpSigner(key, agent.connect()), key.fingerprint
        if settings.dispatch == "database":
            from sqlalchemy.engine import make_url

            dsn = make_url(settings.db_url).set(drivername="postgresql").render_as_string(
                hide_password=False)
            log.info("ready: key %s (%s), agent pid %d, jobs from the database",
                     fingerprint, args.key_id, agent.pid)
            return serve_db(dsn, signer, agent, args.name, args.key_id)
        sock = connect(settings.dispatch_socket, time.monotonic() + 120)
        sock.sendall(wire.encode({"hello": {"worker": args.name, "pid": os.getpid(),
                                            "fingerprint": fingerprint, "key": args.key_id}}))
        log.info("ready: key %s (%s), agent pid %d", fingerprint, args.key_id, agent.pid)
        return serve(sock, signer, agent, args.name)
    except (AgentError, SshAgentError):
        log.exception("the agent failed")
        return EXIT_AGENT_DIED
    except (FileNotFoundError, ConnectionRefusedError):
        log.exception("cannot reach the dispatcher at %s", settings.dispatch_socket)
        return EXIT_NO_DISPATCHER
    finally:
        agent.stop()


if __name__ == "__main__":
    sys.exit(main())
