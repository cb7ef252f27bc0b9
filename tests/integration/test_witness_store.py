"""The witness's store step (`server.witness.service`) on real databases: the compare-and-set of
a log's row on SQLite and on PostgreSQL, concurrent requests that never roll the row back, and
kill -9 at random points of ``add-checkpoint``: the row is always the old or the new
checkpoint, whole, and no cosignature was ever returned for a tree that is not stored.

The cosignatures of these tests are made by `LocalCosigner` (``cryptography``, in the test's
process) in place of a worker: what is under test is the order store-then-cosign and the
database's atomicity; the worker's own cosigning is tested with a real server
(tests/system/test_witness.py)."""

from __future__ import annotations

import asyncio
import base64
import os
import random
import select
import signal
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from formats.jobs import CosignJob, Job
from formats.note import (
    ED25519_COSIGNATURE,
    Ed25519Verifier,
    Note,
    Signature,
    VerifierKey,
    open_note,
    parse_note,
)
from formats.tlog.checkpoint import CosignatureVerifier, cosignature_message
from formats.tlog.witness import AddCheckpoint, SizeConflict
from server import db
from server.dispatch import Signed
from server.errors import SigningFailed
from server.witness.service import REPLAY_REUSE, CosignUnavailable, Witness, read_record
from tests.helpers import WitnessedLog, migrated_sqlite

LOG = WitnessedLog("example.org/stored", leaves=4096, seed=bytes(range(32)))
NAME = "witness.example/store"


class LocalCosigner:
    """A dispatcher whose one "worker" signs `CosignJob`s with a key in this process."""

    requeued = 0

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
        self.public = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    async def sign(self, job: Job, key: str = "") -> Signed:
        assert isinstance(job, CosignJob)
        signature = self.key.sign(cosignature_message(job.body, job.timestamp))
        return Signed(base64.b64encode(signature).decode("ascii"), "local")


def witness(url: str) -> Witness:
    cosigner = LocalCosigner()
    return Witness(db.make_engine(url), cosigner,  # type: ignore[arg-type]
                   {LOG.origin: [Ed25519Verifier.from_vkey(LOG.vkey)]}, NAME, cosigner.public,
                   clock=lambda: 1_800_000_000)


def sqlite_url(tmp_path: Path) -> str:
    return migrated_sqlite(tmp_path / "witness.db")


def compare_and_set(url: str) -> None:
    w = witness(url)
    try:
        w.store(AddCheckpoint.parse(LOG.request(0, 10)))
        assert read_record(w.engine, LOG.origin).size == 10  # type: ignore[union-attr]
        # two requests from 10 that both passed their check: the second one's set fails
        a, b = AddCheckpoint.parse(LOG.request(10, 20)), AddCheckpoint.parse(LOG.request(10, 30))
        w.store(b)
        with pytest.raises(SizeConflict) as e:
            w.store(a)
        assert e.value.known == 30
        stored = read_record(w.engine, LOG.origin)
        assert stored is not None and (stored.size, stored.root) == (30, LOG.root(30))
        # a second first request (old 0) of a log already stored: 409, not an insert
        with pytest.raises(SizeConflict):
            w.store(AddCheckpoint.parse(LOG.request(0, 40)))
        concurrent_never_roll_back(w)
    finally:
        w.engine.dispose()


