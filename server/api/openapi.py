"""The API's own description: ``GET /openapi.json`` (OpenAPI 3.1) and ``GET /docs`` (Swagger UI).

FastAPI generates the document from the routes: their parameters (each documented with the
pattern the route itself checks it against, `matching`), their answers (``responses=``, the
error sets of `errors`, and the typed JSON answers as ``response_model``), tags, summaries and
descriptions. The routes check their inputs themselves, so that every refusal is theirs (plain
text for the Zeitgitter protocol, problem+json on ``/v1``), never FastAPI's 422; FastAPI's
422 answers are therefore taken out of the document.

Written by hand, beside the route each belongs to, with ``openapi_extra``: the bodies that the
routes read themselves (the Zeitgitter forms of the raw ASGI ``POST /``, RFC 3161 queries, digest
stamps, manifests, witness requests). Their named schemas go in a ``$defs`` next to where they
are used and are moved into ``components`` here. The key choice (``format``, ``key``) lists what
this server serves: the schemas that take it carry `KEY_CHOICE`, filled in here from the served
keys when the document is first asked for.

tests/system/test_openapi.py keeps the document true: it fuzzes every operation of the live
server against it and fails on any answer it does not describe.

Swagger UI comes from the fastapi-offline package's copy of ``swagger-ui-dist`` and is served
from this server, with a Content-Security-Policy that lets the page load nothing from another
host and run no inline script (its start-up script is a file, `INIT_JS`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import importlib.resources
import re
from collections.abc import Callable, Iterator, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import TypeAdapter, WithJsonSchema

from formats.keys import STAMPS, ServedKey
from formats.receipts import ALGORITHMS
from server.api.deps import ServicesDep
from server.api.errors import PROBLEM, TIMESTAMP_REPLY, Problem

Json = dict[str, Any]
Responses = dict[int | str, Json]
TEXT = "text/plain"
URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
# Examples: the digests of "hello\n" (stamped by the examples of POST /v1/stamps, fetched by
# those of the GET operations).
EXAMPLE_DIGEST = {alg: hashlib.new(alg, b"hello\n").hexdigest() for alg in ALGORITHMS}
# An object schema that takes the key choice (`format`, `key`): filled from the served keys.
KEY_CHOICE_MARK = "x-stampd-key-choice"
KEY_CHOICE: Json = {KEY_CHOICE_MARK: True}

DESCRIPTION = (
    "A timestamping server for git (the Zeitgitter protocol v1) and for plain sha256/sha512 "
    "digests. Every stamp is recorded durably before it is signed and published in a public "
    "git log, which `git clone <server>/log.git` fetches (git's dumb HTTP protocol; not "
    "described here). A browser asking for `/` gets the status page.")
TAGS = [
    {"name": "zeitgitter", "description": "git stamps (docs/protocol.md)"},
    {"name": "digests", "description": "digest receipts (docs/receipts.md); errors "
                                       "are application/problem+json"},
    {"name": "keys", "description": "the signing keys"},
    {"name": "rfc3161", "description": "RFC 3161 time-stamping (docs/tsa.md)"},
    {"name": "tlog", "description": "the transparency log: C2SP tlog-tiles, "
                                    "checkpoints and proofs (docs/transparency.md)"},
    {"name": "witness", "description": "this server as a witness of other logs: "
                                       "C2SP tlog-witness (docs/witness.md)"},
    {"name": "operations", "description": "health and metrics"},
]


# -- what the routes use to describe themselves -----------------------------------------------

def ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def named(schema: Json, **definitions: Json) -> Json:
    """``schema`` (which refers to ``definitions`` by `ref`), with the definitions that go
    into the document's components."""
    return {**schema, "$defs": definitions}


def whole(regex: re.Pattern[str] | str) -> str:
    """A JSON Schema pattern that matches what ``regex.fullmatch`` does."""
    return f"^(?:{regex if isinstance(regex, str) else regex.pattern})$"


def matching(regex: re.Pattern[str]) -> WithJsonSchema:
    """A string parameter documented as matching ``regex``: the pattern the route checks it
    against (in its own words), not one FastAPI would check (and answer 422 for)."""
    return WithJsonSchema({"type": "string", "pattern": whole(regex)})


def text(description: str, example: str | None = None, media: str = TEXT) -> Json:
    """An answer whose body is text."""
    content: Json = {"schema": {"type": "string"}}
    if example is not None:
        content["example"] = example
    return {"description": description, "content": {media: content}}


def request_body(*media: str, schema: Json, example: Any = None) -> Json:
    """``openapi_extra`` of an operation that reads its body itself: the body's schema in each
    of ``media``."""
    content: Json = {"schema": schema}
    if example is not None:
        content["example"] = example
    return {"requestBody": {"required": True, "content": {m: content for m in media}}}


RETRY_AFTER = {"description": "seconds to wait before trying again", "required": True,
               "schema": {"type": "string", "pattern": "^[0-9]+$"}}
_WHY = {
    400: "a malformed, unknown or repeated field or parameter, a bad digest, or a bad key choice",
    404: "not found",
    406: "a field is missing, malformed or given twice; unknown `request`; a file upload",
    408: "the body did not arrive within STAMPD_BODY_TIMEOUT seconds",
    411: "no Content-Length (chunked bodies are not accepted)",
    413: "the body is larger than STAMPD_MAX_BODY bytes (1000 by default)",
    415: "a media type the operation does not take",
    429: "over an hourly budget of this client or of the server; try again after Retry-After "
         "seconds",
    503: "too many stamps waiting, no worker signed in time, or the database is unavailable; "
         "try again after Retry-After seconds",
}
_PROBLEM = named(ref("Problem"), Problem=TypeAdapter(Problem).json_schema())


