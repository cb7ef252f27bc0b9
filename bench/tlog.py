"""The transparency log's own benchmark (`python -m bench.tlog`, part of `make bench`).

1. **Sequencing and tile writing in one process**: N signed stamps in a fresh SQLite journal
   are sequenced by the server's own code (`server.tlog.sequencer.Tlog`: the transaction that
   writes the entries and each stamp's index, then the tiles, each file fsynced), timed.
2. **A log of 10,000,000 entries**: a data directory is made with that many sequenced stamps
   (written in bulk: the stamps' rows, the entries, the tiles, a checkpoint signed with the
   server's own log key), then `stampd serve` runs on it: the latency of `GET /tlog/checkpoint`
   and of `GET /v1/proofs/<serial>` for random serials over HTTP (one keep-alive connection,
   one request at a time), one new stamp's proof (the server took up the big tree), and the
   disk per entry (tiles and entry bundles; the entries' table in the database).

The bulk rows have digests in serial order (their digest index then fills in order: a
realistic 10^7-row random index would only make the set-up slower, not the proofs).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import json
import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from bench.procs import BIN, free_port, progress
from formats.keys import TLOG_KEY, ed25519_public_key
from formats.note import Ed25519Verifier, ed25519_signer, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof, verify_proof
from keystore.keyset import key_dir
from server import db
from server.tlog.sequencer import LogKey, Tlog, TlogConfig
from server.tlog.store import TileWriter

FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
T0 = 1_790_000_000


def _stamp_rows(n: int, first_id: int = 1):  # type: ignore[no-untyped-def]
    for i in range(first_id, first_id + n):
        yield (i, "digest", "sha256", f"{i:064x}", T0 + i // 1000, "signed", 1)


def _insert_stamps(path: Path, n: int, indexed: bool) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    cols = "id, kind, algorithm, digest, stamped_at, state, attempts"
    with conn:
        if indexed:  # (sequenced already: index i-1)
            conn.executemany(f"INSERT INTO stamps ({cols}, tlog_index) VALUES (?,?,?,?,?,?,?,?)",
                             ((*r, r[0] - 1) for r in _stamp_rows(n)))
        else:
            conn.executemany(f"INSERT INTO stamps ({cols}) VALUES (?,?,?,?,?,?,?)",
                             _stamp_rows(n))
    conn.close()


class _NoSigner:  # (the sequencing benchmark signs no checkpoint)
    async def sign(self, *_a: object, **_k: object) -> object:
        raise AssertionError("not signing here")


def sequencing(n: int) -> dict[str, float]:
    """Entries per second: sequencing (database) and tiles, in one process."""
    with tempfile.TemporaryDirectory(prefix="bench-tlog-") as tmp:
        path = Path(tmp) / "stampd.sqlite3"
        engine = db.make_engine(f"sqlite:///{path}")
        db.upgrade(engine)
        _insert_stamps(path, n, indexed=False)
        key = LogKey(f"bench.test/tlog+{0:08x}+" + "A" * 44)  # (never used: no checkpoint)
        config = TlogConfig(Path(tmp) / "tlog", key, {None: FPR})
        tlog = Tlog(engine, _NoSigner(), config, lambda: True, lambda: True)  # type: ignore
        tlog._open()
        t = time.perf_counter()

        async def drain() -> None:  # (`Tlog._sequence` is a coroutine: it was awaited nowhere)
            while await tlog._sequence():
                pass

        asyncio.run(drain())
        total = time.perf_counter() - t
        assert tlog.writer.size == n
        engine.dispose()
    return {"entries": n, "seconds": total, "per_second": n / total}


def _entry(i: int) -> bytes:
    """The entry of bulk stamp ``i`` (serial i + 1), as `Entry.encode` writes it."""
    s = i + 1
    return (f"stampd-tlog-entry/v1\nserial {s}\nkind digest\ntime {T0 + s // 1000}\n"
            f"key {FPR}\ndigest sha256 {s:064x}\n").encode()


def build_big(data: Path, n: int, primary_fpr: str) -> None:
    """Bulk-write ``n`` sequenced stamps into a data directory the server initialised."""
    global FPR
    FPR = primary_fpr
    assert Entry.parse(_entry(41)).serial == 42  # the bulk entries are canonical
    db_path = data / "stampd.sqlite3"
    t = time.perf_counter()
    _insert_stamps(db_path, n, indexed=True)
    conn = sqlite3.connect(db_path)
    with conn:
        conn.executemany("INSERT INTO tlog_entries (idx, entry) VALUES (?,?)",
                         ((i, _entry(i)) for i in range(n)))
    progress(f"  rows: {time.perf_counter() - t:.0f} s")
    t = time.perf_counter()
    writer = TileWriter(data / "tlog", sync=False)
    step = 1 << 16
    for first in range(0, n, step):
        writer.append(first, [_entry(i) for i in range(first, min(n, first + step))])
    os.sync()
    progress(f"  tiles: {time.perf_counter() - t:.0f} s")
    private = load_ssh_private_key(
        (key_dir(data / "keys", TLOG_KEY) / "id").read_bytes(), None)
    public_line = (key_dir(data / "keys", TLOG_KEY) / "id.pub").read_text()
    return_origin = _origin(data)
    text = Checkpoint(return_origin, n, writer.root_hash()).body()
    signer = ed25519_signer(return_origin, ed25519_public_key(public_line),
                            private.sign)  # type: ignore[union-attr]
    note = sign_note(text, [signer]).encode()
    writer.publish(note)
    with conn:
        conn.execute("DELETE FROM tlog_checkpoint")
        conn.execute("INSERT INTO tlog_checkpoint (id, size, note, signed_at) VALUES (1,?,?,?)",
                     (n, note.decode(), int(time.time())))
    conn.close()


def _origin(data: Path) -> str:
    return (data / "origin").read_text().strip()


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes, float]:
    t = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    return r.status, body, time.perf_counter() - t


def _ms(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"p50 {q[49] * 1000:.2f} ms, p99 {q[98] * 1000:.2f} ms, max {max(samples) * 1000:.2f} ms"


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def big_log(n: int, requests: int, keep: bool) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="bench-tlog-big-"))
    data = work / "data"
    port = free_port()
    origin = f"127.0.0.1:{port}/tlog"
    env = {**os.environ, "STAMPD_TLOG": "on", "STAMPD_TSA": "false",
           "STAMPD_LOG_LEVEL": "WARNING", "STAMPD_RUNTIME_DIR": str(work / "rt"),
           "STAMPD_TLOG_ORIGIN": origin}
    (work / "rt").mkdir(mode=0o700)
    argv = [str(BIN / "stampd"), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--data-dir", str(data), "--workers", "1", "--commit-interval", "3600"]
    import subprocess

    def serve() -> subprocess.Popen[bytes]:
        log = open(work / "server.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    return proc
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"stampd exited: {(work / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        raise RuntimeError("stampd did not become ready")

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()

    try:
        progress(f"bench.tlog: a log of {n:,} entries")
        proc = serve()  # first start: keys, journal
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        keys = json.loads(_get(c, "/v1/keys")[1])["keys"]
        c.close()
        stop(proc)
        (data / "origin").write_text(origin)
        db_before = (data / "stampd.sqlite3").stat().st_size
        build_big(data, n, keys[0]["fingerprint"])
        proc = serve()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            vkey = _get(c, "/tlog/vkey")[1].decode().strip()
            cp_times, proof_times = [], []
            rng = random.Random(7)
            for _ in range(requests):
                status, _, dt = _get(c, "/tlog/checkpoint")
                assert status == 200
                cp_times.append(dt)
            for _ in range(requests):
                serial = rng.randrange(1, n + 1)
                status, body, dt = _get(c, f"/v1/proofs/{serial}")
                assert status == 200, body[:200]
                proof_times.append(dt)
            parsed = TlogProof.parse(body)
            assert parsed.extra is not None
            verify_proof(body, parsed.extra, origin=origin,
                         log_keys=[Ed25519Verifier.from_vkey(vkey)])
            # a new stamp extends the big tree
            digest = hashlib.sha256(b"after the bulk").hexdigest()
            c.request("POST", "/v1/stamps", body=f"sha256={digest}",
                      headers={"Content-Type": "application/x-www-form-urlencoded",
                               "Accept": "application/json"})
            r = c.getresponse()
            serial = json.loads(r.read())["serial"]
            status, body, dt = _get(c, f"/v1/proofs/{serial}?wait=30")
            assert status == 200, body[:300]
            index, size = verify_proof(body, TlogProof.parse(body).extra or b"", origin=origin,
                                       log_keys=[Ed25519Verifier.from_vkey(vkey)])
            assert index == n and size == n + 1
            c.close()
        finally:
            stop(proc)
        conn = sqlite3.connect(data / "stampd.sqlite3")
        try:
            entries_db = conn.execute(
                "SELECT SUM(pgsize) FROM dbstat WHERE name = 'tlog_entries'").fetchone()[0]
        except sqlite3.OperationalError:
            entries_db = None
        conn.close()
        tiles = _du(data / "tlog" / "tile") - _du(data / "tlog" / "tile" / "entries")
        bundles = _du(data / "tlog" / "tile" / "entries")
        return {
            "entries": n,
            "checkpoint": _ms(cp_times),
            "proof": _ms(proof_times),
            "tile_bytes_per_entry": tiles / n,
            "bundle_bytes_per_entry": bundles / n,
            "db_entry_bytes_per_entry": None if entries_db is None else entries_db / n,
            "db_growth_bytes_per_entry": ((data / "stampd.sqlite3").stat().st_size
                                          - db_before) / n,
        }
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tlog", description=__doc__.split("\n")[0])
    p.add_argument("--sequence", type=int, default=200_000, help="stamps to sequence (1.)")
    p.add_argument("--entries", type=int, default=10_000_000, help="entries of the big log (2.)")
    p.add_argument("--requests", type=int, default=1000, help="GETs of each kind (2.)")
    p.add_argument("--keep", action="store_true", help="keep the big log's directory")
    args = p.parse_args()
    seq = sequencing(args.sequence)
    print(f"sequencing + tiles, one process: {seq['entries']:,} entries in "
          f"{seq['seconds']:.2f} s = {seq['per_second']:,.0f} entries/s "
          f"(target >= 50,000/s: {seq['per_second'] / 50_000:.2f}x)")
    if args.entries:
        big = big_log(args.entries, args.requests, args.keep)
        print(f"log of {big['entries']:,} entries over HTTP, {args.requests} requests each:")
        print(f"  GET /tlog/checkpoint    {big['checkpoint']}")
        print(f"  GET /v1/proofs/<serial> {big['proof']}  (target p99 <= 5 ms)")
        print(f"  disk per entry: tiles {big['tile_bytes_per_entry']:.1f} B, entry bundles "
              f"{big['bundle_bytes_per_entry']:.1f} B, database: tlog_entries "
              f"{big['db_entry_bytes_per_entry'] or float('nan'):.1f} B "
              f"(the whole file grew {big['db_growth_bytes_per_entry']:.1f} B per stamp, "
              "its stamps' rows included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
