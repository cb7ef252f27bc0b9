"""``POST /v1/manifests``: a whole ``sha256sum``/``sha512sum`` output stamped with one signature
(docs/manifests.md); ``GET /v1/manifests/<serial>``: a signed manifest again.

    sha256sum -b * | curl -sS --data-binary @- http://127.0.0.1:8080/v1/manifests > SHA256SUMS.asc

The body is read as it streams in, within its own limits (``STAMPD_MAX_MANIFEST_BYTES``,
``STAMPD_MAX_MANIFEST_LINES``), not the 1000-byte limit of the form endpoints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope

from formats.manifests import MalformedManifest, parse_body
from server.api.body import checked_length, content_type
from server.api.services import Services
from server.errors import (
    BadManifest,
    BadRequest,
    BodyTooLarge,
    NotFound,
    RequestTimeout,
    UnsupportedMediaType,
)
from server.settings import Settings
from server.stamping.queries import signed_manifest
from server.stamping.requests import ManifestRequest, choose_key, key_fields

# What `curl --data-binary` sends by default, and the types a manifest honestly is.
MANIFEST_TYPES = ("application/x-www-form-urlencoded", "text/plain", "application/octet-stream")
RATE = 1 << 20  # bytes per second a body must at least arrive at, past STAMPD_BODY_TIMEOUT


async def read_manifest(scope: Scope, receive: Receive, settings: Settings) -> bytes:
    """The body, streamed: at most ``max_manifest_bytes`` bytes and ``max_manifest_lines``
    lines. A Content-Length is not required (chunked bodies are taken). Each chunk must come
    within ``body_timeout``, and the whole body within ``body_timeout`` plus one second per
    MiB."""
    mtype, length = content_type(scope["headers"])
    if mtype not in MANIFEST_TYPES:
        raise UnsupportedMediaType(f"send {' or '.join(MANIFEST_TYPES)}")
    limit = settings.max_manifest_bytes
    expected = checked_length(length, limit, "manifest") if length is not None else limit
    deadline = time.monotonic() + settings.body_timeout + expected / RATE
    body = bytearray()
    lines = 0
    while True:
        left = min(settings.body_timeout, deadline - time.monotonic())
        try:
            async with asyncio.timeout(max(left, 0)):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout("manifest not received in time") from None
        if message["type"] == "http.disconnect":
            raise RequestTimeout("client went away")
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limit:
            raise BodyTooLarge(f"manifest larger than {limit} bytes")
        lines += chunk.count(b"\n")
        if lines > settings.max_manifest_lines:
            raise BodyTooLarge(f"manifest of more than {settings.max_manifest_lines} lines")
        body += chunk
        if not message.get("more_body", False):
            break
    if lines == settings.max_manifest_lines and not body.endswith(b"\n"):
        raise BodyTooLarge(f"manifest of more than {settings.max_manifest_lines} lines")
    return bytes(body)


def manifest_request(body: bytes) -> ManifestRequest:
    """The checked manifest (run in a thread: a million lines take a while);
    `BadManifest` names the bad lines."""
    try:
        return ManifestRequest(parse_body(body))
    except MalformedManifest as e:
        if not e.count:  # no line to name (an empty body)
            raise BadRequest(str(e)) from None
        raise BadManifest(str(e), e.bad, e.count) from None


def add_manifest_routes(router: APIRouter, services: Callable[[], Services]) -> None:
    @router.post("/v1/manifests")
    async def stamp_manifest(request: Request) -> Response:
        """A manifest (sha256sum/sha512sum output) signed with one signature: the server's
        header lines (``#`` comments to ``sha256sum -c``), then the lines as sent."""
        s = services()
        fmt, fingerprint = key_fields({k: request.query_params.getlist(k)
                                       for k in ("format", "key")
                                       if k in request.query_params})
        key = choose_key(s.keys, fmt, fingerprint)
        body = await read_manifest(request.scope, request.receive, s.settings)
        req = await asyncio.to_thread(manifest_request, body)
        del body
        text = await s.stamper.stamp(req, key)
        s.stats.request("manifest", 200)
        return PlainTextResponse(text)

    @router.get("/v1/manifests/{serial}")
    async def get_manifest(serial: str) -> Response:
        """A signed manifest again, by its serial."""
        s = services()
        if not (serial.isascii() and serial.isdigit() and len(serial) <= 18):
            raise BadRequest("a serial is a whole number")
        text = await asyncio.to_thread(signed_manifest, s.engine, int(serial))
        if text is None:
            raise NotFound(f"no signed manifest {serial}")
        return PlainTextResponse(text)
