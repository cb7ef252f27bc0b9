"""What signs a worker's jobs: one key held by one agent (`Signer`), OpenPGP through gpg-agent
(`OpenPgpSigner`) or SSHSIG through ssh-agent (`SshSigner`).

A signer builds the object of a job (`formats.jobs`): a git tag or commit, a digest receipt, a
manifest or an RFC 3161 time-stamp token, and has its agent sign it; `Signer.build_many` signs
the jobs of one batch in as few agent round trips as the agent allows. The log key's signer
(`NoteSigner`) signs checkpoint notes and nothing else, the witness key's (`CosignSigner`)
cosignatures of other logs' checkpoints and nothing else, and no other signer signs them. A job
it cannot build, or of a kind it does not sign, is refused (`REFUSED`: the others of its batch
are still signed); the agent's errors (`workers.errors.AgentError`) propagate: the worker
exits and its jobs go to another worker.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from formats import cleartext, manifests, openpgp
from formats.jobs import (
    CosignJob,
    GitJob,
    Job,
    MalformedMessage,
    ManifestJob,
    NoteJob,
    ReceiptJob,
    TagJob,
    TimestampJob,
)
from formats.receipts import RECEIPT_NAMESPACE
from formats.sshsig import SshPublicKey, SshReader, SshSigError
from workers.agents.gpg import AssuanConnection
from workers.agents.ssh import SshAgentConnection, SshAgentError

if TYPE_CHECKING:
    from workers import tsa

# What makes a worker refuse one job as malformed (the others of its batch are still signed).
REFUSED = (MalformedMessage, ValueError, UnicodeError)
GIT = TagJob.kind  # (and CommitJob.kind): git objects, built and signed alike
_NOT_BUILT = RuntimeError("not built")  # (a place every builder fills)


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

    # -- one method per kind of job ----------------------------------------------------------
    # Each job class names its ``kind`` (`formats.jobs`); `builders` maps it to the method that
    # builds one job of that kind, `batch_builders` to one that builds several in one agent
    # round trip. Nothing else looks at a job's type.

    def builders(self) -> dict[str, Callable[[Any], str]]:
        """What builds one job of each kind: its signed object (ASCII text), or raises the
        `REFUSED` error that makes it malformed."""
        return {GIT: self.build_git_object, ReceiptJob.kind: self.build_receipt,
                ManifestJob.kind: self.build_manifest, TimestampJob.kind: self.build_timestamp}

    def batch_builders(self) -> dict[str, Callable[[Sequence[Any]], list[str | Exception]]]:
        """What builds several jobs of one kind together (`build_many`): the signed object of
        each, or the `REFUSED` error that made it malformed, in their order. Kinds not here are
        built one by one. Time-stamp tokens are signed in one agent round trip
        (`tsa.build_tokens`); signers whose agent signs several git objects so add theirs."""
        return {TimestampJob.kind: self.build_timestamps}

    def build_git_object(self, job: GitJob) -> str:
        payload = job.payload(self.uid(job))
        return job.embed(payload, self.signature(payload, job.time)).decode("ascii")

    def build_receipt(self, job: ReceiptJob) -> str:
        return self.receipt(job.text, job.time)

    def build_manifest(self, job: ManifestJob) -> str:
        """Only a well-formed manifest is signed: its lines are checksum lines of its
        algorithm, its header parses and names this worker's key."""
        lines = manifests.as_str(job.lines)  # (a worker's job holds a str already)
        count = manifests.check_structure(lines, job.algorithm)
        header = job.header(count)
        if header.key != self.fingerprint:
            raise MalformedMessage("the manifest names another key")
        text = header.text()
        manifests.parse_header(text)
        return self.manifest(text, lines, job.time)

    def build_timestamp(self, job: TimestampJob) -> str:
        """The RFC 3161 token of ``job`` (DER), in base64."""
        if not self.chain:
            raise MalformedMessage("this key has no TSA certificate")
        from workers import tsa  # (imported by the TSA key's worker only: asn1crypto is 0.1 s)

        token = tsa.build_token(job, self.tsa_key(), self.chain)
        return base64.b64encode(token).decode("ascii")

    def build_timestamps(self, jobs: Sequence[TimestampJob]) -> list[str | Exception]:
        if not self.chain:  # each refused
            return one_by_one(self.build_timestamp, jobs)
        from workers import tsa

        built = tsa.build_tokens(jobs, self.tsa_key(), self.chain)
        return [token if isinstance(token, Exception)
                else base64.b64encode(token).decode("ascii") for token in built]

    def refusal(self, kind: str) -> MalformedMessage:
        """Why this signer refuses every job of ``kind``, which it has no builder for."""
        if kind == NoteJob.kind:
            return MalformedMessage(f"key {self.fingerprint} does not sign log checkpoints")
        if kind == CosignJob.kind:
            return MalformedMessage(f"key {self.fingerprint} does not sign cosignatures")
        return MalformedMessage(f"key {self.fingerprint} does not sign {kind} jobs")

    def build(self, job: Job) -> str:
        """The signed object of ``job`` (ASCII text)."""
        builder = self.builders().get(job.kind)
        if builder is None:
            raise self.refusal(job.kind)
        return builder(job)

    def build_many(self, jobs: Sequence[Job]) -> list[str | Exception]:
        """The signed object of each of ``jobs``, or the `REFUSED` error that made it
        malformed; the agent's errors propagate. The jobs of a kind that has a batch builder
        are built together, the others one by one."""
        out: list[str | Exception] = [_NOT_BUILT] * len(jobs)
        by_kind: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_kind.setdefault(job.kind, []).append(i)
        batch_builders = self.batch_builders()
        builders = self.builders()
        for kind, places in by_kind.items():
            these = [jobs[i] for i in places]
            batch = batch_builders.get(kind)
            built: list[str | Exception]
            if batch is not None:
                built = batch(these)
            elif kind in builders:
                built = one_by_one(builders[kind], these)
            else:
                built = [self.refusal(kind) for _ in these]
            for i, b in zip(places, built, strict=True):
                out[i] = b
        return out


