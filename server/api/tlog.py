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
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import WithJsonSchema
from starlette.types import Receive

from formats.gitobjects import OBJECT_ID
from formats.tlog.errors import TlogError
from formats.tlog.tiles import parse_entries_path, parse_tile_path
from server.api.deps import ClientDep, ServicesDep
from server.api.openapi import RETRY_AFTER, Responses, matching, problems, text
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
from server.tlog.waiters import Stopping
from server.tlog.witness_client import policy_text

MAX_WAIT = 60.0  # seconds a proof request may wait (``?wait=``)
IMMUTABLE = "public, max-age=31536000, immutable"
_SERIAL = re.compile("[0-9]{1,18}")
PROOF_TYPE = "text/plain; charset=utf-8"
NO_LOG = text("no transparency log")


def _off() -> NotFound:
    return NotFound("this server keeps no transparency log (STAMPD_TLOG=off)")


def add_tlog_routes(app: FastAPI) -> None:
    """The ``/tlog`` files (plain answers: they are what a static web server would give)."""

    @app.get("/tlog/checkpoint", tags=["tlog"], operation_id="getCheckpoint",
             summary="The newest signed checkpoint (C2SP tlog-checkpoint)",
             response_class=PlainTextResponse, response_description="the signed note",
             responses={404: text("no checkpoint yet, or no transparency log")})
    async def checkpoint(s: ServicesDep) -> Response:
        r = s.tlog_reader
        note = None if r is None else await asyncio.to_thread(r.checkpoint)
        if note is None:
            return PlainTextResponse("no checkpoint yet\n", status_code=404,
                                     headers={"Cache-Control": "no-store"})
        return Response(note, media_type="text/plain; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/tlog/vkey", tags=["tlog"], operation_id="getLogVerifierKey",
             summary="The log's signed-note verifier key, one line",
             response_class=PlainTextResponse,
             response_description="<origin>+<key ID>+<base64 key>", responses={404: NO_LOG})
    async def vkey(s: ServicesDep) -> Response:
        key = s.log_key
        if key is None:
            return PlainTextResponse("this server keeps no transparency log\n", status_code=404)
        return PlainTextResponse(key.vkey + "\n")

    @app.get("/tlog/policy", tags=["tlog"], operation_id="getVerificationPolicy",
             summary="The server's verification policy (C2SP tlog-policy)",
             response_class=PlainTextResponse,
             response_description="the policy, one line per item", responses={404: NO_LOG})
    async def policy(s: ServicesDep) -> Response:
        """The log's verifier key, the witnesses that cosign its checkpoints and how many of
        them a checkpoint needs: `log`, `witness`, `group witnesses <k> ...` and `quorum
        witnesses` lines, or `quorum none` without witnesses."""
        if s.log_key is None:
            return PlainTextResponse("this server keeps no transparency log\n", status_code=404)
        text = policy_text(s.log_key.vkey, s.settings.public_url + "tlog",
                           s.settings.witness_list, s.settings.quorum)
        return PlainTextResponse(text, headers={"Cache-Control": "no-cache"})

    @app.get("/tlog/tile/{path:path}", tags=["tlog"], operation_id="getTile",
             summary="A tile or an entry bundle (C2SP tlog-tiles)", response_class=Response,
             responses={200: {"description": "the tile's bytes", "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                 404: text("not a tile path, or no such tile")})
    async def tile(s: ServicesDep, path: str) -> Response:
        """`<L>/<N>[.p/<W>]` (hashes) or `entries/<N>[.p/<W>]` (entries); immutable."""
        r = s.tlog_reader
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


Wait = Annotated[str | None, Query(
    description="seconds (0 to 60) to wait until a checkpoint covers it (the answer comes as "
                "soon as one does)"), WithJsonSchema({"type": "string"})]


def _proof_doc(operation_id: str, summary: str, s400: str) -> dict[str, Any]:
    """What describes a ``/v1/proofs`` operation: its answers among them."""
    found = problems(404, s404="no such stamp, a stamp that failed, or one not yet covered by "
                               "a checkpoint (then with Retry-After)")
    found[404]["headers"] = {"Retry-After": {**RETRY_AFTER, "required": False}}
    responses: Responses = {
        200: {"description": "the proof", "headers": {
            "X-Stampd-Serial": {"description": "the stamp's serial", "schema": {"type": "string"}},
            "X-Stampd-Log-Index": {"description": "its entry's index",
                                   "schema": {"type": "string"}}}},
        **problems(400, 503, s400=s400,
                   s503="as many proof requests wait already as this server lets wait (in all, "
                        "or from this client), or the server is stopping; try again after "
                        "Retry-After seconds"),
        **found}
    return {"tags": ["tlog"], "operation_id": operation_id, "summary": summary,
            "response_class": PlainTextResponse, "responses": responses}


def add_proof_routes(router: APIRouter) -> None:
    async def answer(request: Request, s: Services, client: bytes, serial: int | None,
                     object_id: str | None, wait: str | None) -> Response:
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

    @router.get("/v1/proofs/{serial}", **_proof_doc(
        "getProof", "A stamp's proof of inclusion in the transparency log",
        "a serial or wait that is malformed"))
    async def proof(request: Request, s: ServicesDep, client: ClientDep,
                    serial: Annotated[str, Path(), matching(_SERIAL)],
                    wait: Wait = None) -> Response:
        """The `c2sp.org/tlog-proof@v1` of the stamp with this serial (a receipt, a manifest
        or an RFC 3161 token): its entry on the `extra` line, its index, the inclusion proof
        and the signed checkpoint."""
        if not _SERIAL.fullmatch(serial):
            raise BadRequest("serial must be a decimal number")
        return await answer(request, s, client, int(serial), None, wait)

    @router.get("/v1/proofs/git/{object_id}", **_proof_doc(
        "getGitProof", "A git stamp's proof of inclusion in the transparency log",
        "an object id or wait that is malformed"))
    async def git_proof(request: Request, s: ServicesDep, client: ClientDep,
                        object_id: Annotated[str, Path(), matching(OBJECT_ID)],
                        wait: Wait = None) -> Response:
        """By the id of the signed tag or commit the server answered, or by the commit
        stamped (its first stamp in the log)."""
        if not OBJECT_ID.fullmatch(object_id):
            raise BadRequest("object id must be 40 or 64 lowercase hex digits")
        return await answer(request, s, client, None, object_id, wait)
