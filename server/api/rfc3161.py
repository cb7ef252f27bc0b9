"""The HTTP front end of the RFC 3161 time-stamping authority (§3.4): ``POST /`` with
``Content-Type: application/timestamp-query`` (as most public TSAs, so that a client can be
given the server's base URL) and ``POST /tsr``; ``GET /tsa.pem`` publishes the certificate chain.

A request is checked (`formats.tsp.request.parse_request`) before anything is recorded: a
refused request is answered with a ``TimeStampResp`` whose status is ``rejection`` (HTTP 200,
as RFC 3161 has it) and leaves no journal row. An accepted one is journalled, then signed by a
worker holding the TSA key, like every stamp. What goes wrong outside the request itself is
answered with an HTTP status and a ``TimeStampResp`` saying why (413, 408, 503 with
``systemFailure``...): docs/tsa.md lists them.

This module is only the HTTP side: what a request is checked against and how it becomes a
token is `server.stamping.rfc3161`; the format, `formats.tsp`; the worker's side,
`workers.tsa`.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from formats.tsp.response import Rejection, granted, rejection
from server.api.body import content_type, read_body
from server.api.deps import ServicesDep
from server.api.errors import TIMESTAMP_REPLY, plain, send_tsa_error, send_tsa_reply
from server.api.openapi import errors, request_body, text
from server.api.services import Services
from server.errors import BadRequest, NotFound, StampError
from server.stamping.rfc3161 import timestamp_request

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
        except Rejection as r:
            await send_tsa_reply(scope, send, 200, rejection(r.failure, r.text))
            s.stats.request("tsa", 200)
            return
        token = await s.stamper.stamp(req, tsa.key)
    except StampError as e:
        s.stats.request("tsa", await send_tsa_error(scope, send, e))
        return
    await send_tsa_reply(scope, send, 200, granted(token))
    s.stats.request("tsa", 200)


BINARY = {"schema": {"type": "string", "format": "binary"}}


def add_timestamp_routes(app: FastAPI) -> None:
    """``GET /tsa.pem``: the TSA certificate chain; and ``POST /tsr`` for the document and for
    the Allow header of a 405 (`server.api.zeitgitter.ZeitgitterPost` answers it before the
    app)."""

    @app.get("/tsa.pem", tags=["rfc3161"], operation_id="getTsaChain",
             summary="The TSA certificate chain (PEM, the TSA certificate first)",
             response_class=Response,
             responses={200: text("the chain", media=PEM_CHAIN),
                        404: text("RFC 3161 is off on this server")})
    async def tsa_pem(s: ServicesDep) -> Response:
        tsa = s.tsa
        if tsa is None:
            return plain(NotFound("RFC 3161 time-stamping is off on this server"))
        return Response(tsa.chain_pem, media_type=PEM_CHAIN)

    @app.post(TSA_PATH, tags=["rfc3161"], operation_id="timestamp",
              summary="An RFC 3161 time-stamp token for a TimeStampReq", response_class=Response,
              openapi_extra=request_body(TIMESTAMP_QUERY, schema=BINARY["schema"]),
              responses={200: {"description": "a TimeStampResp: granted with the token, or "
                                              "rejection",
                               "content": {TIMESTAMP_REPLY.decode(): BINARY}},
                         **errors(TIMESTAMP_REPLY.decode(), 404, 408, 411, 413, 415, 503,
                                  s404="RFC 3161 is off on this server (STAMPD_TSA=false)",
                                  s415="a Content-Type other than "
                                       "application/timestamp-query")})
    async def tsr_post() -> Response:
        """RFC 3161 over HTTP (docs/tsa.md); `POST /` with this Content-Type is the same. A
        request the TSA refuses is answered 200 with a TimeStampResp of status `rejection` and
        nothing is recorded; HTTP errors carry a TimeStampResp too."""
        raise AssertionError("POST /tsr is served by ZeitgitterPost")
