"""The transparency log's writer (`server.tlog.sequencer.Tlog`) in-process, with an injected
clock: stamps in a migrated SQLite file become entries in journal order, tiles on disk and
checkpoints signed by the real log key in a real ssh-agent (`workers.signer.NoteSigner`,
through `InProcessDispatcher`). Proofs are checked with `cryptography` (the signatures) and
pymerkle (the roots), which are not stampd's code; the tree survives restarts and lost tiles.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pymerkle import InmemoryTree
from sqlalchemy import Engine, insert, select, update

from formats.keys import TLOG_KEY, tlog_vkey
from formats.note import Ed25519Verifier, VerifierKey, open_note, parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof, verify_proof
from keystore.keyset import SshKeyStore, ensure_extra_keys, key_dir
from server import db
from server.gitlog.committer import OUTCOME_GRACE
from server.models import ManifestText, Stamp, StampState, TlogCheckpoint, TlogEntry
from server.stamping.journal import Journal
from server.tlog import sequencer as sequencer_module
from server.tlog.proofs import prove
from server.tlog.sequencer import LogKey, OriginMismatch, Tlog, TlogConfig
from server.tlog.store import TileReader
from tests.helpers import InProcessDispatcher, agent_home, migrated_sqlite
from workers.agents.ssh import SshAgent
from workers.signer import NoteSigner

T0 = 1_795_400_000
ORIGIN = "stampd.test/tlog"
FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
SSH_FPR = "SHA256:" + "B" * 43
REQUEST_TIMEOUT = 20


class Clock:
    def __init__(self) -> None:
        self.t = float(T0)

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = db.make_engine(migrated_sqlite(tmp_path / "stampd.sqlite3"))
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def log_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LogKey, NoteSigner]]:
    keys = tmp_path_factory.mktemp("keys")
    ensure_extra_keys(keys, [TLOG_KEY], "stampd test <t@stampd.invalid>", None)
    store = SshKeyStore(key_dir(keys, TLOG_KEY))
    with agent_home("ts") as home:
        agent = SshAgent(home)
        agent.start()
        try:
            signer = NoteSigner(agent.add_key(store.private_key_file), agent.connect())
            yield LogKey(tlog_vkey(ORIGIN, store.public_key_file.read_text())), signer
        finally:
            agent.stop()


def make_tlog(engine: Engine, root: Path, log_key: tuple[LogKey, NoteSigner], clock: Clock,
              sequencer: bool = True, shared: bool = True, journal: Journal | None = None
              ) -> Tlog:
    key, signer = log_key
    dispatcher = InProcessDispatcher(signer, key=TLOG_KEY.id)  # type: ignore[arg-type]
    config = TlogConfig(root, key, {None: FPR, "primary": FPR, "ssh-ed25519": SSH_FPR},
                        request_timeout=REQUEST_TIMEOUT, shared=shared, clock=clock)
    return Tlog(engine, dispatcher, config, lambda: True, lambda: sequencer,
                write_along=None if journal is None else journal.write_along)


def add(engine: Engine, *rows: dict[str, object]) -> list[int]:
    """Stamp rows; a ``text`` is a manifest's signed text, as the pieces it is stored in."""
    ids = []
    with engine.begin() as conn:
        for row in rows:
            values = {"stamped_at": T0, "state": StampState.SIGNED, **row}
            pieces = values.pop("text", [])
            ids.append(conn.execute(insert(Stamp).values(**values).returning(Stamp.id))
                       .scalar_one())
            for seq, piece in enumerate(pieces):  # type: ignore[call-overload]
                conn.execute(insert(ManifestText).values(stamp_id=ids[-1], seq=seq,
                                                         piece=piece))
    return ids


def digest_row(n: int, **kw: object) -> dict[str, object]:
    return {"kind": "digest", "algorithm": "sha256",
            "digest": hashlib.sha256(b"%d" % n).hexdigest(), **kw}


