"""What signs a worker's jobs: one key held by one agent (`Signer`), OpenPGP through gpg-agent
(`OpenPgpSigner`) or SSHSIG through ssh-agent (`SshSigner`).

A signer builds the object of a job (`formats.jobs`): a git tag or commit, a digest receipt, a
manifest or an RFC 3161 time-stamp token, and has its agent sign it; `Signer.build_many` signs
the jobs of one batch in as few agent round trips as the agent allows. A job it cannot build
is refused (`REFUSED`: the others of its batch are still signed); the agent's errors
(`workers.errors.AgentError`) propagate: the worker exits and its jobs go to another worker.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING

from formats import cleartext, manifests, openpgp
from formats.jobs import (
    CommitJob,
    GitJob,
    Job,
    MalformedMessage,
    ManifestJob,
    ReceiptJob,
    TagJob,
    TimestampJob,
)
from formats.sshsig import SshPublicKey
from workers.agents.gpg import AssuanConnection
from workers.agents.ssh import SshAgentConnection
from workers.keys.keyset import RECEIPT_NAMESPACE

if TYPE_CHECKING:
    from workers import tsa

# What makes a worker refuse one job as malformed (the others of its batch are still signed).
REFUSED = (MalformedMessage, ValueError, UnicodeError)


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
