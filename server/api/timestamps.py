"""The HTTP front end of the RFC 3161 time-stamping authority (§3.4): ``POST /`` with
``Content-Type: application/timestamp-query`` (as most public TSAs, so that a client can be
given the server's base URL) and ``POST /tsr``; ``GET /tsa.pem`` publishes the certificate chain.

A request is checked (`formats.tsp.parse_request`) before anything is recorded: a
refused request is answered with a ``TimeStampResp`` whose status is ``rejection`` (HTTP 200,
as RFC 3161 has it) and leaves no journal row. An accepted one is journalled, then signed by a
worker holding the TSA key, like every stamp. What goes wrong outside the request itself is
answered with an HTTP status and a ``TimeStampResp`` saying why (413, 408, 503 with
``systemFailure``...): docs/tsa.md lists them.

This module is only the HTTP side: what a request is checked against and how it becomes a
token is `server.stamping.timestamps`; the format, `formats.tsp`; the worker's side,
`workers.tsa`.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from formats import tsp
from server.api.body import content_type, read_body
from server.api.errors import plain, send_tsa_error, send_tsa_reply
from server.api.services import Services
from server.errors import BadRequest, NotFound, StampError
from server.stamping.timestamps import timestamp_request

TIMESTAMP_QUERY = "application/timestamp-query"
PEM_CHAIN = "application/pem-certificate-chain"
TSA_PATH = "/tsr"


def is_timestamp_query(scope: Scope) -> bool:
    """Whether a ``POST /`` is an RFC 3161 request (its Content-Type says so); a request whose
    headers are in doubt goes to the Zeitgitter handler, which refuses it."""
    try:
        mtype, _ = content_type(scope["headers"])
    except BadRequest:
        return False
    return mtype == TIMESTAMP_QUERY


async def serve_timestamp(scope: Scope, receive: Receive, send: Send, s: Services) -> None:
    """Answer one RFC 3161 request (``POST /`` or ``POST /tsr``)."""
    tsa = s.tsa
    try:
        if tsa is None:
            raise NotFound("RFC 3161 time-stamping is off on this server")
        _, body = await read_body(scope, receive, s.settings, (TIMESTAMP_QUERY,))
        try:
            req = timestamp_request(tsa, body)
        except tsp.Rejection as r:
            await send_tsa_reply(scope, send, 200, tsp.rejection(r.failure, r.text))
            s.stats.request("tsa", 200)
            return
        token = await s.stamper.stamp(req, tsa.key)
    except StampError as e:
        s.stats.request("tsa", await send_tsa_error(scope, send, e))
        return
    await send_tsa_reply(scope, send, 200, tsp.granted(token))
    s.stats.request("tsa", 200)


def add_timestamp_routes(app: FastAPI, services: Callable[[], Services]) -> None:
    """``GET /tsa.pem``: the TSA certificate chain (``POST /tsr`` is served before the app, by
    `server.api.zeitgitter.ZeitgitterPost`, and named here for the Allow header of a 405)."""

    @app.get("/tsa.pem", response_class=PlainTextResponse)
    async def tsa_pem() -> Response:
        tsa = services().tsa
        if tsa is None:
            return plain(NotFound("RFC 3161 time-stamping is off on this server"))
        return Response(tsa.chain_pem, media_type=PEM_CHAIN)

    @app.post(TSA_PATH)
    async def tsr_post() -> Response:
        raise AssertionError("POST /tsr is served by ZeitgitterPost")
