"""Reading a request body within the limits every POST endpoint shares: one Content-Type, of
an accepted type, one Content-Length, no larger than ``STAMPD_MAX_BODY``, and the whole body
within ``STAMPD_BODY_TIMEOUT`` (a client that announces more than it sends gets a 408)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.types import Receive, Scope

from server.errors import (
    BadRequest,
    BodyTooLarge,
    LengthRequired,
    RequestTimeout,
    UnsupportedMediaType,
)
from server.runtime.httpproto import whole_body
from server.settings import Settings


def content_type(headers: list[tuple[bytes, bytes]]) -> tuple[str, str | None]:
    """(media type, Content-Length) from raw ASGI headers. Either header given twice is a
    `BadRequest`: parsers disagree on which one counts (this check would read one, the
    multipart parser another)."""
    mtype: str | None = None
    length: str | None = None
    for name, value in headers:
        if name == b"content-type":
            if mtype is not None:
                raise BadRequest("header 'Content-Type' given more than once")
            mtype = value.decode("latin-1").split(";")[0].strip().lower()
        elif name == b"content-length":
            if length is not None:
                raise BadRequest("header 'Content-Length' given more than once")
            length = value.decode("latin-1")
    return mtype or "", length


async def _receive(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestTimeout("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def checked_length(length: str, limit: int, what: str) -> int:
    """A Content-Length of at most ``limit`` bytes; `BadRequest` if it is not a number,
    `BodyTooLarge` (naming ``what``) if it is larger."""
    if not (length.isascii() and length.isdigit()):  # "²".isdigit(), but int("²") fails
        raise BadRequest("malformed Content-Length")
    if int(length) > limit:
        raise BodyTooLarge(f"{what} larger than {limit} bytes")
    return int(length)


async def read_body(scope: Scope, receive: Receive, settings: Settings,
                    types: Sequence[str]) -> tuple[str, bytes]:
    """(media type, body) of a request whose type is one of ``types``."""
    mtype, length = content_type(scope["headers"])
    if mtype not in types:
        raise UnsupportedMediaType(f"send {' or '.join(types)}")
    if length is None:
        raise LengthRequired("Content-Length is required")
    checked_length(length, settings.max_body, "body")
    body = whole_body(scope, settings.max_body)
    if body is not None:  # already here: no receive, no timeout
        return mtype, body
    try:
        async with asyncio.timeout(settings.body_timeout):
            return mtype, await _receive(receive, settings.max_body)
    except TimeoutError:
        raise RequestTimeout("body not received in time") from None