def checked_proof(reader: TileReader, index: int, key: LogKey) -> tuple[Entry, int]:
    """The proof of entry ``index``, verified by stampd's code and by code that is not ours:
    the checkpoint's Ed25519 signature with cryptography, the root with pymerkle."""
    proof = prove(reader, index)
    assert proof is not None
    parsed = TlogProof.parse(proof)
    assert parsed.extra is not None
    got = verify_proof(proof, parsed.extra, origin=ORIGIN,
                       log_keys=[Ed25519Verifier.from_vkey(key.vkey)])
    note = parse_note(parsed.checkpoint)
    (sig,) = note.signatures
    Ed25519PublicKey.from_public_bytes(key.verifier.public_key).verify(
        sig.signature, note.text.encode())
    cp = Checkpoint.parse(note.text)
    theirs = InmemoryTree(algorithm="sha256")
    for i in range(cp.size):
        theirs.append_entry(reader.entry(i, cp.size))
    assert theirs.get_root(cp.size) == cp.root
    return Entry.parse(parsed.extra), got.tree_size


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_stamps_become_entries_in_journal_order(engine: Engine, tmp_path: Path,
                                                log_key: tuple[LogKey, NoteSigner]) -> None:
    clock = Clock()
    ids = add(engine,
              digest_row(1),
              {"kind": "tag", "commit": "a" * 40, "object_id": "b" * 40},
              {"kind": "branch", "commit": "c" * 64, "object_id": "d" * 64,
               "key_id": "ssh-ed25519"},
              {"kind": "manifest", "algorithm": "sha256", "text": [b"signed ", b"manifest\n"]},
              {"kind": "tsa", "algorithm": "sha512", "digest": "e" * 128},
              digest_row(2, state=StampState.FAILED),
              digest_row(3, state=StampState.PENDING))
    tlog = make_tlog(engine, tmp_path / "tlog", log_key, clock)
    assert run(tlog.step()) == 5
    reader = TileReader(tmp_path / "tlog")
    entries = [checked_proof(reader, i, log_key[0]) for i in range(5)]
    assert [e.serial for e, _ in entries] == ids[:5]
    assert all(size == 5 for _, size in entries)
    tag, branch, manifest = entries[1][0], entries[2][0], entries[3][0]
    assert (tag.kind, tag.commit, tag.object_id, tag.key) == ("tag", "a" * 40, "b" * 40, FPR)
    assert branch.key == SSH_FPR and branch.object_id == "d" * 64
    assert manifest.signed == hashlib.sha256(b"signed manifest\n").hexdigest()
    assert entries[4][0].digest == "e" * 128
    with engine.connect() as conn:
        index = dict(conn.execute(select(Stamp.id, Stamp.tlog_index)).all())
        assert [index[i] for i in ids] == [0, 1, 2, 3, 4, None, None]
        assert conn.execute(select(TlogCheckpoint.size)).scalar_one() == 5
    # the pending stamp gets its entry once no live request can be behind it (no object),
    # and its row says it was published without an outcome; the others keep theirs
    clock.t += REQUEST_TIMEOUT + OUTCOME_GRACE + 2
    assert run(tlog.step()) == 6
    entry, size = checked_proof(reader, 5, log_key[0])
    assert entry.serial == ids[6] and size == 6
    with engine.connect() as conn:
        state = dict(conn.execute(select(Stamp.id, Stamp.state)).all())
    assert [state[i] for i in ids] == [StampState.SIGNED] * 5 + [StampState.FAILED,
                                                                 StampState.ORPHANED]


