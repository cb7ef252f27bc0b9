"""The digest index of manifests on SQLite and PostgreSQL: a look-up reads a bounded row per
manifest however others poisoned its bucket; migration 0011 up and down with rows in it."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from formats.manifests import BUCKET_DIGESTS, buckets, key_prefix, pack
from server import db
from server.stamping import queries
from server.stamping.journal import Journal
from tests.helpers import migrated_sqlite

POISON = 5000  # digests per poisoning manifest, all starting with abcd (today's rows: 160 KB)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = migrated_sqlite(tmp_path / "i.sqlite3")
    else:
        url = request.getfixturevalue("pg_url")  # (migrated, and this test's own)
    eng = db.make_engine(url, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def sha(tag: str, i: int) -> str:
    return hashlib.sha256(f"{tag}{i}".encode()).hexdigest()


def journal_manifests(engine: Engine, manifests: list[list[str]]) -> list[int]:
    async def scenario() -> list[int]:
        journal = Journal(engine)
        journal.start()
        ids = [await journal.record_row(
            {"kind": "manifest", "commit": None, "tagname": None, "tree": None,
             "parent": None, "algorithm": "sha256", "digest": None,
             "stamped_at": 1700000000 + n, "key_id": None},
             buckets(pack(digests), len(digests[0]) // 2))
            for n, digests in enumerate(manifests)]
        await journal.stop()
        return ids

    ids = asyncio.run(scenario())
    with engine.begin() as conn:
        conn.execute(text("UPDATE stamps SET state = 'signed'"))
    return ids


def test_a_poisoned_bucket_costs_a_lookup_one_bounded_row_per_manifest(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    poisoned = [["abcd" + sha(f"p{m}-", i)[4:] for i in range(POISON)] for m in range(3)]
    clean = [sha("c", i) for i in range(POISON)]
    ids = journal_manifests(engine, [*poisoned, clean])

    searched: list[int] = []  # bytes of index rows the look-up searched
    real = queries.packed_contains

    def counting(packed: bytes, digest: str) -> bool:
        searched.append(len(packed))
        return real(packed, digest)

    monkeypatch.setattr(queries, "packed_contains", counting)
    for digest, covering in ((poisoned[1][1234], [ids[1]]), (clean[77], [ids[3]]),
                             ("abcd" + "0" * 60, [])):
        searched.clear()
        page = queries.digest_page(engine, "sha256", digest, 0, 100)
        assert [m.serial for m in page.manifests] == covering
        assert len(searched) <= 3  # (at most one row of each manifest that shares abcd)
        assert sum(searched) <= 3 * BUCKET_DIGESTS * 32


def rows(engine: Engine, key: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [(r[0], bytes(r[1]) if isinstance(r[1], (bytes, memoryview)) else r[1],
                 r[2], bytes(r[3]))
                for r in conn.execute(text(f"SELECT stamp_id, {key}, algorithm, digests "
                                           f"FROM manifest_digests ORDER BY 1, 2"))]


def test_migration_expands_buckets_and_merges_them_back(engine: Engine) -> None:
    poisoned = ["abcd" + sha("p", i)[4:] for i in range(2000)]
    clean = [sha("c", i) for i in range(2000)]
    sha512 = ["abcd" + hashlib.sha512(str(i).encode()).hexdigest()[4:] for i in range(600)]
    db.downgrade(engine, "0010")
    with engine.begin() as conn:
        for sid, (alg, digests) in enumerate((("sha256", poisoned + clean),
                                              ("sha512", sha512)), 1):
            conn.execute(text("INSERT INTO stamps (id, kind, algorithm, stamped_at, state, "
                              "attempts) VALUES (:id, 'manifest', :alg, 1, 'signed', 1)"),
                         {"id": sid, "alg": alg})
            # the rows revision 0008 wrote: one per 16-bit bucket
            grouped: dict[int, list[str]] = {}
            for d in digests:
                grouped.setdefault(int(d[:4], 16), []).append(d)
            conn.execute(text("INSERT INTO manifest_digests (stamp_id, bucket, algorithm, "
                              "digests) VALUES (:s, :b, :a, :d)"),
                         [{"s": sid, "b": b, "a": alg, "d": bytes.fromhex("".join(sorted(g)))}
                          for b, g in grouped.items()])
    before = rows(engine, "bucket")
    assert max(len(r[3]) for r in before) == 2000 * 32  # the poisoned bucket

    db.upgrade(engine)
    db.check(engine)
    expected = sorted([(1, key_prefix(k), "sha256", p)
                       for k, p in buckets(pack(poisoned + clean), 32)]
                      + [(2, key_prefix(k), "sha512", p) for k, p in buckets(pack(sha512), 64)])
    assert rows(engine, "prefix") == expected
    for alg, d, sid in (("sha256", poisoned[5], 1), ("sha256", clean[5], 1),
                        ("sha512", sha512[5], 2)):
        page = queries.digest_page(engine, alg, d, 0, 10)
        assert [m.serial for m in page.manifests] == [sid]

    db.downgrade(engine, "0010")
    assert rows(engine, "bucket") == before
    db.upgrade(engine)
    assert rows(engine, "prefix") == expected
