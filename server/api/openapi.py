"""The API's own description: ``GET /openapi.json`` (OpenAPI 3.1) and ``GET /docs`` (Swagger UI).

The description is written here by hand rather than derived from the route signatures: the hot
path ``POST /`` is a raw ASGI handler that FastAPI never sees, and the ``/v1`` handlers parse
their bodies and queries themselves (so that every error is theirs, as problem+json, not
FastAPI's 422). tests/system/test_openapi.py keeps it true: it fuzzes every operation of the
live server against this document and fails on any answer the document does not describe.

The key choice fields (``format``, ``key``) list what this server serves, so the document is
built from the served keys when it is first asked for.

Swagger UI comes from the fastapi-offline package's copy of ``swagger-ui-dist`` and is served
from this server, with a Content-Security-Policy that lets the page load nothing from another
host and run no inline script (its start-up script is a file, `INIT_JS`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
from collections.abc import Callable, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response

from formats.keys import STAMPS, ServedKey
from formats.manifests import ALGORITHMS as MANIFEST_ALGORITHMS
from formats.manifests import MAX_LINE, line_regex
from formats.receipts import ALGORITHMS
from server.api.services import Services
from server.api.stamps import PAGE_MAX

Json = dict[str, Any]

# -- the document -----------------------------------------------------------------------------

# Object ids of SHA-1 and SHA-256 repositories; one request's ids all have one length.
HEX40 = "^[0-9a-f]{40}$"
HEX64 = "^[0-9a-f]{64}$"
OBJECT_ID = "^([0-9a-f]{40}|[0-9a-f]{64})$"
# git's ref-name rules for refs/tags/<tagname>, as server.api.zeitgitter.valid_tagname checks.
TAGNAME = r"^(?!.*\.\.)(?!.*\.$)(?!.*\.lock$)[_a-zA-Z][-._a-zA-Z0-9]{0,99}$"
WS = r"[ \t\r\n]*"  # a digest may be surrounded by these; they are removed
PROBLEM = "application/problem+json"
TEXT = "text/plain"
URLENCODED = "application/x-www-form-urlencoded"
TSQ = "application/timestamp-query"
TSR = "application/timestamp-reply"
# A manifest body: one or more checksum lines of one algorithm, the last LF optional.
MANIFEST_PATTERN = "^(?:" + "|".join(
    rf"(?:{line_regex(alg)}\n)*{line_regex(alg)}\n?" for alg in MANIFEST_ALGORITHMS) + ")$"
# Examples: the digests of "hello\n" (stamped by the examples of POST /v1/stamps, fetched by
# those of the GET operations).
EXAMPLE_DIGEST = {alg: hashlib.new(alg, b"hello\n").hexdigest() for alg in ALGORITHMS}


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _text(description: str, example: str | None = None) -> Json:
    media: Json = {"schema": {"type": "string"}}
    if example is not None:
        media["example"] = example
    return {"description": description, "content": {TEXT: media}}


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again",
                               "required": True,
                               "schema": {"type": "string", "pattern": "^[0-9]+$"}}}


PROOF_HEADERS = {
    "X-Stampd-Serial": {"description": "the stamp's serial", "schema": {"type": "string"}},
    "X-Stampd-Log-Index": {"description": "its entry's index", "schema": {"type": "string"}},
}
PROOF_404 = ("no such stamp, a stamp that failed, or one not yet covered by a checkpoint "
             "(then with Retry-After)")


def _proof_operation(operation_id: str, summary: str, description: str, path: Json,
                     s400: str) -> Json:
    """A ``/v1/proofs`` operation: its path parameter, ``wait``, and the answers they share."""
    return {
        "tags": ["tlog"], "operationId": operation_id, "summary": summary,
        "description": description,
        "parameters": [
            path,
            {"name": "wait", "in": "query", "required": False,
             "description": "seconds (0 to 60) to wait until a checkpoint covers it (the "
                            "answer comes as soon as one does)",
             "schema": {"type": "string"}}],
        "responses": {
            "200": {**_text("the proof"), "headers": PROOF_HEADERS},
            **_errors(PROBLEM, [400, 503], s400=s400,
                      s503="as many proof requests wait already as this server lets wait "
                           "(in all, or from this client), or the server is stopping; try "
                           "again after Retry-After seconds"),
            "404": {**_errors(PROBLEM, [404], s404=PROOF_404)["404"],
                    "headers": {"Retry-After": {**RETRY_AFTER["Retry-After"],
                                                "required": False}}},
        },
    }


def _errors(media: str, codes: Sequence[int], **reasons: str) -> dict[str, Json]:
    """The error answers ``codes`` of one front end: problem+json (``/v1``) or plain text
    (the Zeitgitter protocol, whose clients show the reason as it is). ``reasons`` replace
    the usual one of a status (``s404="..."``)."""
    why = {
        400: "a malformed, unknown or repeated field or parameter, a bad digest, or a bad "
             "key choice",
        406: "a field is missing, malformed or given twice; unknown `request`; a file upload",
        408: "the body did not arrive within STAMPD_BODY_TIMEOUT seconds",
        411: "no Content-Length (chunked bodies are not accepted)",
        413: "the body is larger than STAMPD_MAX_BODY bytes (1000 by default)",
        415: "a media type the operation does not take",
        429: "over an hourly budget of this client or of the server; try again after "
             "Retry-After seconds",
        503: "too many stamps waiting, no worker signed in time, or the database is "
             "unavailable; try again after Retry-After seconds",
    }
    why.update({int(k.removeprefix("s")): v for k, v in reasons.items()})
    out: dict[str, Json] = {}
    for code in codes:
        if media == PROBLEM:
            content = {"schema": _ref("Problem"), "example": {
                "type": "about:blank", "title": HTTPStatus(code).phrase, "status": code,
                "detail": why[code]}}
        else:
            content = {"schema": {"type": "string"}}
        answer: Json = {"description": why[code], "content": {media: content}}
        if code in (429, 503):
            answer["headers"] = RETRY_AFTER
        out[str(code)] = answer
    return out


def _key_choice(keys: Sequence[ServedKey]) -> tuple[dict[str, Json], Json]:
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


def _schemas(keys: Sequence[ServedKey]) -> dict[str, Json]:
    choice, agree = _key_choice(keys)
    digest = {
        alg: {"type": "string", "pattern": f"^{WS}[0-9a-f]{{{n}}}{WS}$",
              "description": f"the {alg} digest: {n} lowercase hex digits (surrounding "
                             "spaces, tabs, CR and LF are removed)"}
        for alg, n in ALGORITHMS.items()
    }
    stamp_digest = {
        f"Stamp{alg.upper()}": {
            "type": "object", "title": f"a {alg} digest",
            "properties": {alg: digest[alg], **choice},
            "required": [alg], "additionalProperties": False, **agree,
        } for alg in ALGORITHMS
    }
    # The server ignores fields it does not know, so that a newer client's field does not
    # break it (the body's size limit, STAMPD_MAX_BODY, is answered 413 and no schema can say).
    zeitgitter_extra = {"additionalProperties": {"type": "string"}, "maxProperties": 16,
                        **agree}
    return {
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details",
            "properties": {
                "type": {"type": "string", "const": "about:blank"},
                "title": {"type": "string", "description": "the HTTP reason phrase"},
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "detail": {"type": "string", "description": "what was wrong"},
                "lines": {"type": "array", "items": {"type": "integer", "minimum": 1},
                          "maxItems": 20,
                          "description": "POST /v1/manifests: the first bad line numbers"},
                "bad_lines": {"type": "integer", "minimum": 1,
                              "description": "POST /v1/manifests: how many lines are bad"},
            },
            "required": ["type", "title", "status", "detail"],
            "additionalProperties": False,
        },
        **stamp_digest,
        "StampDigest": {"oneOf": [_ref(f"Stamp{alg.upper()}") for alg in ALGORITHMS]},
        "Receipt": {
            "type": "object",
            "description": "a receipt and the fields of its signed statement "
                           "(docs/receipts.md)",
            "properties": {
                "algorithm": {"type": "string", "enum": list(ALGORITHMS)},
                "digest": {"type": "string", "pattern": "^([0-9a-f]{64}|[0-9a-f]{128})$"},
                "time": {"type": "integer", "minimum": 0,
                         "description": "Unix seconds, when the request was journaled"},
                "utc": {"type": "string",
                        "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"},
                "server": {"type": "string", "pattern": "^[!-~]{1,500}$"},
                "serial": {"type": "integer", "minimum": 1},
                "key": {"type": "string",
                        "pattern": "^([0-9A-F]{40}|SHA256:[A-Za-z0-9+/]{43})$"},
                "receipt": {"type": "string",
                            "description": "the signed receipt, as the text/plain answer"},
            },
            "required": ["algorithm", "digest", "time", "utc", "server", "serial", "key",
                         "receipt"],
            "additionalProperties": False,
        },
        "ReceiptPage": {
            "type": "object",
            "properties": {
                "receipts": {"type": "array", "items": _ref("Receipt"),
                             "maxItems": PAGE_MAX},
                "manifests": {
                    "type": "array", "maxItems": PAGE_MAX,
                    "description": "signed manifests that cover the digest (present only "
                                   "when there are some); receipts and manifests of a page "
                                   "are the first `limit` by serial",
                    "items": {"type": "object", "additionalProperties": False,
                              "required": ["serial", "time", "algorithm", "key", "url"],
                              "properties": {
                                  "serial": {"type": "integer", "minimum": 1},
                                  "time": {"type": "integer", "minimum": 0},
                                  "algorithm": {"type": "string",
                                                "enum": ["sha256", "sha512"]},
                                  "key": {"type": "string"},
                                  "url": {"type": "string",
                                          "pattern": "^/v1/manifests/[0-9]+$"}}}},
                "next": {"type": ["string", "null"],
                         "description": "the URL of the next page; null on the last"},
            },
            "required": ["receipts", "next"],
            "additionalProperties": False,
        },
        "Key": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "format": {"type": "string", "enum": ["openpgp", "ssh"]},
                "fingerprint": {"type": "string"},
                "algorithm": {"type": "string"},
                "primary": {"type": "boolean"},
                "purpose": {"type": "string", "enum": ["stamps", "rfc3161", "tlog"],
                            "description": "what the key signs: stamps; RFC 3161 "
                                           "time-stamp tokens only (the TSA key); or the "
                                           "transparency log's checkpoints only (the log "
                                           "key). key= chooses neither of the last two"},
                "public_key": {"type": "string",
                               "description": "ASCII-armored OpenPGP key or OpenSSH public "
                                              "key line"},
                "allowed_signers": {"type": ["string", "null"],
                                    "description": "SSH keys: the allowed-signers line "
                                                   "(namespaces git and stampd)"},
            },
            "required": ["id", "format", "fingerprint", "algorithm", "primary", "purpose",
                         "public_key", "allowed_signers"],
            "additionalProperties": False,
        },
        "Keys": {
            "type": "object",
            "properties": {"keys": {"type": "array", "items": _ref("Key"), "minItems": 1}},
            "required": ["keys"],
            "additionalProperties": False,
        },
        "Readiness": {
            "type": "object",
            "properties": {
                "ready": {"type": "boolean"},
                "checks": {
                    "type": "object",
                    "description": "each check by name: database, workers, key:<id>, log, "
                                   "peer:<name>",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"ok": {"type": "boolean"},
                                       "detail": {"type": "string"}},
                        "required": ["ok"],
                    },
                },
                "witnesses": {
                    "type": "object",
                    "description": "each witness of the transparency log by name, where some "
                                   "are configured: information, never a check",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "ok": {"type": "boolean"}, "detail": {"type": "string"},
                            "url": {"type": "string"},
                            "cosigned_size": {"type": ["integer", "null"]},
                            "lag": {"type": ["integer", "null"]},
                            "last_cosigned_at": {"type": ["number", "null"]},
                            "errors": {"type": "integer"},
                            "consecutive_errors": {"type": "integer"},
                            "last_error": {"type": ["string", "null"]},
                        },
                        "required": ["ok"],
                    },
                },
            },
            "required": ["ready", "checks"],
        },
        "TagStamp": {
            "type": "object", "title": "stamp-tag-v1",
            "properties": {
                "request": {"type": "string", "const": "stamp-tag-v1"},
                "commit": {"type": "string", "pattern": OBJECT_ID,
                           "description": "the commit to stamp"},
                "tagname": {"type": "string", "pattern": TAGNAME, "maxLength": 100,
                            "description": "the tag's name: git's ref-name rules, no `..`, "
                                           "not ending in `.` or `.lock`"},
                **choice,
            },
            "required": ["request", "commit", "tagname"],
            **zeitgitter_extra,
        },
        # One request's ids have one length: a SHA-1 and a SHA-256 variant.
        **{f"BranchStamp{suffix}": {
            "type": "object", "title": f"stamp-branch-v1 ({name})",
            "properties": {
                "request": {"type": "string", "const": "stamp-branch-v1"},
                "commit": {"type": "string", "pattern": pattern,
                           "description": f"the commit to stamp ({name})"},
                "tree": {"type": "string", "pattern": pattern,
                         "description": "the tree of `commit`"},
                "parent": {"type": "string", "pattern": pattern,
                           "description": "the branch's previous stamp; must differ from "
                                          "`commit`"},
                **choice,
            },
            "required": ["request", "commit", "tree"],
            **zeitgitter_extra,
        } for suffix, name, pattern in (("", "SHA-1", HEX40), ("Sha256", "SHA-256", HEX64))},
        "ZeitgitterStamp": {"oneOf": [_ref("TagStamp"), _ref("BranchStamp"),
                                      _ref("BranchStampSha256")]},
        "ManifestBody": {
            "type": "string", "title": "checksum lines", "pattern": MANIFEST_PATTERN,
            "description": (
                "`sha256sum` or `sha512sum` output: lines of one algorithm, each `<hex>  "
                "<name>`, `<hex> *<name>`, `<hex>` or `SHA256 (<name>) = <hex>` (`SHA512` "
                "for sha512), optionally after a `\\`; lowercase hex; a name without "
                "control characters, not ending in a space; each line ending in LF (the "
                f"last may lack it); at most {MAX_LINE} characters a line. No `#` lines, "
                "no empty lines."),
        },
    }


def _receipts_path(algorithm: str, n: int) -> Json:
    return {"get": {
        "tags": ["digests"],
        "operationId": f"getReceipts{algorithm.upper()}",
        "summary": f"The receipts issued for a {algorithm} digest",
        "description": (
            "Oldest first, a page at a time: at most `limit` receipts with a serial above "
            "`after`. While more follow, a `Link: <...>; rel=\"next\"` header (and `next` "
            "in JSON) names the next page. The text answer is the receipts concatenated; "
            "with `Accept: application/json`, a JSON page."),
        "parameters": [
            {"name": "digest", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": f"^[0-9a-f]{{{n}}}$"},
             "description": f"{n} lowercase hex digits", "example": EXAMPLE_DIGEST[algorithm]},
            {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": PAGE_MAX,
                        "default": PAGE_MAX}},
            {"name": "after", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "default": 0},
             "description": "a receipt's serial: the page starts after it"},
        ],
        "responses": {
            "200": {
                "description": "the receipts",
                "headers": {"Link": {
                    "description": "the next page, while there is one",
                    "schema": {"type": "string",
                               "pattern": f'^</v1/stamps/{algorithm}/[0-9a-f]{{{n}}}'
                                          r'\?limit=[0-9]+&after=[0-9]+>; rel="next"$'}}},
                "content": {
                    TEXT: {"schema": {"type": "string"}},
                    "application/json": {"schema": _ref("ReceiptPage")},
                },
            },
            **_errors(PROBLEM, [400, 404], s404="no receipt for this digest (after `after`)"),
        },
    }}


def openapi_document(keys: Sequence[ServedKey]) -> Json:
    """The OpenAPI 3.1 description of the HTTP API of a server that serves ``keys``."""
    version = importlib.metadata.version("stampd")
    choice, agree = _key_choice(keys)
    zeitgitter_post = {
        "tags": ["zeitgitter"],
        "operationId": "stampGit",
        "summary": "Stamp a commit: a signed tag (stamp-tag-v1) or merge commit "
                   "(stamp-branch-v1)",
        "description": (
            "The Zeitgitter protocol v1 (docs/protocol.md), as the `git timestamp` client "
            "sends it. Other fields are ignored, within the limit of 16 fields; a field "
            "given twice is refused. Errors are a short plain-text reason."),
        "requestBody": {"required": True, "content": {
            media: {"schema": _ref("ZeitgitterStamp"), "example": {
                "request": "stamp-tag-v1", "commit": "3" * 40, "tagname": "v1.0-timestamp"}}
            for media in (URLENCODED, "multipart/form-data")
        }},
        "responses": {
            "200": {"description": "the signed git object (a tag, or a commit)",
                    "content": {"application/x-git-object": {"schema": {"type": "string"}}}},
            **_errors(TEXT, [406, 408, 411, 413, 415, 503]),
        },
    }
    binary: Json = {"schema": {"type": "string", "format": "binary"}}
    tsa_post = {
        "tags": ["rfc3161"],
        "operationId": "timestamp",
        "summary": "An RFC 3161 time-stamp token for a TimeStampReq",
        "description": (
            "RFC 3161 over HTTP (docs/tsa.md); `POST /` with this Content-Type is the same. "
            "A request the TSA refuses is answered 200 with a TimeStampResp of status "
            "`rejection` and nothing is recorded; HTTP errors carry a TimeStampResp too."),
        "requestBody": {"required": True, "content": {TSQ: binary}},
        "responses": {
            "200": {"description": "a TimeStampResp: granted with the token, or rejection",
                    "content": {TSR: binary}},
            **_errors(TSR, [404, 408, 411, 413, 415, 503],
                      s404="RFC 3161 is off on this server (STAMPD_TSA=false)",
                      s415="a Content-Type other than application/timestamp-query"),
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "stampd",
            "version": version,
            "description": (
                "A timestamping server for git (the Zeitgitter protocol v1) and for plain "
                "sha256/sha512 digests. Every stamp is recorded durably before it is signed "
                "and published in a public git log, which `git clone <server>/log.git` "
                "fetches (git's dumb HTTP protocol; not described here). A browser asking "
                "for `/` gets the status page."),
        },
        "tags": [
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
        ],
        "paths": {
            "/": {
                "get": {
                    "tags": ["zeitgitter"],
                    "operationId": "getRoot",
                    "summary": "The primary public key, or a banner",
                    "description": (
                        "`?request=get-public-key-v1`: the primary OpenPGP key, "
                        "ASCII-armored (the key the Zeitgitter client pins). Without "
                        "`request`: a one-line banner, or the status page for "
                        "`Accept: text/html`."),
                    "parameters": [{"name": "request", "in": "query", "required": False,
                                    "schema": {"type": "string",
                                               "enum": ["get-public-key-v1"]}}],
                    "responses": {
                        "200": {"description": "the key, the banner or the status page",
                                "content": {"application/pgp-keys": {"schema":
                                                                     {"type": "string"}},
                                            TEXT: {"schema": {"type": "string"}},
                                            "text/html": {"schema": {"type": "string"}}}},
                        **_errors(TEXT, [406], s406="a `request` other than "
                                  "get-public-key-v1, or `request` given more than once"),
                    },
                },
                "post": zeitgitter_post,
            },
            "/v1/stamps": {"post": {
                "tags": ["digests"],
                "operationId": "stampDigest",
                "summary": "Stamp a sha256 or sha512 digest",
                "description": (
                    "Exactly one digest field, and optionally the key choice. The answer "
                    "is sent only after the receipt is stored, so the GET operations find "
                    "it from then on. The receipt is an OpenPGP cleartext-signed (or SSH "
                    "signed) statement; with `Accept: application/json`, a JSON object of "
                    "its fields and the receipt."),
                "requestBody": {"required": True, "content": {
                    media: {"schema": _ref("StampDigest"),
                            "example": {"sha256": EXAMPLE_DIGEST["sha256"]}}
                    for media in (URLENCODED, "application/json")
                }},
                "responses": {
                    "200": {"description": "the receipt",
                            "content": {TEXT: {"schema": {"type": "string"}},
                                        "application/json": {"schema": _ref("Receipt")}}},
                    **_errors(PROBLEM, [400, 408, 411, 413, 415, 503]),
                },
            }},
            **{f"/v1/stamps/{alg}/{{digest}}": _receipts_path(alg, n)
               for alg, n in ALGORITHMS.items()},
            "/v1/manifests": {"post": {
                "tags": ["digests"],
                "operationId": "stampManifest",
                "summary": "Stamp a whole sha256sum/sha512sum output with one signature",
                "description": (
                    "The body is checksum lines of one algorithm (`<hex>  <name>`, "
                    "`<hex> *<name>`, `<hex>`, `SHA256 (<name>) = <hex>`), at most "
                    "STAMPD_MAX_MANIFEST_BYTES bytes and STAMPD_MAX_MANIFEST_LINES lines "
                    "(docs/manifests.md). The answer is the server's `#` header lines and "
                    "the lines as sent, OpenPGP cleartext-signed (or SSH-signed): "
                    "`gpg --verify` and `sha256sum -c` check it. A bad line is refused "
                    "(400, naming the line numbers) and nothing is recorded."),
                # `format` and `key` are one object parameter (form style, exploded: on the
                # wire `?format=...&key=...`), so that JSON Schema can say they agree.
                "parameters": [{
                    "name": "keyChoice", "in": "query", "required": False,
                    "style": "form", "explode": True,
                    "description": "the query parameters `format` and `key` (each at most "
                                   "once), as for `POST /v1/stamps`; other query parameters "
                                   "are ignored",
                    "schema": {"type": "object", "properties": choice, **agree}}],
                "requestBody": {"required": True, "content": {
                    media: {"schema": _ref("ManifestBody"),
                            "example": f"{EXAMPLE_DIGEST['sha256']}  release.tar.gz\n"}
                    for media in (URLENCODED, TEXT, "application/octet-stream")}},
                "responses": {
                    "200": {"description": "the signed manifest",
                            "content": {TEXT: {"schema": {"type": "string"}}}},
                    **_errors(PROBLEM, [400, 408, 413, 415, 429, 503],
                              s400="a body that is not checksum lines of one algorithm "
                                   "(`lines` names the first bad ones), a line longer than "
                                   f"{MAX_LINE} characters, an empty body, a body that is "
                                   "not UTF-8, or a bad key choice",
                              s408="the body did not arrive in time (STAMPD_BODY_TIMEOUT "
                                   "per chunk, plus a second per MiB in all)",
                              s413="more than STAMPD_MAX_MANIFEST_BYTES bytes or "
                                   "STAMPD_MAX_MANIFEST_LINES lines",
                              s429="over the hourly manifest bytes of this client "
                                   "(STAMPD_MANIFEST_BYTES_PER_CLIENT_HOUR) or of the server "
                                   "(STAMPD_MANIFEST_BYTES_PER_HOUR); Retry-After: when "
                                   "the hour ends",
                              s503="more manifest bytes in flight than "
                                   "STAMPD_MANIFEST_BYTES_IN_FLIGHT, its checking process "
                                   "ended without an answer, too many stamps waiting, or no "
                                   "worker signed in time; try again after Retry-After "
                                   "seconds"),
                },
            }},
            "/v1/manifests/{serial}": {"get": {
                "tags": ["digests"],
                "operationId": "getManifest",
                "summary": "A signed manifest again",
                "parameters": [{"name": "serial", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}}],
                "responses": {
                    "200": {"description": "the signed manifest",
                            "content": {TEXT: {"schema": {"type": "string"}}}},
                    **_errors(PROBLEM, [400, 404], s400="a serial that is not a number",
                              s404="no signed manifest of that serial"),
                },
            }},
            "/v1/keys": {"get": {
                "tags": ["keys"],
                "operationId": "getKeys",
                "summary": "Every signing key of this server",
                "responses": {"200": {"description": "the keys, the primary key first",
                                      "content": {"application/json":
                                                  {"schema": _ref("Keys")}}}},
            }},
            "/v1/proofs/{serial}": {"get": _proof_operation(
                "getProof", "A stamp's proof of inclusion in the transparency log",
                "The `c2sp.org/tlog-proof@v1` of the stamp with this serial (a receipt, a "
                "manifest or an RFC 3161 token): its entry on the `extra` line, its index, the "
                "inclusion proof and the signed checkpoint.",
                {"name": "serial", "in": "path", "required": True,
                 "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
                "a serial or wait that is malformed")},
            "/v1/proofs/git/{object_id}": {"get": _proof_operation(
                "getGitProof", "A git stamp's proof of inclusion in the transparency log",
                "By the id of the signed tag or commit the server answered, or by the commit "
                "stamped (its first stamp in the log).",
                {"name": "object_id", "in": "path", "required": True,
                 "schema": {"type": "string", "pattern": "^([0-9a-f]{40}|[0-9a-f]{64})$"}},
                "an object id or wait that is malformed")},
            "/tlog/checkpoint": {"get": {
                "tags": ["tlog"], "operationId": "getCheckpoint",
                "summary": "The newest signed checkpoint (C2SP tlog-checkpoint)",
                "responses": {"200": _text("the signed note"),
                              "404": _text("no checkpoint yet, or no transparency log")},
            }},
            "/tlog/vkey": {"get": {
                "tags": ["tlog"], "operationId": "getLogVerifierKey",
                "summary": "The log's signed-note verifier key, one line",
                "responses": {"200": _text("<origin>+<key ID>+<base64 key>"),
                              "404": _text("no transparency log")},
            }},
            "/tlog/policy": {"get": {
                "tags": ["tlog"], "operationId": "getVerificationPolicy",
                "summary": "The server's verification policy (C2SP tlog-policy)",
                "description": "The log's verifier key, the witnesses that cosign its "
                               "checkpoints and how many of them a checkpoint needs: `log`, "
                               "`witness`, `group witnesses <k> ...` and `quorum witnesses` "
                               "lines, or `quorum none` without witnesses.",
                "responses": {"200": _text("the policy, one line per item"),
                              "404": _text("no transparency log")},
            }},
            "/add-checkpoint": {"post": {
                "tags": ["witness"], "operationId": "addCheckpoint",
                "summary": "Have this witness cosign a log's checkpoint (C2SP tlog-witness)",
                "description": "`old <size>`, the consistency proof (one base64 hash a line), "
                               "an empty line, then the signed checkpoint; at most 65536 bytes. "
                               "The checkpoint is stored before it is cosigned; the checkpoint "
                               "already cosigned, sent again, is answered with the stored "
                               "cosignature while it is at most 30 s old.",
                "requestBody": {"required": True, "content": {TEXT: {"schema": {
                    "type": "string", "maxLength": 65536}}}},
                "responses": {
                    "200": _text("the cosignature line(s) (c2sp.org/tlog-cosignature)"),
                    "400": _text("a malformed request, or an old size above the checkpoint's"),
                    "403": _text("no valid signature by a key of the log"),
                    "404": _text("a log this witness does not know, or no witness here"),
                    "409": {"description": "the old size is not the size last cosigned: the "
                                           "body is that size and a newline",
                            "content": {"text/x.tlog.size": {"schema": {"type": "string"}}}},
                    "413": _text("a body over 65536 bytes"),
                    "422": _text("the consistency proof does not verify, or another tree of "
                                 "the size cosigned"),
                    "429": _text("this client sent its requests of the minute "
                                 "(STAMPD_WITNESS_REQUESTS_PER_CLIENT_MINUTE): retry after "
                                 "Retry-After seconds"),
                    "503": _text("stored but not cosigned now: retry after Retry-After "
                                 "seconds"),
                },
            }},
            "/tlog/witness-vkey": {"get": {
                "tags": ["witness"], "operationId": "getWitnessVerifierKey",
                "summary": "The witness's cosignature verifier key (type 0x04), one line",
                "responses": {"200": _text("<name>+<key ID>+<base64 key>"),
                              "404": _text("this server is no witness")},
            }},
            "/{origin_hash}/checkpoint": {"get": {
                "tags": ["witness"], "operationId": "getWitnessedCheckpoint",
                "summary": "The checkpoint of a log last cosigned (monitoring)",
                "description": "By the lowercase hex SHA-256 of the log's origin: the "
                               "checkpoint with the log's signature and this witness's "
                               "cosignature, nothing else.",
                "parameters": [{"name": "origin_hash", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}],
                "responses": {"200": _text("the cosigned checkpoint note"),
                              "404": _text("no checkpoint of that log cosigned, or no "
                                           "witness here")},
            }},
            "/tlog/tile/{path}": {"get": {
                "tags": ["tlog"], "operationId": "getTile",
                "summary": "A tile or an entry bundle (C2SP tlog-tiles)",
                "description": "`<L>/<N>[.p/<W>]` (hashes) or `entries/<N>[.p/<W>]` "
                               "(entries); immutable.",
                "parameters": [{"name": "path", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "the tile's bytes",
                            "content": {"application/octet-stream":
                                        {"schema": {"type": "string", "format": "binary"}}}},
                    "404": _text("not a tile path, or no such tile"),
                },
            }},
            "/v1/keys/allowed_signers": {"get": {
                "tags": ["keys"],
                "operationId": "getAllowedSigners",
                "summary": "The SSH keys as allowed-signers lines",
                "description": "For `git config gpg.ssh.allowedSignersFile` and "
                               "`ssh-keygen -Y verify -f`.",
                "responses": {"200": _text("one line per SSH key"),
                              **_errors(PROBLEM, [404], s404="this server has no SSH key")},
            }},
            "/tsr": {"post": tsa_post},
            "/tsa.pem": {"get": {
                "tags": ["rfc3161"], "operationId": "getTsaChain",
                "summary": "The TSA certificate chain (PEM, the TSA certificate first)",
                "responses": {
                    "200": {"description": "the chain",
                            "content": {"application/pem-certificate-chain":
                                        {"schema": {"type": "string"}}}},
                    "404": {"description": "RFC 3161 is off on this server",
                            "content": {TEXT: {"schema": {"type": "string"}}}},
                },
            }},
            "/healthz": {"get": {
                "tags": ["operations"], "operationId": "getLiveness",
                "summary": "Liveness: the process answers",
                "responses": {"200": _text("alive", "ok\n")},
            }},
            "/readyz": {"get": {
                "tags": ["operations"], "operationId": "getReadiness",
                "summary": "Readiness, each check by name",
                "responses": {
                    "200": {"description": "every check passed",
                            "content": {"application/json": {"schema": _ref("Readiness")}}},
                    "503": {"description": "a check failed",
                            "content": {"application/json": {"schema": _ref("Readiness")}}},
                },
            }},
            "/metrics": {"get": {
                "tags": ["operations"], "operationId": "getMetrics",
                "summary": "Prometheus metrics (text exposition format)",
                "responses": {"200": _text("the metrics")},
            }},
        },
        "components": {"schemas": _schemas(keys)},
    }


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


def add_docs_routes(app: FastAPI, services: Callable[[], Services]) -> None:
    """``GET /openapi.json``, ``GET /docs`` and the files of Swagger UI under ``/docs/``."""
    cache: list[Json] = []

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json() -> Response:
        if not cache:
            cache.append(openapi_document(services().keys))
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