def one_by_one(build: Callable[[Any], str], jobs: Sequence[Any]) -> list[str | Exception]:
    """``build`` of each of ``jobs``, or the `REFUSED` error it raised."""
    out: list[str | Exception] = []
    for job in jobs:
        try:
            out.append(build(job))
        except REFUSED as e:
            out.append(e)
    return out


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

    def batch_builders(self) -> dict[str, Callable[[Sequence[Any]], list[str | Exception]]]:
        return {**super().batch_builders(), GIT: self.build_git_objects}

    def build_git_objects(self, jobs: Sequence[GitJob]) -> list[str | Exception]:
        """Git objects signed in one agent round trip (`AssuanConnection.sign_many`)."""
        out: list[str | Exception] = [_NOT_BUILT] * len(jobs)
        prepared: list[tuple[int, GitJob, bytes, openpgp.PreparedSignature]] = []
        for i, job in enumerate(jobs):
            try:
                payload = job.payload(self.uid(job))
                prepared.append((i, job, payload,
                                 openpgp.prepare_signature(payload, self.key, job.time)))
            except REFUSED as e:
                out[i] = e
        if prepared:
            values = self.conn.sign_many(self.key.keygrip, prepared[0][3].hash_algo,
                                         [p.digest for _, _, _, p in prepared])
            for (i, job, payload, p), v in zip(prepared, values, strict=True):
                try:
                    signature = openpgp.finish_signature(p, self.key, v)
                    out[i] = job.embed(payload, signature).decode("ascii")
                except REFUSED as e:
                    out[i] = e
        return out

    def signature(self, payload: bytes, t: int) -> str:
        return openpgp.detached_signature(payload, self.key, t, self._sign)

    def receipt(self, text: str, t: int) -> str:
        return cleartext.clearsign(text, self.key, t, self._sign)

    @property
    def fingerprint(self) -> str:
        return self.key.fingerprint

    def manifest(self, header: str, lines: str, t: int) -> str:
        # No line of a manifest starts with "-" (check_structure): nothing is dash-escaped.
        # Header and lines are hashed a piece at a time, never joined (nor copied whole).
        head, signature = cleartext.clearsign_parts((header, lines), self.key, t, self._sign)
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
        return header + self.conn.sshsig(self.key, manifests.utf8_pieces(header, lines),
                                         RECEIPT_NAMESPACE)

    def make_tsa_key(self) -> tsa.TsaKey:
        from workers import tsa

        return tsa.ssh_agent_key(self.key, self.conn)


class NoteSigner(SshSigner):
    """The log key's signer: plain Ed25519 signatures of checkpoint notes (`NoteJob`), through
    ssh-agent, and nothing else. The agent signs the note's text as it is (an Ed25519 key's
    SSH signature is RFC 8032 Ed25519 over the data given, so no SSHSIG around it)."""

    def __init__(self, key: SshPublicKey, conn: SshAgentConnection) -> None:
        if key.key_type != "ssh-ed25519":
            raise MalformedMessage(f"the log key must be ssh-ed25519, not {key.key_type}")
        super().__init__(key, conn)

    def builders(self) -> dict[str, Callable[[Any], str]]:
        return {NoteJob.kind: self.build_note}

    def batch_builders(self) -> dict[str, Callable[[Sequence[Any]], list[str | Exception]]]:
        return {}

    def refusal(self, kind: str) -> MalformedMessage:
        return MalformedMessage("the log key signs log checkpoints only")

    def note_signature(self, text: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``text`` (one agent round trip)."""
        blob = self.conn.sign(self.key.blob, text)
        try:
            reader = SshReader(blob, "signature")
            algorithm = reader.text()
            signature = reader.string()
            reader.end()
        except SshSigError as e:  # (the agent's fault, not the job's: the worker exits)
            raise SshAgentError(f"the agent's signature is malformed: {e}") from None
        if algorithm != "ssh-ed25519" or len(signature) != 64:
            raise SshAgentError(f"the agent's signature is not Ed25519 ({algorithm})")
        return signature

    def build_note(self, job: NoteJob) -> str:
        """The base64 of the Ed25519 signature of the note's text (UTF-8)."""
        return base64.b64encode(self.note_signature(job.text.encode("utf-8"))).decode("ascii")


class CosignSigner(NoteSigner):
    """The witness key's signer: cosignatures (`CosignJob`: plain Ed25519 over
    `formats.tlog.checkpoint.cosignature_message`), through ssh-agent, and nothing else."""

    def builders(self) -> dict[str, Callable[[Any], str]]:
        return {CosignJob.kind: self.build_cosignature}

    def refusal(self, kind: str) -> MalformedMessage:
        return MalformedMessage("the witness key signs cosignatures only")

    def build_cosignature(self, job: CosignJob) -> str:
        """The base64 of the Ed25519 signature of the cosignature message."""
        from formats.tlog.checkpoint import cosignature_message
        from formats.tlog.errors import TlogError

        try:
            message = cosignature_message(job.body, job.timestamp)
        except TlogError as e:
            raise MalformedMessage(str(e)) from None
        return base64.b64encode(self.note_signature(message)).decode("ascii")
