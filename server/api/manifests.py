"""``POST /v1/manifests``: a whole ``sha256sum``/``sha512sum`` output stamped with one signature
(docs/manifests.md); ``GET /v1/manifests/<serial>``: a signed manifest again.

    sha256sum -b * | curl -sS --data-binary @- http://127.0.0.1:8080/v1/manifests > SHA256SUMS.asc

The body is read as it streams in, within its own limits (``STAMPD_MAX_MANIFEST_BYTES``,
``STAMPD_MAX_MANIFEST_LINES``), not the 1000-byte limit of the form endpoints. Before it is
read, its bytes are charged to the hourly budgets of its client and of the host
(`server.budgets`, 429 beyond them), and held in the host's budget of manifest bytes in
flight (503 beyond it) until the request is answered.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from formats.manifests import ALGORITHMS as MANIFEST_ALGORITHMS
from formats.manifests import (
    MAX_LINE,
    MalformedManifest,
    Manifest,
    Text,
    line_regex,
    parse_body,
    utf8_pieces,
    utf8_size,
)
from procs import memory
from server.api.body import checked_length, content_type
from server.api.deps import ClientDep, ServicesDep
from server.api.errors import problem_response
from server.api.openapi import (
    EXAMPLE_DIGEST,
    KEY_CHOICE,
    matching,
    named,
    problems,
    ref,
    request_body,
)
from server.budgets import MANIFEST_HOUR, RateLimited
from server.errors import (
    BadManifest,
    BadRequest,
    BodyTooLarge,
    NotFound,
    RequestTimeout,
    Unavailable,
    UnsupportedMediaType,
)
from server.runtime.threadpool import OneAtATime
from server.settings import Settings
from server.stamping.queries import manifest_piece, manifest_size
from server.stamping.requests import ManifestRequest, choose_key, key_fields
from workers.manifest_check import IN_PROCESS_MAX, CheckFailed, check_elsewhere

# What `curl --data-binary` sends by default, and the types a manifest honestly is.
MANIFEST_TYPES = ("application/x-www-form-urlencoded", "text/plain", "application/octet-stream")
RATE = 1 << 20  # bytes per second a body must at least arrive at, past STAMPD_BODY_TIMEOUT
WINDOW = 3600  # seconds of one rate-limit window (fixed windows, aligned to the hour)


class ManifestCheckFailed(Unavailable):
    """The process checking a manifest ended without an answer (killed, out of memory)."""

    retry_after = 10


def manifest_length(scope: Scope, settings: Settings) -> int | None:
    """The body's announced length (None: chunked), checked against the limit, and its
    type, before anything is read."""
    mtype, length = content_type(scope["headers"])
    if mtype not in MANIFEST_TYPES:
        raise UnsupportedMediaType(f"send {' or '.join(MANIFEST_TYPES)}")
    if length is None:
        return None
    return checked_length(length, settings.max_manifest_bytes, "manifest")


CHARGE_STEP = 4 << 20  # a chunked body is charged to the rate limit as it arrives, this at a time


async def read_manifest(scope: Scope, receive: Receive, settings: Settings,
                        charge: Callable[[int], Awaitable[None]]) -> bytearray:
    """The body, streamed: at most ``max_manifest_bytes`` bytes and ``max_manifest_lines``
    lines. A Content-Length is not required (chunked bodies are taken). Each chunk must come
    within ``body_timeout``, and the whole body within ``body_timeout`` plus one second per
    MiB. ``charge`` is told the bytes to come before they are read: the announced length at
    once, a chunked body `CHARGE_STEP` at a time (it raises to refuse them). The buffer it was
    read into is returned as it is (a ``bytes`` of it would be a second copy of the body)."""
    length = manifest_length(scope, settings)
    limit = settings.max_manifest_bytes
    expected = length if length is not None else limit
    charged = 0
    if length is not None:
        await charge(length)
        charged = length
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
        if len(body) + len(chunk) > charged:
            step = max(CHARGE_STEP, len(body) + len(chunk) - charged)
            await charge(step)
            charged += step
        body += chunk
        if not message.get("more_body", False):
            break
    if lines == settings.max_manifest_lines and not body.endswith(b"\n"):
        raise BodyTooLarge(f"manifest of more than {settings.max_manifest_lines} lines")
    return body


def manifest_request(body: bytearray) -> ManifestRequest:
    """The checked manifest (run in a thread: a million lines take seconds); `BadManifest`
    names the bad lines. It takes ``body`` (`read_manifest`'s buffer), so that the process
    holds as few copies of the manifest as it can; a last line's missing newline is added to
    it in place (not to a copy of its text). A body of `IN_PROCESS_MAX` bytes or more is
    checked, and its digest index built, in a child process (`workers.manifest_check`): in
    this one it held the GIL, and so the event loop, for as long. Its lines are then the body
    itself, checked UTF-8: it is sent to the worker, the journal and the client as it is (a
    string of it would be a copy, made in one call that held the GIL for 100-150 ms). A
    smaller body is checked here and emptied once its text is read, before the digest
    buckets are built."""
    try:
        if body and not body.endswith(b"\n"):
            body += b"\n"
        if len(body) < IN_PROCESS_MAX:
            manifest = parse_body(body)
            body.clear()
            return ManifestRequest(manifest)
        checked = check_elsewhere(body)
    except MalformedManifest as e:
        body.clear()
        if not e.count:  # no line to name (an empty body)
            raise BadRequest(str(e)) from None
        raise BadManifest(str(e), e.bad, e.count) from None
    except CheckFailed as e:
        body.clear()
        raise ManifestCheckFailed(str(e)) from None
    except BaseException:
        body.clear()
        raise
    return ManifestRequest(Manifest(checked.algorithm, body, checked.lines, b""), checked.rows)


class _Answer(StreamingResponse):
    """A streamed answer that calls ``done`` when it ends, sent or not (a client gone)."""

    def __init__(self, content: AsyncIterator[bytes], size: int,
                 done: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/plain; charset=utf-8",
                         headers={"Content-Length": str(size)},
                         background=BackgroundTask(asyncio.to_thread, memory.trim))
        self.done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.done()


def answer(parts: tuple[Text, ...], done: Callable[[], None]) -> Response:
    """The signed manifest (``parts``, whose concatenation it is), sent a piece at a time
    (encoded as it goes: no copy of it in bytes, nor in the transport's buffer). ``done`` (it
    gives back the manifest's bytes in flight: the answer holds the signed text until it is
    sent) is called once its last piece has been taken, before the end of the answer is sent,
    or when the answer ends otherwise (a client gone). Once it is sent, the freed pages go back
    to the system (`procs.memory.trim`, in a thread)."""
    size = utf8_size(*parts)

    async def pieces() -> AsyncIterator[bytes]:
        for piece in utf8_pieces(*parts):
            yield piece
            # A turn of the loop: the transport writes the piece (it gathers the writes of
            # one turn, httpproto._CoalescingTransport) and, above its high-water mark, makes
            # the next send wait until the client has taken it. Without it every piece would
            # be gathered and joined at once: a whole copy of the answer.
            await asyncio.sleep(0)
        done()

    return _Answer(pieces(), size, done)


# A manifest body: one or more checksum lines of one algorithm, the last LF optional.
MANIFEST_PATTERN = "^(?:" + "|".join(
    rf"(?:{line_regex(alg)}\n)*{line_regex(alg)}\n?" for alg in MANIFEST_ALGORITHMS) + ")$"
MANIFEST_BODY = named(ref("ManifestBody"), ManifestBody={
    "type": "string", "title": "checksum lines", "pattern": MANIFEST_PATTERN,
    "description": (
        "`sha256sum` or `sha512sum` output: lines of one algorithm, each `<hex>  "
        "<name>`, `<hex> *<name>`, `<hex>` or `SHA256 (<name>) = <hex>` (`SHA512` "
        "for sha512), optionally after a `\\`; lowercase hex; a name without "
        "control characters, not ending in a space; each line ending in LF (the "
        f"last may lack it); at most {MAX_LINE} characters a line. No `#` lines, "
        "no empty lines.")})
SERIAL = re.compile("[0-9]{1,18}")
Serial = Annotated[str, PathParam(), matching(SERIAL)]


def add_manifest_routes(router: APIRouter) -> None:
    # One manifest checked at a time in this process: a check holds the GIL in a thread for
    # seconds (a million lines), and each more at once takes that much more from the event
    # loop (and the stamps it serves).
    check = OneAtATime()
    # One piece of a stored manifest read at a time: the driver copies each MiB read holding
    # the GIL, and 24 readers starting at once had as many threads doing so, the event loop
    # waiting behind them (stalls of 60-195 ms, ``bench.manifest_flood --mode readers``). One
    # thread reads a piece in a few ms: hundreds of MiB a second.
    read_piece = OneAtATime()

    @router.post(
        "/v1/manifests", tags=["digests"], operation_id="stampManifest",
        summary="Stamp a whole sha256sum/sha512sum output with one signature",
        response_class=PlainTextResponse, response_description="the signed manifest",
        openapi_extra={
            # `format` and `key` are one object parameter (form style, exploded: on the wire
            # `?format=...&key=...`), so that JSON Schema can say they agree.
            "parameters": [{
                "name": "keyChoice", "in": "query", "required": False,
                "style": "form", "explode": True,
                "description": "the query parameters `format` and `key` (each at most once), as "
                               "for `POST /v1/stamps`; other query parameters are ignored",
                "schema": {"type": "object", **KEY_CHOICE}}],
            **request_body(*MANIFEST_TYPES, schema=MANIFEST_BODY,
                           example=f"{EXAMPLE_DIGEST['sha256']}  release.tar.gz\n")},
        responses=problems(
            400, 408, 413, 415, 429, 503,
            s400="a body that is not checksum lines of one algorithm (`lines` names the first "
                 f"bad ones), a line longer than {MAX_LINE} characters, an empty body, a body "
                 "that is not UTF-8, or a bad key choice",
            s408="the body did not arrive in time (STAMPD_BODY_TIMEOUT per chunk, plus a second "
                 "per MiB in all)",
            s413="more than STAMPD_MAX_MANIFEST_BYTES bytes or STAMPD_MAX_MANIFEST_LINES lines",
            s429="over the hourly manifest bytes of this client "
                 "(STAMPD_MANIFEST_BYTES_PER_CLIENT_HOUR) or of the server "
                 "(STAMPD_MANIFEST_BYTES_PER_HOUR); Retry-After: when the hour ends",
            s503="more manifest bytes in flight than STAMPD_MANIFEST_BYTES_IN_FLIGHT, its "
                 "checking process ended without an answer, too many stamps waiting, or no "
                 "worker signed in time; try again after Retry-After seconds"))
    async def stamp_manifest(request: Request, s: ServicesDep, client: ClientDep) -> Response:
        """The body is checksum lines of one algorithm (`<hex>  <name>`, `<hex> *<name>`,
        `<hex>`, `SHA256 (<name>) = <hex>`), at most STAMPD_MAX_MANIFEST_BYTES bytes and
        STAMPD_MAX_MANIFEST_LINES lines (docs/manifests.md). The answer is the server's `#`
        header lines and the lines as sent, OpenPGP cleartext-signed (or SSH-signed):
        `gpg --verify` and `sha256sum -c` check it. A bad line is refused (400, naming the line
        numbers) and nothing is recorded."""
        fmt, fingerprint = key_fields({k: request.query_params.getlist(k)
                                       for k in ("format", "key")
                                       if k in request.query_params})
        key = choose_key(s.keys, fmt, fingerprint)
        budgets = s.budgets
        assert budgets is not None
        length = manifest_length(request.scope, s.settings)
        # The bytes in flight first: a request refused for them charges nothing. They are held
        # until the answer has been sent (or has failed).
        give = await budgets.take(s.settings.max_manifest_bytes if length is None else length)
        try:
            body = await read_manifest(request.scope, request.receive, s.settings,
                                       lambda n: budgets.charge(MANIFEST_HOUR, client, n))
            req = await check(manifest_request, body)
            del body
            response = answer(await s.stamper.stamp(req, key), give)
        except RateLimited as e:
            give()
            s.stats.request("manifest", 429)
            return problem_response(429, "Too Many Requests", e.message,
                                    {"Retry-After": str(e.retry_after)})
        except BaseException:
            give()
            raise
        s.stats.request("manifest", 200)
        return response

    @router.get("/v1/manifests/{serial}", tags=["digests"], operation_id="getManifest",
                summary="A signed manifest again", response_class=PlainTextResponse,
                response_description="the signed manifest",
                responses=problems(400, 404, s400="a serial that is not a number",
                                   s404="no signed manifest of that serial"))
    async def get_manifest(s: ServicesDep, serial: Serial) -> Response:
        if not SERIAL.fullmatch(serial):
            raise BadRequest("a serial is a whole number")
        size = await asyncio.to_thread(manifest_size, s.engine, int(serial))
        if size is None:
            raise NotFound(f"no signed manifest {serial}")

        async def pieces() -> AsyncIterator[bytes]:
            # A piece at a time, each read when the last one is sent: a slow reader holds one
            # piece, not the manifest (a signed manifest never changes).
            seq = 0
            while data := await read_piece(manifest_piece, s.engine, int(serial), seq):
                yield data
                seq += 1

        return StreamingResponse(pieces(), media_type="text/plain; charset=utf-8",
                                 headers={"Content-Length": str(size)})
