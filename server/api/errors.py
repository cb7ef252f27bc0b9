"""Domain errors as HTTP answers, mapped once for each front end.

The Zeitgitter protocol answers a short plain-text reason, and any bad request is a 406 (as
the protocol's clients expect); the ``/v1`` API answers RFC 9457 ``application/problem+json``,
and a bad request is a 400; RFC 3161 answers the ``/v1`` status with a ``TimeStampResp`` whose
status is ``rejection`` (``systemFailure`` for a 503, else ``badDataFormat``). All add
``Retry-After`` to a 503.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from http import HTTPStatus
from typing import Annotated, Any, Literal, NotRequired

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import ConfigDict, Field, with_config
from starlette.exceptions import HTTPException
from starlette.types import Scope, Send
from typing_extensions import TypedDict

from formats.tsp.response import rejection
from server.errors import (
    BadManifest,
    BadRequest,
    BodyTooLarge,
    LengthRequired,
    NotFound,
    PeerError,
    RequestTimeout,
    StampError,
    Unavailable,
    UnsupportedMediaType,
)
from server.runtime.httpproto import respond

Dialect = Literal["zeitgitter", "v1"]
# Every answer says: no browser may guess another type than the one sent (an error body that
# echoes a submitted value stays text).
NOSNIFF = (b"x-content-type-options", b"nosniff")
PROBLEM = "application/problem+json"
TIMESTAMP_REPLY = b"application/timestamp-reply"

_STATUS: dict[type[StampError], tuple[int, str]] = {
    BadRequest: (406, "Not Acceptable"),
    NotFound: (404, "Not Found"),
    RequestTimeout: (408, "Request Timeout"),
    LengthRequired: (411, "Length Required"),
    BodyTooLarge: (413, "Content Too Large"),
    UnsupportedMediaType: (415, "Unsupported Media Type"),
    PeerError: (502, "Bad Gateway"),
    Unavailable: (503, "Service Unavailable"),
    StampError: (500, "Internal Server Error"),
}
_V1_STATUS: dict[type[StampError], tuple[int, str]] = {BadRequest: (400, "Bad Request")}


def status_of(exc: StampError, dialect: Dialect) -> tuple[int, str]:
    """(HTTP status, title) of ``exc`` in a front end's dialect."""
    for cls in type(exc).__mro__:
        if dialect == "v1" and cls in _V1_STATUS:
            return _V1_STATUS[cls]
        if cls in _STATUS:
            return _STATUS[cls]
    raise AssertionError("unreachable: StampError is mapped")


def reason(exc: StampError) -> str:
    """The error's message as the answer may carry it: a message may quote what the client
    sent, and JSON lets a client send lone surrogates (``"\\ud800"``), which UTF-8 cannot
    encode; they are written as ``\\ud800``, so that no refusal becomes a 500."""
    return exc.message.encode("utf-8", "backslashreplace").decode("utf-8")


def _retry_after(exc: StampError) -> dict[str, str]:
    retry_after = getattr(exc, "retry_after", None)
    return {"Retry-After": str(retry_after)} if retry_after is not None else {}


async def send_plain(scope: Scope, send: Send, exc: StampError) -> int:
    """Answer a Zeitgitter request over raw ASGI; returns the status sent."""
    status, _ = status_of(exc, "zeitgitter")
    body = reason(exc).encode() + b"\n"
    headers = [(b"content-type", b"text/plain; charset=utf-8"), NOSNIFF]
    headers += [(k.lower().encode(), v.encode()) for k, v in _retry_after(exc).items()]
    await respond(scope, send, status, headers, body)
    return status


def plain(exc: StampError) -> PlainTextResponse:
    """The same answer as `send_plain`, as a response of the app (``GET /``, ``GET
    /tsa.pem``)."""
    status, _ = status_of(exc, "zeitgitter")
    return PlainTextResponse(reason(exc) + "\n", status_code=status,
                             headers=_retry_after(exc) or None)


@with_config(ConfigDict(extra="forbid"))
class Problem(TypedDict):
    """RFC 9457 problem details"""

    type: Literal["about:blank"]
    title: Annotated[str, Field(description="the HTTP reason phrase")]
    status: Annotated[int, Field(ge=400, le=599)]
    detail: Annotated[str, Field(description="what was wrong")]
    lines: NotRequired[Annotated[list[Annotated[int, Field(ge=1)]], Field(
        max_length=20, description="POST /v1/manifests: the first bad line numbers")]]
    bad_lines: NotRequired[Annotated[int, Field(
        ge=1, description="POST /v1/manifests: how many lines are bad")]]


def problem(exc: StampError) -> JSONResponse:
    """The ``/v1`` answer: RFC 9457 problem details."""
    status, title = status_of(exc, "v1")
    extra: dict[str, object] = {}
    if isinstance(exc, BadManifest):  # RFC 9457 extension members
        extra.update(lines=exc.lines, bad_lines=exc.count)
    return problem_response(status, title, reason(exc), _retry_after(exc) or None, **extra)


def problem_response(status: int, title: str, detail: object,
                     headers: Mapping[str, str] | None = None, **extra: object) -> JSONResponse:
    """An RFC 9457 ``application/problem+json`` answer (also for FastAPI's own 404/405 on
    ``/v1`` paths)."""
    body: dict[str, object] = {"type": "about:blank", "title": title, "status": status,
                               "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def problem_route(on_problem: Callable[[str, int], None]) -> type[APIRoute]:
    """The route class of the ``/v1`` API: a domain error its handler raises is answered as
    problem+json (mapped here, once), and ``on_problem`` is told the route's path (its
    template: ``/v1/manifests/{serial}``) and the status sent."""

    class ProblemRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            path = self.path

            async def handle(request: Request) -> Response:
                try:
                    return await handler(request)
                except StampError as e:
                    on_problem(path, status_of(e, "v1")[0])
                    return problem(e)

            return handle

    return ProblemRoute


async def routing_problem(request: Request, exc: Exception) -> Response:
    """A ``/v1`` path that names no resource (404) or a method it does not take (405, with
    ``Allow``) is answered as problem+json too; other paths as FastAPI does."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if path != "/v1" and not path.startswith("/v1/"):
        return await http_exception_handler(request, exc)
    return problem_response(exc.status_code, HTTPStatus(exc.status_code).phrase, exc.detail,
                            exc.headers)


def _failure_of(exc: StampError) -> str:
    """The PKIFailureInfo that tells a TSA client what an HTTP-level error means."""
    if isinstance(exc, Unavailable):
        return "systemFailure"
    return "badDataFormat"


async def send_tsa_reply(scope: Scope, send: Send, status: int, body: bytes,
                         extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """An RFC 3161 answer: a DER ``TimeStampResp``."""
    await respond(scope, send, status,
                  [(b"content-type", TIMESTAMP_REPLY), NOSNIFF, *(extra or [])], body)


async def send_tsa_error(scope: Scope, send: Send, exc: StampError) -> int:
    """An HTTP error for an RFC 3161 client: the status, and a rejection ``TimeStampResp``
    whose statusString says why. Returns the status sent."""
    status, _ = status_of(exc, "v1")
    extra = [(b"retry-after", str(exc.retry_after).encode())] \
        if isinstance(exc, Unavailable) else []
    text = reason(exc).encode("ascii", "backslashreplace").decode("ascii")
    await send_tsa_reply(scope, send, status, rejection(_failure_of(exc), text), extra)
    return status
