"""This server as a witness over HTTP (c2sp.org/tlog-witness, docs/witness.md):

    POST /add-checkpoint
        a log's checkpoint, its old size and consistency proof: 200 and the cosignature line(s);
        each refusal its status (400, 403, 404, 409 with the size as text/x.tlog.size, 422),
        413 for a body over the limit, 429 (Retry-After) for a client over its requests of
        the minute (`server.budgets`), 503 (Retry-After) when it was stored but not cosigned
    GET /tlog/witness-vkey
        the witness key's cosignature verifier key, one line
    GET /<hex SHA-256 of a log's origin>/checkpoint
        the checkpoint of that log last cosigned, with its signatures (monitoring)

Each `formats.tlog.witness.WitnessError` is mapped to its status here, once; the service's
own errors (`server.errors`) as every plain route maps them.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from typing import Annotated

from fastapi import FastAPI, Path, Request
from fastapi.responses import PlainTextResponse, Response
from sqlalchemy import Engine

from formats.keys import WITNESS_KEY, ServedKey, ed25519_public_key, witness_vkey
from formats.tlog.witness import (
    MAX_REQUEST_BYTES,
    SIZE_CONTENT_TYPE,
    BadLogSignature,
    InconsistentCheckpoint,
    MalformedWitnessRequest,
    SizeConflict,
    UnknownLog,
    WitnessError,
    encode_size,
)
from server.api.body import checked_length
from server.api.deps import ClientDep, ServicesDep
from server.api.errors import plain
from server.api.openapi import TEXT, matching, request_body, text
from server.budgets import WITNESS_MINUTE, RateLimited
from server.dispatch import Dispatcher
from server.errors import BodyTooLarge, RequestTimeout, StampError
from server.settings import Settings
from server.witness.service import Witness, read_by_hash

_STATUS: dict[type[WitnessError], int] = {
    MalformedWitnessRequest: 400,
    BadLogSignature: 403,
    UnknownLog: 404,
    SizeConflict: 409,
    InconsistentCheckpoint: 422,
}
_HEX = re.compile(r"[0-9a-f]{64}")
NOTE_TYPE = "text/plain; charset=utf-8"


def make_witness(settings: Settings, engine: Engine, dispatcher: Dispatcher,
                 served: Sequence[ServedKey], clock: Callable[[], float] = time.time,
                 ) -> Witness | None:
    """The witness of the settings (None when this server is none)."""
    if not settings.witness:
        return None
    public = next((k.public for k in served if k.id == WITNESS_KEY.id), None)
    if public is None:
        raise StampError("this server is a witness (STAMPD_WITNESS) but no host registered "
                         "its key: start `stampd serve` or a `stampd worker` host with it")
    return Witness(engine, dispatcher, settings.witnessed, settings.witness_name,
                   ed25519_public_key(public), clock)


def witness_response(exc: WitnessError) -> Response:
    """The answer to a refused ``add-checkpoint`` request."""
    if isinstance(exc, SizeConflict):
        return Response(encode_size(exc.known), status_code=409,  # (no charset parameter)
                        headers={"Content-Type": SIZE_CONTENT_TYPE})
    status = next(s for cls, s in _STATUS.items() if isinstance(exc, cls))
    return PlainTextResponse(str(exc) + "\n", status_code=status)


async def read_witness_body(request: Request, timeout: float) -> bytes:
    """The body, refused (`BodyTooLarge`) as soon as it is known to exceed
    `MAX_REQUEST_BYTES`: by its Content-Length, else while it streams."""
    length = request.headers.get("content-length")
    if length is not None:
        checked_length(length, MAX_REQUEST_BYTES, "an add-checkpoint request")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_REQUEST_BYTES:
                    raise BodyTooLarge(f"an add-checkpoint request is at most "
                                       f"{MAX_REQUEST_BYTES} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout("body not received in time") from None
    return b"".join(chunks)


def add_witness_routes(app: FastAPI) -> None:
    def not_witness() -> Response:
        return PlainTextResponse("this server is no witness (STAMPD_WITNESS=off)\n",
                                 status_code=404)


    @app.post(
        "/add-checkpoint", tags=["witness"], operation_id="addCheckpoint",
        summary="Have this witness cosign a log's checkpoint (C2SP tlog-witness)",
        response_class=PlainTextResponse,
        response_description="the cosignature line(s) (c2sp.org/tlog-cosignature)",
        openapi_extra=request_body(TEXT, schema={"type": "string",
                                                 "maxLength": MAX_REQUEST_BYTES}),
        responses={
            400: text("a malformed request, or an old size above the checkpoint's"),
            403: text("no valid signature by a key of the log"),
            404: text("a log this witness does not know, or no witness here"),
            409: text("the old size is not the size last cosigned: the body is that size and "
                      "a newline", media=SIZE_CONTENT_TYPE),
            413: text(f"a body over {MAX_REQUEST_BYTES} bytes"),
            422: text("the consistency proof does not verify, or another tree of the size "
                      "cosigned"),
            429: text("this client sent its requests of the minute "
                      "(STAMPD_WITNESS_REQUESTS_PER_CLIENT_MINUTE): retry after Retry-After "
                      "seconds"),
            503: text("stored but not cosigned now: retry after Retry-After seconds")})
    async def add_checkpoint(request: Request, s: ServicesDep, client: ClientDep) -> Response:
        """`old <size>`, the consistency proof (one base64 hash a line), an empty line, then
        the signed checkpoint; at most 65536 bytes. The checkpoint is stored before it is
        cosigned; the checkpoint already cosigned, sent again, is answered with the stored
        cosignature while it is at most 30 s old."""
        if s.witness is None:
            return not_witness()
        assert s.budgets is not None
        try:  # (before the body is read: a refused request costs nothing more)
            await s.budgets.charge(WITNESS_MINUTE, client, 1)
        except RateLimited as e:
            return PlainTextResponse(e.message + "\n", status_code=429,
                                     headers={"Retry-After": str(e.retry_after)})
        try:
            body = await read_witness_body(request, s.settings.body_timeout)
            lines = await s.witness.add_checkpoint(body)
        except WitnessError as e:
            return witness_response(e)
        except StampError as e:
            return plain(e)
        return Response(lines, media_type=NOTE_TYPE)

    @app.get("/tlog/witness-vkey", tags=["witness"], operation_id="getWitnessVerifierKey",
             summary="The witness's cosignature verifier key (type 0x04), one line",
             response_class=PlainTextResponse,
             response_description="<name>+<key ID>+<base64 key>",
             responses={404: text("this server is no witness")})
    async def witness_vkey_route(s: ServicesDep) -> Response:
        if s.witness is None:
            return not_witness()
        public = next(k.public for k in s.keys if k.id == WITNESS_KEY.id)
        return PlainTextResponse(witness_vkey(s.settings.witness_name, public) + "\n")

    @app.get("/{origin_hash}/checkpoint", tags=["witness"], operation_id="getWitnessedCheckpoint",
             summary="The checkpoint of a log last cosigned (monitoring)",
             response_class=PlainTextResponse,
             response_description="the cosigned checkpoint note",
             responses={404: text("no checkpoint of that log cosigned, or no witness here")})
    async def monitoring(s: ServicesDep,
                         origin_hash: Annotated[str, Path(), matching(_HEX)]) -> Response:
        """By the lowercase hex SHA-256 of the log's origin: the checkpoint with the log's
        signature and this witness's cosignature, nothing else."""
        if s.witness is None:
            return not_witness()
        if not _HEX.fullmatch(origin_hash):
            return PlainTextResponse("not the hex SHA-256 of a log's origin\n",
                                     status_code=404)
        stored = await asyncio.to_thread(read_by_hash, s.engine, origin_hash)
        if stored is None:
            return PlainTextResponse("no checkpoint of this log cosigned\n", status_code=404,
                                     headers={"Cache-Control": "no-store"})
        return Response(stored.note, media_type=NOTE_TYPE, headers={"Cache-Control": "no-cache"})
