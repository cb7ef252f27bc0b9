"""SQLAlchemy models: the journal of stamps and the log commits that publish them."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments INTEGER PRIMARY KEY columns.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class StampState:
    PENDING = "pending"  # journaled, not (yet known to be) signed
    SIGNED = "signed"
    FAILED = "failed"  # every attempt failed; the client got a 503


class Stamp(Base):
    """One accepted timestamp request, committed before its signature is made."""

    __tablename__ = "stamps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # "tag" | "branch" | "digest"
    commit: Mapped[str | None] = mapped_column(String(64))  # git stamps
    algorithm: Mapped[str | None] = mapped_column(String(16))  # digest stamps: sha256 | sha512
    digest: Mapped[str | None] = mapped_column(String(128))  # digest stamps: lowercase hex
    tree: Mapped[str | None] = mapped_column(String(64))
    parent: Mapped[str | None] = mapped_column(String(64))
    tagname: Mapped[str | None] = mapped_column(String(100))
    stamped_at: Mapped[int] = mapped_column(BigInteger)  # Unix seconds: the stamp's time
    state: Mapped[str] = mapped_column(String(16), default=StampState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(64))
    object_id: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    receipt: Mapped[str | None] = mapped_column(Text)  # digest stamps: the signed receipt
    log_commit_id: Mapped[int | None] = mapped_column(ForeignKey("log_commits.id"), index=True)

    __table_args__ = (
        Index("ix_stamps_commit", "commit"),
        Index("ix_stamps_digest", "algorithm", "digest"),
    )


class LogCommitState:
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
