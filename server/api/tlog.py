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
from collections.abc import Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.types import Receive

from formats.tlog.errors import TlogError
from formats.tlog.tiles import parse_entries_path, parse_tile_path
from server.api.manifests import client_key
from server.api.services import Services
from server.errors import BadRequest, NotFound, NotInLogYet, RequestTimeout
from server.tlog.proofs import (
    Located,
    UnknownGitObject,
    failed,
    locate_and_prove,
    prove,
    unknown_serial,
)
from server.tlog.store import TileReader
from server.tlog.waiters import Stopping
from server.tlog.witnesses import policy_text

MAX_WAIT = 60.0  # seconds a proof request may wait (``?wait=``)
IMMUTABLE = "public, max-age=31536000, immutable"
_GIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
PROOF_TYPE = "text/plain; charset=utf-8"


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


async def _gone(receive: Receive) -> None:
    """Returns when the client has gone away (its request's body, if any, is dropped)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _not_yet(located: Located | None, object_id: str | None) -> NotFound:
    """What a proof request is answered while its stamp has no covered entry."""
    if located is None:
        return UnknownGitObject(object_id or "")
    if located.failed:
        return failed(located)
    state = ("has no entry in the log yet" if located.index is None else
             f"is entry {located.index}, not covered by a checkpoint yet")
    return NotInLogYet(f"stamp {located.serial} {state}; ask again in a second "
                       "(or with ?wait=SECONDS)")


def add_proof_routes(router: APIRouter, services: Callable[[], Services]) -> None:
    async def answer(request: Request, serial: int | None, object_id: str | None,
                     wait: str | None) -> Response:
        s = services()
        r, waiters = s.tlog_reader, s.proof_waiters
        if r is None or waiters is None:
            raise _off()
        seconds = _wait_of(wait)

        def ok(found: Located, proof: bytes) -> Response:
            return Response(proof, media_type=PROOF_TYPE,
                            headers={"X-Stampd-Serial": str(found.serial),
                                     "X-Stampd-Log-Index": str(found.index)})

        async def look(located: Located | None) -> tuple[Located, bytes | None]:
            return await asyncio.to_thread(locate_and_prove, s.engine, r, serial, object_id,
                                           located)

        if seconds == 0:
            found, proof = await look(None)
            if proof is not None:
                return ok(found, proof)
            raise _not_yet(found, object_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        client = client_key(request.client.host if request.client else None)
        # Looked up with the other waiters that arrive meanwhile, then woken when there is
        # news (server.tlog.waiters): no query of its own.
        with waiters.waiting(client, serial, object_id) as w:
            gone = asyncio.ensure_future(_gone(request.receive))
            try:
                while True:
                    await asyncio.wait((w.woken, gone), timeout=max(0.0, deadline - loop.time()),
                                       return_when=asyncio.FIRST_COMPLETED)
                    if gone.done():
                        raise RequestTimeout("the client went away while waiting for a proof")
                    if not w.looked:  # (the waiters' look failed, or time is up before it)
                        w.looked = True
                        try:
                            w.located, proof = await look(None)
                        except UnknownGitObject:
                            w.located, proof = None, None
                        if w.located is not None and proof is not None:
                            return ok(w.located, proof)
                    elif w.woken.done():
                        w.rearm()
                        if w.unknown:
                            raise unknown_serial(serial or 0)
                        located = w.located
                        if located is not None and located.index is not None:
                            proof = await asyncio.to_thread(prove, r, located.index,
                                                            located.entry)
                            if proof is not None:
                                return ok(located, proof)
                    if w.located is not None and w.located.failed:
                        raise failed(w.located)
                    if waiters.closing:
                        raise Stopping
                    if loop.time() >= deadline:
                        raise _not_yet(w.located, object_id)
            finally:
                gone.cancel()

    @router.get("/v1/proofs/{serial}")
    async def proof(request: Request, serial: str, wait: str | None = None) -> Response:
        """The ``c2sp.org/tlog-proof@v1`` of stamp ``serial`` (the serial of a receipt, a
        manifest or an RFC 3161 token): its entry (the ``extra`` line), its index, its inclusion
        proof and the signed checkpoint. 404 while the stamp is unknown or not yet covered (with
        ``Retry-After``); ``?wait=SECONDS`` (at most 60) waits until it is; 503 (with
        ``Retry-After``) when too many requests wait already."""
        if not serial.isascii() or not serial.isdigit() or len(serial) > 18:
            raise BadRequest("serial must be a decimal number")
        return await answer(request, int(serial), None, wait)

    @router.get("/v1/proofs/git/{object_id}")
    async def git_proof(request: Request, object_id: str, wait: str | None = None) -> Response:
        """The proof of a git stamp, by the id of the signed tag or commit the server answered
        (``git rev-parse <tag>``); or by the id of the commit stamped, the first of its
        stamps in the log."""
        if not _GIT_ID.fullmatch(object_id):
            raise BadRequest("object id must be 40 or 64 lowercase hex digits")
        return await answer(request, None, object_id, wait)
