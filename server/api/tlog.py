"""The transparency log over HTTP (docs/transparency.md):

    /tlog/checkpoint, /tlog/tile/<L>/<N>[.p/<W>], /tlog/tile/entries/<N>[.p/<W>], /tlog/vkey
        C2SP tlog-tiles: the files of ``<data dir>/tlog`` (`server.tlog.store`), as any
        static web server would serve them
    /tlog/policy
        the server's verification policy (c2sp.org/tlog-policy): its log key, its witnesses
        and their quorum
    /v1/proofs/<serial>, /v1/proofs/git/<object id>      (on the /v1 router: problem+json)
        a stamp's c2sp.org/tlog-proof@v1, ``?wait=SECONDS`` until a checkpoint covers it
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import PlainTextResponse, Response
from sqlalchemy import Engine

from formats.tlog.errors import TlogError
from formats.tlog.merkle import inclusion_proof
from formats.tlog.proof import TlogProof
from formats.tlog.tiles import parse_entries_path, parse_tile_path
from server.api.services import Services
from server.db import reading
from server.errors import BadRequest, NotFound, NotInLogYet
from server.models import StampState
from server.tlog.store import TileReader
from server.tlog.witnesses import policy_text

MAX_WAIT = 60.0  # seconds a proof request may wait (``?wait=``)
POLL = 0.1  # seconds between looks while it waits
IMMUTABLE = "public, max-age=31536000, immutable"
_GIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
PROOF_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class _Located:
    serial: int
    index: int | None  # None: not sequenced yet
    entry: bytes | None = None


def _off() -> NotFound:
    return NotFound("this server keeps no transparency log (STAMPD_TLOG=off)")


def add_tlog_routes(app: FastAPI, services: Callable[[], Services]) -> None:
    """The ``/tlog`` files (plain answers: they are what a static web server would give)."""

    def reader() -> TileReader | None:
        return services().tlog_reader

    @app.get("/tlog/checkpoint")
    async def checkpoint() -> Response:
        r = reader()
        note = None if r is None else await asyncio.to_thread(r.checkpoint)
        if note is None:
            return PlainTextResponse("no checkpoint yet\n", status_code=404,
                                     headers={"Cache-Control": "no-store"})
        return Response(note, media_type="text/plain; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/tlog/vkey")
    async def vkey() -> Response:
        key = services().log_key
        if key is None:
            return PlainTextResponse("this server keeps no transparency log\n", status_code=404)
        return PlainTextResponse(key.vkey + "\n")

    @app.get("/tlog/policy")
    async def policy() -> Response:
        s = services()
        if s.log_key is None:
            return PlainTextResponse("this server keeps no transparency log\n", status_code=404)
        text = policy_text(s.log_key.vkey, s.settings.public_url + "tlog",
                           s.settings.witness_list, s.settings.quorum)
        return PlainTextResponse(text, headers={"Cache-Control": "no-cache"})

    @app.get("/tlog/tile/{path:path}")
    async def tile(path: str) -> Response:
        r = reader()
        rel = f"tile/{path}"
        try:
            if path.startswith("entries/"):
                t = parse_entries_path(rel)
                read = r.bundle_bytes if r is not None else None
            else:
                t = parse_tile_path(rel)
                read = r.tile_bytes if r is not None else None
        except TlogError:
            return PlainTextResponse("not a tile path\n", status_code=404)
        if read is None:
            return PlainTextResponse("this server keeps no transparency log\n", status_code=404)
        try:
            data = await asyncio.to_thread(read, t)
        except (OSError, TlogError):
            return PlainTextResponse("no such tile\n", status_code=404)
        return Response(data, media_type="application/octet-stream",
                        headers={"Cache-Control": IMMUTABLE})


def _wait_of(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        wait = float(value)
    except ValueError:
        raise BadRequest("wait must be a number of seconds") from None
    if not 0 <= wait <= MAX_WAIT:  # (also NaN)
        raise BadRequest(f"wait must be 0 to {MAX_WAIT:g} seconds")
    return wait


_LOCATE = ("SELECT s.id, s.state, s.tlog_index, e.entry FROM stamps s "
           "LEFT JOIN tlog_entries e ON e.idx = s.tlog_index WHERE ")
# (SQL written out and run by the driver: a proof is served in a few milliseconds, of which
# SQLAlchemy's statement handling would take a tenth)
_BY = {
    "serial": "s.id = {p}",
    "object": "s.object_id = {p} ORDER BY s.id LIMIT 1",
    # the commit stamped: its first stamp in the log
    "commit": 's."commit" = {p} AND s.tlog_index IS NOT NULL ORDER BY s.tlog_index LIMIT 1',
}


def _locate(engine: Engine, serial: int | None, object_id: str | None) -> _Located:
    """The stamp asked for: its serial, and its index and entry once it is sequenced."""
    with reading(engine).connect() as conn:
        p = "?" if conn.dialect.paramstyle == "qmark" else "%s"

        def first(by: str, value: object) -> Any:
            return conn.exec_driver_sql(_LOCATE + _BY[by].format(p=p), (value,)).first()

        if serial is not None:
            row = first("serial", serial)
            what = f"stamp {serial}"
        else:
            row = first("object", object_id) or first("commit", object_id)
            what = f"git object {object_id}"
    if row is None:
        if object_id is not None:
            raise NotFound(f"no stamp with the git object {object_id} (a signed tag or commit "
                           "this server answered, or a commit it stamped); a stamp whose "
                           "answer was never journalled is found by the commit it stamped")
        raise NotFound(f"no stamp {what} on this server")
    sid, state, index, entry = row
    if index is None and state in (StampState.FAILED, StampState.FAILED_UNLOGGED):
        raise NotFound(f"{what} failed (the client got an error): it is not in the log")
    return _Located(sid, index, None if entry is None else bytes(entry))


def _proof(r: TileReader, index: int, entry: bytes | None = None) -> bytes | None:
    """The proof of entry ``index`` (``entry``: its bytes, else read from its bundle) at the
    published checkpoint; None while no checkpoint covers it."""
    published = r.published()
    if published is None or index >= published[1]:
        return None
    note, size = published
    hashes = inclusion_proof(index, size, r.node_reader(size))
    if entry is None:
        entry = r.entry(index, size)
    return TlogProof(index, tuple(hashes), note, extra=entry).encode()


def _locate_and_prove(engine: Engine, r: TileReader, serial: int | None, object_id: str | None,
                      located: _Located | None) -> tuple[_Located, bytes | None]:
    """(the stamp, its proof or None): one thread hop for both."""
    if located is None or located.index is None:
        located = _locate(engine, serial, object_id)
    if located.index is None:
        return located, None
    return located, _proof(r, located.index, located.entry)


def add_proof_routes(router: APIRouter, services: Callable[[], Services]) -> None:
    async def answer(serial: int | None, object_id: str | None, wait: str | None) -> Response:
        s = services()
        r = s.tlog_reader
        if r is None:
            raise _off()
        deadline = time.monotonic() + _wait_of(wait)
        located: _Located | None = None
        while True:
            try:
                found, proof = await asyncio.to_thread(_locate_and_prove, s.engine, r,
                                                       serial, object_id, located)
            except NotFound:
                # A git stamp's object id is journalled just after its answer: wait for it.
                if object_id is None or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(POLL)
                continue
            located = found
            if proof is not None:
                return Response(proof, media_type=PROOF_TYPE,
                                headers={"X-Stampd-Serial": str(found.serial),
                                         "X-Stampd-Log-Index": str(found.index)})
            if time.monotonic() >= deadline:
                state = ("has no entry in the log yet" if found.index is None else
                         f"is entry {found.index}, not covered by a checkpoint yet")
                raise NotInLogYet(f"stamp {found.serial} {state}; ask again in a second "
                                  "(or with ?wait=SECONDS)")
            await asyncio.sleep(POLL)

    @router.get("/v1/proofs/{serial}")
    async def proof(serial: str, wait: str | None = None) -> Response:
        """The ``c2sp.org/tlog-proof@v1`` of stamp ``serial`` (the serial of a receipt, a
        manifest or an RFC 3161 token): its entry (the ``extra`` line), its index, its inclusion
        proof and the signed checkpoint. 404 while the stamp is unknown or not yet covered (with
        ``Retry-After``); ``?wait=SECONDS`` (at most 60) waits until it is."""
        if not serial.isascii() or not serial.isdigit() or len(serial) > 18:
            raise BadRequest("serial must be a decimal number")
        return await answer(int(serial), None, wait)

    @router.get("/v1/proofs/git/{object_id}")
    async def git_proof(object_id: str, wait: str | None = None) -> Response:
        """The proof of a git stamp, by the id of the signed tag or commit the server answered
        (``git rev-parse <tag>``); or by the id of the commit stamped, the first of its
        stamps in the log."""
        if not _GIT_ID.fullmatch(object_id):
            raise BadRequest("object id must be 40 or 64 lowercase hex digits")
        return await answer(None, object_id, wait)