@pytest.mark.parametrize("rows", [1, sequencer_module.WRITE_ROWS])
@pytest.mark.parametrize("along", [False, True], ids=["apart", "journal"])
def test_a_stamp_that_changed_since_it_was_read_is_read_again(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner], along: bool,
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite the entries are made from stamps read before the transaction that writes
    them (one of its own, or the journal's group commits, ``rows`` stamps a commit): a stamp
    whose outcome was journalled in between, here a pending one that failed after all, gets
    no entry made from what was read; the stamps from it on are read again inside a writing
    transaction (those before it, in commits of their own, are kept)."""
    monkeypatch.setattr(sequencer_module, "WRITE_ROWS", rows)
    clock = Clock()
    clock.t += REQUEST_TIMEOUT + OUTCOME_GRACE + 2  # (the pending stamp is taken for orphaned)
    ids = add(engine, digest_row(1), digest_row(2, state=StampState.PENDING), digest_row(3))

    async def steps() -> list[int | None]:
        journal = Journal(engine) if along else None
        if journal is not None:
            journal.start()
        tlog = make_tlog(engine, tmp_path / "tlog", log_key, clock, journal=journal)
        read = tlog._read_apart

        def then_failed() -> Any:
            batch = read()
            with engine.begin() as conn:
                conn.execute(update(Stamp).where(Stamp.id == ids[1])
                             .values(state=StampState.FAILED))
            return batch

        tlog._read_apart = then_failed  # type: ignore[method-assign]
        sizes = [await tlog.step()]
        tlog._read_apart = read  # type: ignore[method-assign]
        ids.extend(add(engine, digest_row(4)))
        sizes.append(await tlog.step())  # (nothing changed: written as read)
        if journal is not None:
            await journal.stop()
        return sizes

    assert asyncio.run(steps()) == [2, 3]
    with engine.connect() as conn:
        rows = {r.id: (r.state, r.tlog_index)
                for r in conn.execute(select(Stamp.id, Stamp.state, Stamp.tlog_index))}
    assert [rows[i] for i in ids] == [(StampState.SIGNED, 0), (StampState.FAILED, None),
                                      (StampState.SIGNED, 1), (StampState.SIGNED, 2)]
    reader = TileReader(tmp_path / "tlog")
    assert [checked_proof(reader, i, log_key[0])[0].serial for i in range(3)] == [
        ids[0], ids[2], ids[3]]


def test_a_checkpoint_for_the_empty_log_and_none_while_idle(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner]) -> None:
    tlog = make_tlog(engine, tmp_path / "tlog", log_key, Clock())
    assert run(tlog.step()) == 0
    note = (tmp_path / "tlog" / "checkpoint").read_bytes()
    opened = open_note(note, [Ed25519Verifier.from_vkey(log_key[0].vkey)])
    assert Checkpoint.parse(opened.text).size == 0
    # (the service's own job: an overloaded queue neither refuses it nor keeps it waiting)
    assert isinstance(tlog.dispatcher, InProcessDispatcher)
    assert tlog.dispatcher.internal == [True]
    assert run(tlog.step()) == 0
    assert (tmp_path / "tlog" / "checkpoint").read_bytes() == note  # not signed again


class _NoCheckpointSigned(InProcessDispatcher):
    """A dispatcher that cannot sign the checkpoint: no worker holds the log key, or the
    job waits past the sequencer's timeout."""

    def __init__(self, hang: bool) -> None:
        super().__init__(None, key="no such key")  # type: ignore[arg-type]
        self.hang, self.calls = hang, 0

    async def sign(self, *a: Any, **k: Any) -> Any:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        return await super().sign(*a, **k)


@pytest.mark.parametrize("hang", [False, True], ids=["no worker", "none in time"])
def test_a_checkpoint_no_worker_signs_is_one_warning_and_tried_again(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner], hang: bool,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Expected while the workers restart or the queue is long: a line, not a traceback, and
    not repeated while the failure stays the same; nothing is published meanwhile."""
    monkeypatch.setattr(sequencer_module, "SIGN_TIMEOUT", 0.01)
    tlog = make_tlog(engine, tmp_path / "tlog", log_key, Clock())
    tlog.dispatcher = dispatcher = _NoCheckpointSigned(hang)
    tlog.config = dataclasses.replace(tlog.config, interval=0.01)

    async def scenario() -> None:
        tlog.start()
        try:
            async with asyncio.timeout(20):
                while dispatcher.calls < 3:
                    await asyncio.sleep(0.01)
        finally:
            await tlog.stop()

    with caplog.at_level("WARNING", logger="server.tlog.sequencer"):
        run(scenario())
    assert tlog.last_error is not None
    assert tlog.last_error.startswith("NotSigned: ")
    records = [r for r in caplog.records if r.name == "server.tlog.sequencer"]
    assert len(records) == 1 and records[0].levelname == "WARNING"
    assert records[0].exc_info is None
    assert records[0].getMessage() == (
        "transparency log: no worker signed the checkpoint of size 0 within 0.01 s; retrying"
        if hang else "transparency log: could not sign the checkpoint of size 0: no worker "
        "holds key tlog-ed25519; retrying")
    assert not (tmp_path / "tlog" / "checkpoint").exists()


def test_restart_and_lost_tiles_continue_the_same_tree(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner]) -> None:
    clock = Clock()
    root = tmp_path / "tlog"
    add(engine, *(digest_row(n) for n in range(300)))
    run(make_tlog(engine, root, log_key, clock).step())
    first = Checkpoint.parse(parse_note((root / "checkpoint").read_bytes()).text)
    add(engine, *(digest_row(n) for n in range(300, 310)))
    again = make_tlog(engine, root, log_key, clock)  # a restart
    assert run(again.step()) == 310
    # the tiles lost (a wiped disk): rebuilt from the database, the same tree
    for f in sorted(root.rglob("*"), reverse=True):
        if f.is_file() and f.name != "checkpoint":
            f.unlink()
    add(engine, digest_row(999))
    rebuilt = make_tlog(engine, root, log_key, clock)
    assert run(rebuilt.step()) == 311
    reader = TileReader(root)
    _entry, size = checked_proof(reader, 310, log_key[0])
    assert size == 311
    theirs = InmemoryTree(algorithm="sha256")
    with engine.connect() as conn:
        for (e,) in conn.execute(select(TlogEntry.entry).order_by(TlogEntry.idx)):
            theirs.append_entry(bytes(e))
    assert theirs.get_root(first.size) == first.root  # extends what was published first


def test_a_sequencer_that_another_took_over_from_catches_up(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner]) -> None:
    """A sequencer whose step went well skips the catch-up in the next one; had another
    sequenced meanwhile (the sequencing lock moved among hosts and back), that step fails
    without writing anything, and the one after catches up and goes on with the same tree."""
    clock = Clock()
    add(engine, digest_row(1))
    a = make_tlog(engine, tmp_path / "a", log_key, clock)
    b = make_tlog(engine, tmp_path / "b", log_key, clock)
    assert run(a.step()) == 1
    add(engine, digest_row(2))
    assert run(b.step()) == 2
    add(engine, digest_row(3))
    with pytest.raises(RuntimeError, match="the log has 2 entries, the tiles 1"):
        run(a.step())
    assert run(a.step()) == 3
    for root in ("a", "b"):
        assert [checked_proof(TileReader(tmp_path / root), i, log_key[0])[0].serial
                for i in range(2)] == [1, 2]
    assert checked_proof(TileReader(tmp_path / "a"), 2, log_key[0])[1] == 3


def test_another_host_publishes_the_checkpoint_once_its_tiles_reach_it(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner]) -> None:
    clock = Clock()
    add(engine, *(digest_row(n) for n in range(40)))
    leader = make_tlog(engine, tmp_path / "a", log_key, clock)
    follower = make_tlog(engine, tmp_path / "b", log_key, clock, sequencer=False)
    told: dict[str, list[int]] = {"a": [], "b": []}  # (each host's proof waiters are told)
    leader.on_published, follower.on_published = told["a"].append, told["b"].append
    assert run(follower.step()) is None  # nothing sequenced, nothing to publish
    assert run(leader.step()) == 40
    assert run(follower.step()) == 40
    assert told == {"a": [40], "b": [40]}
    add(engine, digest_row(40))
    assert run(leader.step()) == 41 and run(follower.step()) == 41
    assert run(leader.step()) == 41 and run(follower.step()) == 41  # (no news: nothing new)
    assert told == {"a": [40, 41], "b": [40, 41]}
    assert (tmp_path / "a/checkpoint").read_bytes() == (tmp_path / "b/checkpoint").read_bytes()
    checked_proof(TileReader(tmp_path / "b"), 39, log_key[0])


def test_a_host_of_another_origin_neither_sequences_nor_publishes(
        engine: Engine, tmp_path: Path, log_key: tuple[LogKey, NoteSigner]) -> None:
    clock = Clock()
    add(engine, digest_row(1))
    assert run(make_tlog(engine, tmp_path / "a", log_key, clock).step()) == 1
    key, signer = log_key
    other = VerifierKey("elsewhere.test/tlog", key.verifier.sig_type, key.verifier.public_key)
    for sequencer in (True, False):
        tlog = make_tlog(engine, tmp_path / f"b{sequencer}", (LogKey(other.encode()), signer),
                         clock, sequencer=sequencer)
        add(engine, digest_row(2))
        with pytest.raises(OriginMismatch, match="STAMPD_TLOG_ORIGIN"):
            run(tlog.step())
        assert not (tmp_path / f"b{sequencer}" / "checkpoint").exists()
    with engine.connect() as conn:
        assert conn.execute(select(TlogEntry.idx)).scalars().all() == [0]


def test_one_host_keeps_its_origin(engine: Engine, tmp_path: Path,
                                   log_key: tuple[LogKey, NoteSigner]) -> None:
    """One host (no checkpoint in the database): a restart with another origin over the same
    tiles neither sequences nor publishes."""
    clock = Clock()
    add(engine, digest_row(1))
    assert run(make_tlog(engine, tmp_path / "a", log_key, clock, shared=False).step()) == 1
    with engine.connect() as conn:
        assert conn.execute(select(TlogCheckpoint.size)).first() is None  # (the file only)
    key, signer = log_key
    other = VerifierKey("elsewhere.test/tlog", key.verifier.sig_type, key.verifier.public_key)
    add(engine, digest_row(2))
    before = (tmp_path / "a" / "checkpoint").read_bytes()
    with pytest.raises(OriginMismatch, match="one origin"):
        run(make_tlog(engine, tmp_path / "a", (LogKey(other.encode()), signer), clock,
                      shared=False).step())
    assert (tmp_path / "a" / "checkpoint").read_bytes() == before
