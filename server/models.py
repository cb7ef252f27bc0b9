"""SQLAlchemy models: the journal of stamps and the log commits that publish them."""

from __future__ import annotations

import enum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Connection,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from formats.jobs import JobState

# SQLite only auto-increments INTEGER PRIMARY KEY columns.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


def state_check(table: str, states: type[enum.StrEnum]) -> CheckConstraint:
    """The CHECK constraint ``ck_<table>_state``: the table's ``state`` column holds one of
    ``states``' values, and the database refuses any other (migration 0010 adds them)."""
    values = ", ".join(f"'{s.value}'" for s in states)
    return CheckConstraint(f"state IN ({values})", name=f"ck_{table}_state")


class StampState(enum.StrEnum):
    """The ``stamps.state`` column."""

    PENDING = "pending"  # journaled, not (yet known to be) signed
    SIGNED = "signed"
    FAILED = "failed"  # every attempt failed; the client got a 503
    # A failed stamp the log committer has assigned to a log commit without publishing it
    # (set in the same transaction; only ``failed`` ever becomes this). A stamp assigned while
    # it was signed, pending or orphaned is published, whatever outcome it gets later.
    FAILED_UNLOGGED = "failed-unlogged"
    # A pending stamp old enough that no live request is behind it (its process died between
    # journaling it and recording its outcome, perhaps after its signature went out), published
    # as such: the first log to publish it marks it so in the same transaction (migration
    # 0014). An outcome recorded after all (a process that was only stalled) still replaces it.
    ORPHANED = "orphaned"


class Stamp(Base):
    """One accepted timestamp request, committed before its signature is made."""

    __tablename__ = "stamps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # tag|branch|digest|tsa|manifest
    commit: Mapped[str | None] = mapped_column(String(64))  # git stamps
    algorithm: Mapped[str | None] = mapped_column(String(16))  # digest stamps: sha256 | sha512
    digest: Mapped[str | None] = mapped_column(String(128))  # digest stamps: lowercase hex
    tree: Mapped[str | None] = mapped_column(String(64))
    parent: Mapped[str | None] = mapped_column(String(64))
    tagname: Mapped[str | None] = mapped_column(String(100))
    stamped_at: Mapped[int] = mapped_column(BigInteger)  # Unix seconds: the stamp's time
    key_id: Mapped[str | None] = mapped_column(String(64))  # which signing key (None: primary)
    state: Mapped[str] = mapped_column(String(16), default=StampState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(64))
    object_id: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    receipt: Mapped[str | None] = mapped_column(Text)  # a signed receipt (manifests: ManifestText)
    log_commit_id: Mapped[int | None] = mapped_column(ForeignKey("log_commits.id"), index=True)
    # Its entry's index in the transparency log (`TlogEntry`), set when it is sequenced.
    tlog_index: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_stamps_commit", "commit"),
        Index("ix_stamps_digest", "algorithm", "digest"),
        Index("ix_stamps_object_id", "object_id"),
        Index("ix_stamps_tlog_index", "tlog_index", unique=True,
              sqlite_where=text("tlog_index IS NOT NULL"),
              postgresql_where=text("tlog_index IS NOT NULL")),
        # The stamps not yet in the transparency log, in journal order: what the sequencer
        # reads (a partial index: sequenced stamps leave it).
        Index("ix_stamps_untlogged", "id", sqlite_where=text("tlog_index IS NULL"),
              postgresql_where=text("tlog_index IS NULL")),
        state_check("stamps", StampState),
    )


class LogCommitState(enum.StrEnum):
    """The ``log_commits.state`` column."""

    PENDING = "pending"  # stamps assigned, git commit not yet written
    COMMITTED = "committed"


class LogCommit(Base):
    """One commit of the public log repository; its stamps point at it."""

    __tablename__ = "log_commits"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default=LogCommitState.PENDING)
    hash_count: Mapped[int] = mapped_column(Integer, default=0)
    git_commit: Mapped[str | None] = mapped_column(String(64))
    # What it takes to rebuild the commit on another host (the log writer can move between
    # API hosts): the signed commit object and the tree's files other than hashes/digests.
    raw: Mapped[str | None] = mapped_column(Text)
    files: Mapped[str | None] = mapped_column(Text)  # JSON {path: content}

    __table_args__ = (state_check("log_commits", LogCommitState),)


