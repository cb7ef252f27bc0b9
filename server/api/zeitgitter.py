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
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import WithJsonSchema
from python_multipart.multipart import parse_options_header
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from formats.gitobjects import ID_PATTERNS, OBJECT_ID, SHA1, SHA256
from server.api import status
from server.api.body import read_body
from server.api.deps import ServicesDep
from server.api.errors import NOSNIFF, plain, send_plain
from server.api.openapi import (
    KEY_CHOICE,
    MULTIPART,
    TEXT,
    URLENCODED,
    Json,
    errors,
    named,
    ref,
    request_body,
    text,
    whole,
)
from server.api.rfc3161 import TSA_PATH, is_timestamp_query, serve_timestamp
from server.api.services import Services
from server.errors import (
    BadRequest,
    InvalidCommitId,
    InvalidTagName,
    StampError,
    UnknownRequest,
)
from server.runtime.httpproto import respond
from server.settings import Settings
from server.stamping.requests import BranchRequest, GitRequest, TagRequest, choose_key, key_fields

SHA1_ID, SHA256_ID = ID_PATTERNS[SHA1], ID_PATTERNS[SHA256]  # of SHA-1, SHA-256 repositories
TAGNAME = re.compile(r"[_a-zA-Z][-._a-zA-Z0-9]{0,99}")
# The rules of git-check-ref-format that `valid_tagname` adds to TAGNAME, as lookaheads.
TAGNAME_RULES = r"(?!.*\.\.)(?!.*\.$)(?!.*\.lock$)"

STAMP_TAG = "stamp-tag-v1"
STAMP_BRANCH = "stamp-branch-v1"
GET_PUBLIC_KEY = "get-public-key-v1"

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
    Content-Type, and ``POST /tsr`` go to `server.api.rfc3161`), in front of the FastAPI
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


def _form(title: str, request: str, required: Sequence[str], **fields: Json) -> Json:
    """A Zeitgitter form's schema. The server ignores fields it does not know, so that a newer
    client's field does not break it (the body's size limit, STAMPD_MAX_BODY, is answered 413
    and no schema can say)."""
    return {"type": "object", "title": title,
            "properties": {"request": {"type": "string", "const": request}, **fields},
            "required": ["request", *required], "additionalProperties": {"type": "string"},
            "maxProperties": MAX_FIELDS, **KEY_CHOICE}


def _branch(name: str, oid: str) -> Json:
    """stamp-branch-v1 in a repository of ``name`` (one request's ids have one length)."""
    def field(description: str) -> Json:
        return {"type": "string", "pattern": whole(oid), "description": description}

    return _form(f"stamp-branch-v1 ({name})", STAMP_BRANCH, ["commit", "tree"],
                 commit=field(f"the commit to stamp ({name})"),
                 tree=field("the tree of `commit`"),
                 parent=field("the branch's previous stamp; must differ from `commit`"))


FORMS = named(ref("ZeitgitterStamp"),
              ZeitgitterStamp={"oneOf": [ref("TagStamp"), ref("BranchStamp"),
                                         ref("BranchStampSha256")]},
              TagStamp=_form(
                  STAMP_TAG, STAMP_TAG, ["commit", "tagname"],
                  commit={"type": "string", "pattern": whole(OBJECT_ID),
                          "description": "the commit to stamp"},
                  tagname={"type": "string", "pattern": whole(TAGNAME_RULES + TAGNAME.pattern),
                           "maxLength": 100,
                           "description": "the tag's name: git's ref-name rules, no `..`, not "
                                          "ending in `.` or `.lock`"}),
              BranchStamp=_branch("SHA-1", SHA1_ID),
              BranchStampSha256=_branch("SHA-256", SHA256_ID))
# ?request=, as sent (given twice, it is refused)
RootRequest = Annotated[list[str] | None, Query(alias="request"),
                        WithJsonSchema({"type": "string", "enum": [GET_PUBLIC_KEY]})]


class _Root(APIRoute):
    """A route of ``/``, whose 405 answer allows both GET and POST (Starlette's would name
    the methods of the first route of the path only)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in (self.methods or ()):
            raise HTTPException(405, headers={"Allow": "GET, POST"})
        await super().handle(scope, receive, send)


def add_zeitgitter_routes(app: FastAPI) -> None:
    """``GET /``: the public key (``?request=get-public-key-v1``), the status page for a
    browser, or a line about the server; and ``POST /`` for the document (`ZeitgitterPost`
    answers it before the app)."""

    async def root_get(request: Request, s: ServicesDep, requests: RootRequest = None
                       ) -> Response:
        """`?request=get-public-key-v1`: the primary OpenPGP key, ASCII-armored (the key the
        Zeitgitter client pins). Without `request`: a one-line banner, or the status page for
        `Accept: text/html`."""
        if not requests and "text/html" in request.headers.get("accept", ""):
            others = (await s.overview()).others  # (the witnesses' states, reported)
            snap = await asyncio.to_thread(status.snapshot, s, others)
            return HTMLResponse(status.render(s, snap), headers=status.PAGE_HEADERS)
        if not requests:
            return PlainTextResponse(
                f"stampd timestamping server\nkey {s.key.fingerprint} {s.key.uid}\n"
                "Zeitgitter protocol v1: POST request=stamp-tag-v1 | stamp-branch-v1\n"
            )
        if requests != [GET_PUBLIC_KEY]:
            return plain(UnknownRequest("unknown request type"))
        return Response(s.key.public, media_type=PGP_KEYS)

    async def root_post() -> Response:
        raise AssertionError("POST / is served by ZeitgitterPost")

    app.router.add_api_route(
        "/", root_get, methods=["GET"], route_class_override=_Root, tags=["zeitgitter"],
        operation_id="getRoot", summary="The primary public key, or a banner",
        response_class=Response,
        responses={200: {"description": "the key, the banner or the status page", "content": {
            media: {"schema": {"type": "string"}} for media in (PGP_KEYS, TEXT, "text/html")}},
            **errors(TEXT, 406, s406="a `request` other than get-public-key-v1, or `request` "
                                     "given more than once")})
    app.router.add_api_route(
        "/", root_post, methods=["POST"], tags=["zeitgitter"],
        operation_id="stampGit", response_class=Response,
        summary="Stamp a commit: a signed tag (stamp-tag-v1) or merge commit (stamp-branch-v1)",
        description="The Zeitgitter protocol v1 (docs/protocol.md), as the `git timestamp` "
                    "client sends it. Other fields are ignored, within the limit of 16 fields; "
                    "a field given twice is refused. Errors are a short plain-text reason.",
        openapi_extra=request_body(URLENCODED, MULTIPART, schema=FORMS, example={
            "request": STAMP_TAG, "commit": "3" * 40, "tagname": "v1.0-timestamp"}),
        responses={200: text("the signed git object (a tag, or a commit)",
                             media=GIT_OBJECT.decode()),
                   **errors(TEXT, 406, 408, 411, 413, 415, 503)})
