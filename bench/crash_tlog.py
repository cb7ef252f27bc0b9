"""The transparency log's side of `make crash`: what must hold of it after kill -9 under load.

- `CheckpointWatch` polls ``GET /tlog/checkpoint`` for the whole run (across kills and
  restarts) and keeps every distinct checkpoint it saw;
- `tlog_settled` waits until every stamp the log may list has its entry and a published
  checkpoint covers them all;
- `check_tree`: every checkpoint seen carries a valid signature by the log's verifier key
  (``GET /tlog/vkey``; formats.note, and `cryptography` directly), and is consistent with the
  final tree: the final tree is rebuilt from the served entry bundles by pymerkle (an RFC 6962
  library that is not ours), whose root at each checkpoint's size must be that checkpoint's root;
  the final checkpoint's root must be the root of all the entries; no stamp has two entries;
- `check_proofs`: every stamp answered 200 has a proof (``GET /v1/proofs/<serial>``, by the
  receipt's serial; ``/v1/proofs/git/<id>``, by the id of the tag answered) that verifies
  (formats.tlog.proof.verify_proof) and whose entry is that stamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.proof_http import Answer, Conn, HttpError
from bench.proof_server import wait_for_none

CHECKPOINT_POLL = 0.1  # seconds between looks at /tlog/checkpoint
_SERIAL = re.compile(rb"^serial: ([0-9]+)$", re.MULTILINE)


def proof_path(kind: str, answer: Answer) -> str | None:
    """Where the proof of a stamp answered 200 is: by the receipt's serial (digest), by the id
    of the tag object answered (tag: git's id of it, hashed here, not by stampd)."""
    if kind == "digest":
        m = _SERIAL.search(answer.body)
        return f"/v1/proofs/{int(m.group(1))}" if m else None
    oid = hashlib.sha1(b"tag %d\0" % len(answer.body) + answer.body).hexdigest()
    return f"/v1/proofs/git/{oid}"


class CheckpointWatch:
    """Every distinct checkpoint ``GET /tlog/checkpoint`` answered while it ran."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: dict[bytes, float] = {}  # note -> when first seen (monotonic)
        self.polls = 0
        self.failed = 0  # no answer (the HTTP process was down) or not 200
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def poll_once(self, conn: Conn) -> bytes | None:
        self.polls += 1
        try:
            answer = await conn.request("GET", "/tlog/checkpoint")
        except HttpError:
            self.failed += 1
            return None
        if answer.status != 200:
            self.failed += 1
            return None
        self.seen.setdefault(answer.body, time.monotonic())
        return answer.body

    async def _run(self) -> None:
        conn = Conn(self.port, timeout=10)
        try:
            while not self._stop.is_set():
                if await self.poll_once(conn) is None:
                    await asyncio.sleep(0.2)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), CHECKPOINT_POLL)
        finally:
            conn.close()


def tlog_settled(db_url: str, timeout: float) -> bool:
    """Wait until no signed or pending stamp lacks its entry (pending ones of a dead process
    get theirs STAMPD_REQUEST_TIMEOUT + 10 s after their time)."""
    return wait_for_none(db_url, ("select count(*) from stamps where tlog_index is null and "
                                  "state in ('signed', 'pending', 'orphaned')",), timeout)


@dataclass
class TreeReport:
    checkpoints: int = 0  # distinct checkpoints seen
    final_size: int = 0
    entries: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    git_without_object: int = 0
    problems: list[str] = field(default_factory=list)


async def final_checkpoint(conn: Conn, watch: CheckpointWatch, timeout: float) -> bytes:
    """The newest checkpoint once it stops growing (two looks a second apart agree)."""
    deadline = time.monotonic() + timeout
    last = await watch.poll_once(conn)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = await watch.poll_once(conn)
        if now is not None and now == last:
            return now
        last = now
    raise TimeoutError("/tlog/checkpoint did not settle")


async def check_tree(conn: Conn, watch: CheckpointWatch, final: bytes) -> TreeReport:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from pymerkle import InmemoryTree

    from formats.note import Ed25519Verifier, NoteError, VerifierKey, open_note, parse_note
    from formats.tlog.checkpoint import Checkpoint
    from formats.tlog.entry import Entry
    from formats.tlog.tiles import parse_entry_bundle, tiles_for_size

    rep = TreeReport(checkpoints=len(watch.seen))
    answer = await conn.request("GET", "/tlog/vkey")
    if answer.status != 200:
        rep.problems.append(f"GET /tlog/vkey answered {answer.status}")
        return rep
    vkey = answer.body.decode().strip()
    verifier = Ed25519Verifier.from_vkey(vkey)
    public = Ed25519PublicKey.from_public_bytes(VerifierKey.parse(vkey).public_key)
    origin = VerifierKey.parse(vkey).name

    heads: list[Checkpoint] = []
    for note in watch.seen:
        try:
            cp = Checkpoint.parse(open_note(note, [verifier]).text)
            parsed = parse_note(note)
            public.verify(parsed.signatures[0].signature, parsed.text.encode())
        except (NoteError, InvalidSignature, ValueError) as e:
            rep.problems.append(f"checkpoint not signed by the log key: {e}: {note[:120]!r}")
            continue
        if cp.origin != origin:
            rep.problems.append(f"checkpoint of origin {cp.origin!r}, not {origin!r}")
        heads.append(cp)
    last = Checkpoint.parse(open_note(final, [verifier]).text)
    rep.final_size = last.size

    entries: list[bytes] = []
    for tile in tiles_for_size(last.size):
        if tile.level != 0:
            continue
        got = await conn.request("GET", "/tlog/" + tile.entries_path())
        if got.status != 200:
            rep.problems.append(f"GET /tlog/{tile.entries_path()} answered {got.status}")
            return rep
        entries += parse_entry_bundle(got.body, tile.width)
    rep.entries = len(entries)
    theirs = InmemoryTree(algorithm="sha256")
    for e in entries:
        theirs.append_entry(e)
    if last.size and theirs.get_root(last.size) != last.root:
        rep.problems.append(f"the final checkpoint's root is not that of the {last.size} served "
                            "entries (pymerkle)")
    for cp in heads:
        if cp.size > last.size:
            rep.problems.append(f"a checkpoint of size {cp.size} was seen, the final tree has "
                                f"{last.size}")
        elif cp.size and theirs.get_root(cp.size) != cp.root:
            rep.problems.append(f"the checkpoint of size {cp.size} is not consistent with the "
                                "final tree (its root differs from pymerkle's)")

    serials: Counter[int] = Counter()
    for raw in entries:
        entry = Entry.parse(raw)
        serials[entry.serial] += 1
        rep.kinds[entry.kind] += 1
        if entry.kind in ("tag", "branch") and entry.object_id is None:
            rep.git_without_object += 1
    twice = [s for s, n in serials.items() if n > 1]
    if twice:
        rep.problems.append(f"{len(twice)} stamp(s) with more than one entry: {twice[:5]}")
    return rep


@dataclass
class ProofCheck:
    checked: int = 0
    verified: int = 0
    without_object: int = 0  # git stamps whose entry has no object (its process died)
    by_commit: int = 0  # not found by the tag's object id: asked for by the commit's
    problems: list[str] = field(default_factory=list)


async def check_proofs(port: int, stamps: list[tuple[str, str, str]], *, wait: float,
                       concurrency: int = 8) -> ProofCheck:
    """``stamps``: (kind, identity, proof path) of every stamp answered 200. Each proof must
    verify against the log key and origin, and its entry must be that stamp."""
    from formats.note import Ed25519Verifier, VerifierKey
    from formats.tlog.entry import Entry
    from formats.tlog.proof import TlogProof, verify_proof

    out = ProofCheck()
    conn = Conn(port, timeout=wait + 30)
    vkey = (await conn.request("GET", "/tlog/vkey")).body.decode().strip()
    conn.close()
    keys = [Ed25519Verifier.from_vkey(vkey)]
    origin = VerifierKey.parse(vkey).name
    todo = iter(stamps)

    async def one(c: Conn, kind: str, identity: str, path: str) -> str | None:
        try:
            answer = await c.request("GET", f"{path}?wait={wait:g}")
            if answer.status == 404 and kind == "tag":
                # A tag whose process died before it recorded the object answered: its entry
                # has no object, and it is found by the commit stamped (docs/transparency.md).
                answer = await c.request("GET", f"/v1/proofs/git/{identity}?wait={wait:g}")
                out.by_commit += 1
        except HttpError as e:
            return f"GET {path}: {e}"
        if answer.status != 200:
            return f"GET {path} ({kind} {identity}): {answer.status} {answer.body[:200]!r}"
        try:
            proof = TlogProof.parse(answer.body)
            if proof.extra is None:
                return f"{path}: the proof carries no entry"
            verify_proof(answer.body, proof.extra, origin=origin, log_keys=keys)
            entry = Entry.parse(proof.extra)
        except Exception as e:  # TlogError, NoteError, ValueError: all mean "does not verify"
            return f"{path} ({kind} {identity}): does not verify: {type(e).__name__}: {e}"
        out.verified += 1
        if kind == "digest":
            serial = int(path.rsplit("/", 1)[1])
            if (entry.kind, entry.serial, entry.algorithm, entry.digest) != (
                    "digest", serial, "sha256", identity):
                return f"{path}: the entry is not the stamp's: {entry}"
            return None
        oid = path.rsplit("/", 1)[1]
        if entry.kind != "tag" or entry.commit != identity:
            return f"{path}: the entry is not the stamp of commit {identity}: {entry}"
        if entry.object_id is None:
            out.without_object += 1
        elif entry.object_id != oid:
            return f"{path}: the entry's object is {entry.object_id}, not {oid}"
        return None

    async def worker() -> None:
        c = Conn(port, timeout=wait + 30)
        try:
            for kind, identity, path in todo:
                out.checked += 1
                problem = await one(c, kind, identity, path)
                if problem is not None:
                    out.problems.append(problem)
        finally:
            c.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out