class Peer(Base):
    """A peer timestamping server that stamps our log; its key is pinned on first contact."""

    __tablename__ = "peers"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(String(500))
    fingerprint: Mapped[str | None] = mapped_column(String(40))  # pinned signing key
    uid: Mapped[str | None] = mapped_column(String(500))
    pubkey: Mapped[str | None] = mapped_column(Text)  # armored, as fetched when pinned
    pinned_at: Mapped[int | None] = mapped_column(BigInteger)
    pinned_by: Mapped[str | None] = mapped_column(String(16))  # "config" | "tofu"


class CrossStampState(enum.StrEnum):
    """The ``cross_stamps.state`` column."""

    PENDING = "pending"  # to be (re)tried at next_attempt_at
    DONE = "done"
    SUPERSEDED = "superseded"  # a stamp of a newer log head covers this one


class CrossStamp(Base):
    """One request to a peer to stamp one head of our log: attempts, result, last error."""

    __tablename__ = "cross_stamps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    peer: Mapped[str] = mapped_column(ForeignKey("peers.name"))
    log_commit: Mapped[str] = mapped_column(String(64))  # the main-branch commit to stamp
    state: Mapped[str] = mapped_column(String(16), default=CrossStampState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    stamp_commit: Mapped[str | None] = mapped_column(String(64))  # the peer's stamp, once done
    stamp_text: Mapped[str | None] = mapped_column(Text)  # the stamp object itself

    __table_args__ = (UniqueConstraint("peer", "log_commit", name="uq_cross_stamps_peer_head"),
                      Index("ix_cross_stamps_state", "state", "next_attempt_at"),
                      state_check("cross_stamps", CrossStampState))


class MailStampState(enum.StrEnum):
    """The ``mail_stamps.state`` column."""

    PENDING = "pending"  # to be sent (again) at next_attempt_at
    SENT = "sent"  # sent, waiting for the timestamper's reply
    DONE = "done"  # a good reply is on <stamper>-mailstamps
    SUPERSEDED = "superseded"  # a reply to a newer log head covers this one


class MailStamp(Base):
    """One request to an email timestamper to stamp one head of our log (docs/mail.md): the
    text sent, the reply once a good one came, attempts and the last error."""

    __tablename__ = "mail_stamps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    stamper: Mapped[str] = mapped_column(String(64))
    log_commit: Mapped[str] = mapped_column(String(64))  # the main-branch commit to stamp
    state: Mapped[str] = mapped_column(String(16), default=MailStampState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # sends tried
    refused: Mapped[int] = mapped_column(Integer, default=0)  # replies refused
    last_error: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    sent_at: Mapped[int | None] = mapped_column(BigInteger)
    message_id: Mapped[str | None] = mapped_column(String(255))
    sent_text: Mapped[str | None] = mapped_column(Text)  # the body sent, to be quoted
    replied_at: Mapped[int | None] = mapped_column(BigInteger)
    reply_text: Mapped[str | None] = mapped_column(Text)  # the clear-signed reply
    stamp_commit: Mapped[str | None] = mapped_column(String(64))  # on <stamper>-mailstamps
    stamp_text: Mapped[str | None] = mapped_column(Text)  # that commit, raw (another host
    # that becomes the log writer rebuilds the branch from it)

    __table_args__ = (UniqueConstraint("stamper", "log_commit", name="uq_mail_stamps_head"),
                      Index("ix_mail_stamps_state", "state", "next_attempt_at"),
                      state_check("mail_stamps", MailStampState))


class Job(Base):
    """A signing job handed over through the database (``STAMPD_DISPATCH=database``): API
    hosts insert jobs, worker hosts claim them with ``FOR UPDATE SKIP LOCKED``. The whole
    schema is here (a new job's state and attempts are the table's defaults); every statement
    on this table and on ``worker_heartbeats``, and the states, are `workers.jobtable`'s."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(64))
    payload: Mapped[str] = mapped_column(Text)  # the job as JSON (see formats.jobs)
    state: Mapped[str] = mapped_column(String(16), server_default=JobState.QUEUED.value)
    worker: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # times claimed
    result: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_jobs_claim", "state", "key_id", "id"),
                      state_check("jobs", JobState))


class WorkerHeartbeat(Base):
    """A worker of a `stampd worker` host, alive while ``last_seen`` is recent."""

    __tablename__ = "worker_heartbeats"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class SigningKey(Base):
    """The public half of a key some host signs with, registered by that host at start
    (`server.signing_keys`): API hosts serve exactly these, and a host whose key files disagree
    with them refuses to start."""

    __tablename__ = "signing_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "primary" or <format>-<algo>
    format: Mapped[str] = mapped_column(String(16))  # "openpgp" | "ssh"
    fingerprint: Mapped[str] = mapped_column(String(128))
    algorithm: Mapped[str] = mapped_column(String(64))
    public: Mapped[str] = mapped_column(Text)  # armored OpenPGP key or OpenSSH public key line
    uid: Mapped[str] = mapped_column(String(500))  # the user id written into its stamps
    is_primary: Mapped[bool] = mapped_column(Boolean)
    host: Mapped[str] = mapped_column(String(255))  # the host that registered it last
    registered_at: Mapped[int] = mapped_column(BigInteger)
    # The TSA key's certificate chain (PEM, the TSA certificate first), so that API hosts
    # without key files publish it and sign with it (`server.stamping.rfc3161`).
    certificates: Mapped[str | None] = mapped_column(Text, default=None)


class ManifestDigests(Base):
    """The distinct digests of one manifest (a `Stamp` of kind ``manifest``) that start with
    ``prefix`` (2 bytes or more): sorted, packed as raw bytes, at most
    `formats.manifests.BUCKET_DIGESTS` of them (`formats.manifests.buckets`). Written after
    the manifest's row, a few per transaction, before its serial is handed back (and so before
    it is signed: `server.stamping.journal`)."""

    __tablename__ = "manifest_digests"

    stamp_id: Mapped[int] = mapped_column(BigId, ForeignKey("stamps.id"), primary_key=True,
                                          autoincrement=False)
    prefix: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    algorithm: Mapped[str] = mapped_column(String(16))
    digests: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index("ix_manifest_digests_prefix", "algorithm", "prefix"),)


class ManifestText(Base):
    """A signed manifest (a `Stamp` of kind ``manifest``) in pieces: its UTF-8 text is the
    pieces' concatenation in ``seq`` order (a piece may end inside a character). Written a
    few pieces per transaction, all committed before the stamp is marked signed (a 256 MiB
    text written in one transaction held up every stamp's commit behind it, and took a copy
    of itself to bind); read a piece at a time. A stamp that is not signed may have some of
    its pieces (its process died while they were written): they are not read."""

    __tablename__ = "manifest_texts"

    stamp_id: Mapped[int] = mapped_column(BigId, ForeignKey("stamps.id"), primary_key=True,
                                          autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    piece: Mapped[bytes] = mapped_column(LargeBinary)

    @classmethod
    def read(cls, conn: Connection, stamp_id: int, seq: int) -> bytes | None:
        """Piece ``seq`` of stamp ``stamp_id``'s text; None after the last (or with none)."""
        piece = conn.execute(select(cls.piece).where(
            cls.stamp_id == stamp_id, cls.seq == seq)).scalar_one_or_none()
        return None if piece is None else bytes(piece)


class TlogEntry(Base):
    """One entry of the transparency log (`formats.tlog.entry`): written, with its stamp's
    ``tlog_index`` (which leads from the stamp to its entry and back), in the transaction that
    sequences it, never changed. The tiles on disk are
    made from these rows (`server.tlog`)."""

    __tablename__ = "tlog_entries"

    idx: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    entry: Mapped[bytes] = mapped_column(LargeBinary)


class TlogCheckpoint(Base):
    """The newest signed checkpoint of the transparency log: one row (``id`` 1), replaced by
    the sequencer with each new one; every host publishes it once its tiles reach its size."""

    __tablename__ = "tlog_checkpoint"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    size: Mapped[int] = mapped_column(BigInteger)
    note: Mapped[str] = mapped_column(Text)
    signed_at: Mapped[int] = mapped_column(BigInteger)


class WitnessLog(Base):
    """What this witness (docs/witness.md) keeps of one log it cosigns for: the size and root
    hash of the newest checkpoint it cosigned, and that checkpoint as cosigned (the log's
    signature and ours; empty until the cosignature is made). The row is compare-and-set: a
    checkpoint replaces the one whose size it was checked against, never another."""

    __tablename__ = "witness_logs"

    origin: Mapped[str] = mapped_column(Text, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    root_hash: Mapped[bytes] = mapped_column(LargeBinary)
    note: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[int] = mapped_column(BigInteger)
