"""The Zeitgitter protocol v1 front end: ``POST /`` (tag and branch stamps) and ``GET /`` (the
public key, or the status page for a browser). docs/protocol.md describes the protocol.

``POST /`` is the hot path: `ZeitgitterPost` serves it as a raw ASGI handler in front of the
FastAPI app. Fields arrive as a mapping of name -> list of values (a field sent twice is an
error, so a client cannot smuggle a second value past the check). Domain errors are answered
here, once, as plain text (`server.api.errors`).
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from python_multipart.multipart import parse_options_header
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api import status
from server.api.body import read_body
from server.api.errors import NOSNIFF, plain, send_plain
from server.api.httpproto import respond
from server.api.services import Services
from server.api.timestamps import TSA_PATH, is_timestamp_query, serve_timestamp
from server.errors import (
    BadRequest,
    InvalidCommitId,
    InvalidTagName,
    StampError,
    UnknownRequest,
)
from server.settings import Settings
from server.stamping.requests import BranchRequest, GitRequest, TagRequest, choose_key, key_fields

OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 repositories
TAGNAME = re.compile(r"[_a-zA-Z][-._a-zA-Z0-9]{0,99}")

STAMP_TAG = "stamp-tag-v1"
STAMP_BRANCH = "stamp-branch-v1"
GET_PUBLIC_KEY = "get-public-key-v1"

URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
GIT_OBJECT = b"application/x-git-object"
PGP_KEYS = "application/pgp-keys"
MAX_FIELDS = 16

Fields = Mapping[str, Sequence[str]]


def _one(fields: Fields, name: str, required: bool = True) -> str | None:
    values = fields.get(name)
    if not values:
        if required:
            raise BadRequest(f"missing field '{name}'")
        return None
    if len(values) > 1:
        raise BadRequest(f"field '{name}' given more than once")
    return values[0]


def _object_id(fields: Fields, name: str, required: bool = True) -> str | None:
    value = _one(fields, name, required)
    if value is None:
        return None
    if not OBJECT_ID.fullmatch(value):
        raise InvalidCommitId(f"field '{name}' must be 40 (SHA-1) or 64 (SHA-256) lowercase "
                              "hex digits")
    return value


def _same_length(**ids: str | None) -> None:
    """All object ids of one request come from one repository: all 40 or all 64 digits."""
    given = {name: oid for name, oid in ids.items() if oid is not None}
    if len({len(oid) for oid in given.values()}) > 1:
        lengths = ", ".join(f"'{name}' has {len(oid)}" for name, oid in given.items())
        raise InvalidCommitId("object ids of one request must all be SHA-1 (40 hex digits) or "
                              f"all SHA-256 (64): {lengths}")


def valid_tagname(name: str) -> bool:
    """Whether ``name`` is in the tag name alphabet and git takes ``refs/tags/<name>`` (the
    rules of git-check-ref-format). Of those rules only three can apply within this alphabet:
    no ``..``, no trailing ``.``, no component ending in ``.lock``. The others cannot: the
    first character is no ``.`` (nor ``-``), and ``/``, ``@``, ``\\``, control characters,
    space and ``~^:?*[`` are outside the alphabet."""
    return (TAGNAME.fullmatch(name) is not None and ".." not in name
            and not name.endswith((".", ".lock")))


def _tagname(fields: Fields) -> str:
    value = _one(fields, "tagname")
    assert value is not None
    if not valid_tagname(value):
        raise InvalidTagName(
            "field 'tagname' must match [_a-zA-Z][-._a-zA-Z0-9]{0,99}, contain no '..' and "
            "not end in '.' or '.lock'"
        )
    return value


def parse_stamp_request(fields: Fields) -> GitRequest:
    """Validate a POSTed form; raise a `BadRequest` subclass on any problem."""
    request = _one(fields, "request")
    if request == STAMP_TAG:
        commit = _object_id(fields, "commit")
        assert commit is not None
        return TagRequest(commit=commit, tagname=_tagname(fields))
    if request == STAMP_BRANCH:
        commit = _object_id(fields, "commit")
        tree = _object_id(fields, "tree")
        assert commit is not None and tree is not None
        parent = _object_id(fields, "parent", required=False)
        _same_length(commit=commit, tree=tree, parent=parent)
        if parent == commit:
            raise BadRequest("'parent' and 'commit' must differ")
        return BranchRequest(commit=commit, tree=tree, parent=parent)
    raise UnknownRequest("unknown request type")


def parse_urlencoded(text: str) -> list[tuple[str, str]]:
    """``urllib.parse.parse_qsl(text, keep_blank_values=True, errors="strict",
    max_num_fields=MAX_FIELDS)``, without its per-field unquoting when nothing is quoted
    (the Zeitgitter client's forms are plain: hex digits, names, ``-``)."""
    if "%" in text or "+" in text:
        return urllib.parse.parse_qsl(text, keep_blank_values=True, errors="strict",
                                      max_num_fields=MAX_FIELDS)
    if text.count("&") >= MAX_FIELDS:
        raise ValueError("Max number of fields exceeded")
    return [(name, value) for name, _, value in
            (field.partition("=") for field in text.split("&") if field)]


def _multipart_complete(scope: Scope, body: bytes) -> bool:
    """Whether a multipart body ends its last part with the close delimiter
    (``--<boundary>--``, RFC 2046 5.1.1). The multipart parser takes a body cut short as
    complete and drops the unterminated part: a branch request whose ``parent`` part was cut
    off would be stamped without its parent."""
    ctype = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    _, params = parse_options_header(ctype)
    boundary = params.get(b"boundary")
    if not boundary:
        return False
    close = b"--" + boundary + b"--"
    return body.startswith(close) or b"\r\n" + close in body


def _replay(body: bytes) -> Receive:
    """A ``receive`` that hands over ``body``, already read, as one message."""

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def read_form(scope: Scope, receive: Receive, settings: Settings) -> Fields:
    """Read and parse a form body within the size and time limits."""
    mtype, body = await read_body(scope, receive, settings, (URLENCODED, MULTIPART))
    fields: dict[str, list[str]] = {}
    if mtype == URLENCODED:
        try:
            pairs = parse_urlencoded(body.decode("ascii"))
        except (UnicodeError, ValueError):
            raise BadRequest("malformed form body") from None
    else:
        if not _multipart_complete(scope, body):
            raise BadRequest("malformed multipart body")
        # Starlette's parser reads the body already held through the request's receive.
        request = Request(scope, _replay(body))
        try:
            form = await request.form(max_files=0, max_fields=MAX_FIELDS)
        except Exception:
            raise BadRequest("malformed multipart body") from None
        pairs = []
        for name, value in form.multi_items():
            if not isinstance(value, str):
                raise BadRequest("file uploads are not accepted")
            pairs.append((name, value))
    for name, value in pairs:
        fields.setdefault(name, []).append(value)
    return fields


def _nosniff(send: Send) -> Send:
    """``send`` adding ``X-Content-Type-Options: nosniff`` to every response: no browser
    guesses a type other than the one sent (an error body that echoes a submitted value stays
    text)."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(name.lower() == NOSNIFF[0] for name, _ in headers):
                headers.append(NOSNIFF)
            message = {**message, "headers": headers}
        await send(message)

    return wrapped


def _headless(send: Send) -> Send:
    """``send`` leaving out the body (HEAD): the headers, Content-Length among them, are
    GET's."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return wrapped


class ZeitgitterPost:
    """Raw ASGI handler for ``POST /`` (the hot path; RFC 3161 requests, told apart by their
    Content-Type, and ``POST /tsr`` go to `server.api.timestamps`), in front of the FastAPI
    app; every HTTP response, its own and the app's, gets ``X-Content-Type-Options:
    nosniff``."""

    def __init__(self, app: ASGIApp, services: Callable[[], Services]) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "HEAD":  # GET's answer without its body (RFC 9110 §9.3.2)
            await self.app({**scope, "method": "GET"}, receive, _headless(_nosniff(send)))
            return
        if scope["method"] != "POST" or scope["path"] not in ("/", TSA_PATH):
            await self.app(scope, receive, _nosniff(send))
            return
        # The hot path sends its own headers, nosniff among them (no wrapper per request).
        s = self.services()
        if scope["path"] == TSA_PATH or is_timestamp_query(scope):
            await serve_timestamp(scope, receive, send, s)
            return
        kind = "invalid"
        try:
            fields = await read_form(scope, receive, s.settings)
            req = parse_stamp_request(fields)
            kind = req.kind
            key = choose_key(s.keys, *key_fields(fields))
            text = (await s.stamper.stamp(req, key)).encode("ascii")
        except StampError as e:
            s.stats.request(kind, await send_plain(scope, send, e))
            return
        s.stats.request(kind, 200)
        await respond(scope, send, 200, [(b"content-type", GIT_OBJECT), NOSNIFF], text)


def add_zeitgitter_routes(app: FastAPI, services: Callable[[], Services]) -> None:
    """``GET /``: the public key (``?request=get-public-key-v1``), the status page for a
    browser, or a line about the server."""

    # POST / never reaches the app (ZeitgitterPost answers it first); it is named here so that
    # the Allow header of a 405 answer for / lists it.
    @app.api_route("/", methods=["GET", "POST"])
    async def root_get(request: Request) -> Response:
        if request.method != "GET":
            raise AssertionError("POST / is served by ZeitgitterPost")
        s = services()
        requests = request.query_params.getlist("request")
        if not requests and "text/html" in request.headers.get("accept", ""):
            snap = await asyncio.to_thread(status.snapshot, s)
            return HTMLResponse(status.render(s, snap), headers=status.PAGE_HEADERS)
        if not requests:
            return PlainTextResponse(
                f"stampd timestamping server\nkey {s.key.fingerprint} {s.key.uid}\n"
                "Zeitgitter protocol v1: POST request=stamp-tag-v1 | stamp-branch-v1\n"
            )
        if requests != [GET_PUBLIC_KEY]:
            return plain(UnknownRequest("unknown request type"))
        return Response(s.key.public, media_type=PGP_KEYS)