def errors(media: str, *codes: int, **reasons: str) -> Responses:
    """The error answers ``codes`` of one front end, as ``responses=``: problem+json (``/v1``),
    plain text (the Zeitgitter protocol, whose clients show the reason as it is) or a
    TimeStampResp (RFC 3161). ``reasons`` replace the usual one of a status
    (``s404="..."``); 429 and 503 carry Retry-After."""
    why = _WHY | {int(k.removeprefix("s")): v for k, v in reasons.items()}
    out: Responses = {}
    for code in codes:
        content: Json = {"schema": {"type": "string"}}
        if media == PROBLEM:
            content = {"schema": _PROBLEM, "example": {
                "type": "about:blank", "title": HTTPStatus(code).phrase, "status": code,
                "detail": why[code]}}
        elif media == TIMESTAMP_REPLY.decode():
            content = {"schema": {"type": "string", "format": "binary"}}
        out[code] = {"description": why[code], "content": {media: content}}
        if code in (429, 503):
            out[code]["headers"] = {"Retry-After": RETRY_AFTER}
    return out


def problems(*codes: int, **reasons: str) -> Responses:
    """The ``/v1`` error answers ``codes`` (`errors`)."""
    return errors(PROBLEM, *codes, **reasons)


# -- the document -----------------------------------------------------------------------------

def _key_choice(keys: Sequence[ServedKey]) -> tuple[Json, Json]:
    """The properties ``format`` and ``key`` of a stamp request, and the constraint that
    they agree when both are given (on a server with keys of more than one format). Only keys
    that sign stamps: the TSA key signs RFC 3161 tokens only, and naming it is refused."""
    keys = [k for k in keys if k.purpose == STAMPS]
    by_format: dict[str, list[str]] = {}
    for k in keys:
        by_format.setdefault(k.format, []).append(k.fingerprint)
    properties = {
        "format": {"type": "string", "enum": sorted(by_format),
                   "description": "sign with this server's first key of this format "
                                  "(default: its primary key)"},
        "key": {"type": "string", "enum": [k.fingerprint for k in keys],
                "description": "sign with the key of this fingerprint (OpenPGP fingerprints "
                               "in any case); with `format`, the two must agree; not the "
                               "TSA key, which signs RFC 3161 tokens only"},
    }
    if len(by_format) < 2:
        return properties, {}
    return properties, {"anyOf": [
        {"properties": {"format": {"const": fmt}, "key": {"enum": fingerprints}}}
        for fmt, fingerprints in sorted(by_format.items())
    ]}


def _objects(node: Any) -> Iterator[Json]:
    """Every JSON object in ``node``, depth first."""
    if isinstance(node, dict):
        yield node
        for value in list(node.values()):
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


def openapi_document(app: FastAPI, keys: Sequence[ServedKey]) -> Json:
    """The OpenAPI 3.1 description of ``app``'s routes, on a server that serves ``keys``."""
    doc = copy.deepcopy(get_openapi(  # (a copy: it shares objects with the routes)
        title="stampd", version=importlib.metadata.version("stampd"), description=DESCRIPTION,
        tags=TAGS, routes=app.routes))
    schemas: Json = doc.setdefault("components", {}).setdefault("schemas", {})
    for op in (op for ops in doc["paths"].values() for op in ops.values()):
        if op["responses"].get("422", {}).get("description") == "Validation Error":
            del op["responses"]["422"]  # FastAPI's; the routes check their own inputs
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for obj in list(_objects(doc)):
        schemas.update(obj.pop("$defs", {}))
    choice, agree = _key_choice(keys)
    for obj in _objects(doc):
        if obj.pop(KEY_CHOICE_MARK, False):
            obj.setdefault("properties", {}).update(choice)
            obj.update(agree)
    return doc


# -- serving it, and Swagger UI ---------------------------------------------------------------

SWAGGER_DIR = Path(str(importlib.resources.files("fastapi_offline") / "static"))
ASSETS = {  # path under /docs/ -> (file of the fastapi-offline package, media type)
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "favicon.png": ("favicon.png", "image/png"),
}
INIT_JS = """\
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
"""
DOCS_HTML = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>stampd API</title>
<link rel="icon" type="image/png" href="/docs/favicon.png">
<link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
"""
# Swagger UI needs: its script and style files, images inlined as data: URIs in its style
# sheet, and fetch() to this server ("Try it out"). Nothing inline, nothing from elsewhere.
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
DOCS_HEADERS = {"Content-Security-Policy": DOCS_CSP, "X-Frame-Options": "DENY",
                "Referrer-Policy": "no-referrer"}
ASSET_CACHE = "public, max-age=3600"


def add_docs_routes(app: FastAPI) -> None:
    """``GET /openapi.json``, ``GET /docs`` and the files of Swagger UI under ``/docs/``."""
    cache: list[Json] = []

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(s: ServicesDep) -> Response:
        if not cache:
            cache.append(openapi_document(app, s.keys))
        return JSONResponse(cache[0])

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return HTMLResponse(DOCS_HTML, headers=DOCS_HEADERS)

    @app.get("/docs/init.js", include_in_schema=False)
    async def init_js() -> Response:
        return Response(INIT_JS, media_type="text/javascript; charset=utf-8",
                        headers={"Cache-Control": ASSET_CACHE})

    for name, (file, media_type) in ASSETS.items():

        def serve(file: str = file, media_type: str = media_type) -> Callable[[], Any]:
            async def asset() -> Response:
                return FileResponse(SWAGGER_DIR / file, media_type=media_type,
                                    headers={"Cache-Control": ASSET_CACHE})
            return asset

        app.add_api_route(f"/docs/{name}", serve(), methods=["GET"], include_in_schema=False)