def race(w: Witness, old: int, targets: list[int]) -> list[int]:
    """Threads each sending old -> one of ``targets`` at once: the size each stored, or -1
    for each refused with 409."""
    results = [0] * len(targets)
    barrier = threading.Barrier(len(targets))

    def send(i: int, new: int) -> None:
        request = AddCheckpoint.parse(LOG.request(old, new))
        barrier.wait()
        try:
            results[i] = w.store(request).size
        except SizeConflict as e:
            assert e.known >= old
            results[i] = -1

    threads = [threading.Thread(target=send, args=(i, n)) for i, n in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def concurrent_never_roll_back(w: Witness) -> None:
    """Rounds of 8 threads sending from the size stored to N + K, each K another: one wins
    each round, the others get 409; the stored size only grows."""
    rng = random.Random(7)
    sizes: list[int] = []
    losses = 0
    for _ in range(15):
        old = read_record(w.engine, LOG.origin).size  # type: ignore[union-attr]
        targets = [old + rng.randint(0, 40) for _ in range(8)]
        results = race(w, old, targets)
        won = [r for r in results if r >= 0]
        losses += results.count(-1)
        assert len(won) >= 1
        stored = read_record(w.engine, LOG.origin)
        assert stored is not None and stored.size in won and stored.root == LOG.root(stored.size)
        assert stored.size >= old
        sizes.append(stored.size)
    assert sizes == sorted(sizes)
    assert losses > 0  # (the races did happen)


def test_compare_and_set_sqlite(tmp_path: Path) -> None:
    compare_and_set(sqlite_url(tmp_path))


def test_compare_and_set_postgresql(pg_url: str) -> None:
    compare_and_set(pg_url)


def _child(url: str, fd: int) -> None:
    """In a forked child: add checkpoints from the stored size on, telling the parent each
    size cosigned (only once the cosignature was returned), until killed."""
    w = witness(url)
    rng = random.Random(os.getpid())
    os.write(fd, b"ready\n")
    while True:
        stored = read_record(w.engine, LOG.origin)
        old = 0 if stored is None else stored.size
        new = min(old + rng.randint(1, 3), len(LOG.hashes))
        if new == old:
            os._exit(0)
        line = asyncio.run(w.add_checkpoint(LOG.request(old, new)))
        assert line.startswith(f"\u2014 {NAME} ".encode())
        os.write(fd, b"%d\n" % new)


def test_kill_9_in_add_checkpoint(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    rng = random.Random(24)
    cosigned: list[int] = []
    previous = 0
    engine = db.make_engine(url)
    try:
        for i in range(100):
            engine.dispose()  # (no connection crosses the fork)
            r, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the child)
                os.close(r)
                try:
                    _child(url, wfd)
                finally:
                    os._exit(1)
            os.close(wfd)
            early = b""
            try:
                # the kill falls in add-checkpoint, not in the child's start-up (which, on a
                # loaded machine, could take the whole window)
                assert os.read(r, 6) == b"ready\n"
                if i % 4 == 0:
                    # every 4th child is killed once it has had a cosignature made (bounded
                    # wait), so that some requests get through however loaded the machine is
                    ready, _, _ = select.select([r], [], [], 10.0)
                    early = os.read(r, 4096) if ready else b""
                time.sleep(rng.uniform(0.0, 0.03))
            finally:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            with os.fdopen(r, "rb") as pipe:
                cosigned += [int(x) for x in (early + pipe.read()).split()]
            stored = read_record(engine, LOG.origin)
            if stored is None:
                assert previous == 0 and not cosigned
                continue
            # whole: the size, its root and the log's checkpoint of it, together
            assert stored.root == LOG.root(stored.size)
            assert stored.note.encode().startswith(LOG.checkpoint(stored.size))
            # never back, and no cosignature of a tree the store lacks
            assert stored.size >= previous
            assert all(size <= stored.size for size in cosigned)
            previous = stored.size
    finally:
        engine.dispose()
    assert previous > 0 and cosigned  # (the kills did let some requests through)


class NoWorker(LocalCosigner):
    """A dispatcher with no worker of the witness key: every job fails."""

    async def sign(self, job: Job, key: str = "") -> Signed:
        raise SigningFailed("no worker holds the witness key")


def test_a_failed_cosignature_keeps_the_stored_row(tmp_path: Path) -> None:
    """503 (`CosignUnavailable`) when the worker is down; the checkpoint stays stored, the
    log's retry is answered 409 with the new size, and from it, once a worker is back, the
    checkpoint is cosigned."""
    w = witness(sqlite_url(tmp_path))
    try:
        w.dispatcher = NoWorker()  # type: ignore[assignment]
        with pytest.raises(CosignUnavailable) as e:
            asyncio.run(w.add_checkpoint(LOG.request(0, 12)))
        assert e.value.retry_after > 0
        stored = read_record(w.engine, LOG.origin)
        assert stored is not None and stored.size == 12
        assert stored.note.encode() == LOG.checkpoint(12)  # the log's, not cosigned
        with pytest.raises(SizeConflict) as conflict:
            asyncio.run(w.add_checkpoint(LOG.request(0, 12)))
        assert conflict.value.known == 12
        w.dispatcher = LocalCosigner()  # type: ignore[assignment]
        line = asyncio.run(w.add_checkpoint(LOG.request(12, 12)))
        assert line.startswith(f"\u2014 {NAME} ".encode())
    finally:
        w.engine.dispose()


def poisoned(note: bytes, *lines: Signature) -> bytes:
    """``note`` with more signature lines after the log's."""
    parsed = parse_note(note)
    return Note(parsed.text, (*parsed.signatures, *lines)).encode()


def test_only_what_was_verified_or_signed_is_stored_and_served(tmp_path: Path) -> None:
    """A checkpoint sent with more signature lines than the log's (a line under the witness's
    own name and key ID that does not verify, a line of a key it does not know) is cosigned,
    but stored and served as the log's signature and the witness's own cosignature only: the
    view opens with the log key and the witness key (what `stampd audit` does)."""
    w = witness(sqlite_url(tmp_path))
    key = VerifierKey(NAME, ED25519_COSIGNATURE, w.public_key)
    verifiers = [Ed25519Verifier.from_vkey(LOG.vkey), CosignatureVerifier(key)]
    bogus = Signature(NAME, key.key_id, bytes(72))
    stranger = Signature("stranger.example/w", 0x01020304, bytes(72))

    async def run() -> None:
        for old, new in ((0, 7), (7, 9)):
            checkpoint = poisoned(LOG.checkpoint(new), bogus, stranger)
            line = await w.add_checkpoint(LOG.request(old, new, checkpoint=checkpoint))
            # (the cosigned note is written just after the answer)
            note = await cosigned_note(w, line)
            assert note == LOG.checkpoint(new) + line
            opened = open_note(note, verifiers)
            assert not opened.unverified and len(opened.verified) == 2

    try:
        asyncio.run(run())
    finally:
        w.engine.dispose()


async def cosigned_note(w: Witness, line: bytes) -> bytes:
    """The note stored for `LOG` once it ends in the cosignature ``line`` (bounded wait)."""
    for _ in range(500):
        stored = read_record(w.engine, LOG.origin)
        if stored is not None and stored.note.encode().endswith(line):
            return stored.note.encode()
        await asyncio.sleep(0.02)
    raise AssertionError("the cosigned note was not stored")


class CountingCosigner(LocalCosigner):
    """`LocalCosigner`, counting the cosignatures it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.signed = 0

    async def sign(self, job: Job, key: str = "") -> Signed:
        self.signed += 1
        return await super().sign(job, key)


def test_a_replay_of_what_was_cosigned_is_answered_from_the_store(tmp_path: Path) -> None:
    """The checkpoint last cosigned, sent again (anyone can: it is public), is answered with
    the cosignature stored, neither signed nor written again, while that cosignature is at
    most `REPLAY_REUSE` seconds old by the witness's clock; later it is cosigned afresh (a
    log's window for a cosignature's time is around its own clock)."""
    url = sqlite_url(tmp_path)
    now = [1_800_000_000]
    cosigner = CountingCosigner()
    w = Witness(db.make_engine(url), cosigner,  # type: ignore[arg-type]
                {LOG.origin: [Ed25519Verifier.from_vkey(LOG.vkey)]}, NAME, cosigner.public,
                clock=lambda: now[0])

    async def run() -> None:
        first = await w.add_checkpoint(LOG.request(0, 7))
        await cosigned_note(w, first)
        row = read_record(w.engine, LOG.origin)
        now[0] += 1  # (a cosignature made now would differ)
        replays = await asyncio.gather(*(w.add_checkpoint(LOG.request(7, 7))
                                         for _ in range(20)))
        assert set(replays) == {first}
        now[0] += REPLAY_REUSE - 1  # (the stored one is REPLAY_REUSE s old: still answered)
        assert await w.add_checkpoint(LOG.request(7, 7)) == first
        assert cosigner.signed == 1 and read_record(w.engine, LOG.origin) == row
        now[0] += 1
        again = await w.add_checkpoint(LOG.request(7, 7))
        assert again != first and cosigner.signed == 2
        assert await cosigned_note(w, again) == LOG.checkpoint(7) + again

    try:
        asyncio.run(run())
    finally:
        w.engine.dispose()


def test_a_client_over_its_minute_is_answered_429_and_changes_nothing(tmp_path: Path) -> None:
    """``POST /add-checkpoint`` (server.api.witness, in this process) counts each client's
    requests a minute (STAMPD_WITNESS_REQUESTS_PER_CLIENT_MINUTE, here 3): beyond them 429,
    with Retry-After the rest of the minute, before the body is read; another client has a
    budget of its own, and the next minute the first one is answered again."""
    from types import SimpleNamespace

    import httpx
    from fastapi import FastAPI

    from server.api.deps import services
    from server.api.witness import add_witness_routes
    from server.budgets import HostBudgets, LocalBudgets
    from server.settings import Settings

    now = [1_800_000_030.0]  # (30 s into a minute)
    w = witness(sqlite_url(tmp_path))
    settings = Settings(data_dir=tmp_path / "data", witness_requests_per_client_minute=3)
    app = FastAPI()
    add_witness_routes(app)
    host = LocalBudgets(HostBudgets(settings, lambda: now[0]))
    app.dependency_overrides[services] = lambda: SimpleNamespace(
        witness=w, settings=settings, clock=lambda: now[0], engine=w.engine, budgets=host)

    def client(address: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 1)),
                                 base_url="http://witness.test")

    async def run() -> None:
        async with client("192.0.2.1") as a, client("192.0.2.2") as b:
            for old, new in ((0, 5), (5, 5), (5, 6)):
                r = await a.post("/add-checkpoint", content=LOG.request(old, new))
                assert r.status_code == 200, r.text
            r = await a.post("/add-checkpoint", content=LOG.request(6, 9))
            assert r.status_code == 429 and r.headers["retry-after"] == "30"
            assert "3 of its 3 add-checkpoint requests this minute" in r.text
            assert read_record(w.engine, LOG.origin).size == 6  # type: ignore[union-attr]
            assert (await b.post("/add-checkpoint", content=LOG.request(6, 9))).status_code == 200
            now[0] += 30
            assert (await a.post("/add-checkpoint", content=LOG.request(9, 10))).status_code == 200

    try:
        asyncio.run(run())
    finally:
        w.engine.dispose()
