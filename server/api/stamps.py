"""``/v1/stamps``: stamp a sha256/sha512 digest, fetch its receipts again.

    curl -sS --data sha256=<hex> http://127.0.0.1:8080/v1/stamps           (form)
    curl -sS -H 'Content-Type: application/json' -d '{"sha256":"<hex>"}' ...  (JSON)

The answer is the receipt (an OpenPGP cleartext-signed statement, see `formats.receipts`) as
``text/plain``, or, with ``Accept: application/json``, the receipt and its fields in JSON.
Errors are ``application/problem+json`` (RFC 9457), mapped by `server.api.errors.problem_route`.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NotRequired

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ConfigDict, Field, WithJsonSchema, with_config
from typing_extensions import TypedDict

from formats.receipts import (
    ALGORITHMS,
    STATEMENT_FIELDS,
    check_digest,
    parse_statement,
    split_receipt,
)
from server.api.body import read_body
from server.api.deps import ServicesDep, services_of
from server.api.openapi import (
    EXAMPLE_DIGEST,
    KEY_CHOICE,
    TEXT,
    URLENCODED,
    Json,
    named,
    problems,
    ref,
    request_body,
    whole,
)
from server.api.services import Services
from server.errors import BadRequest, NotFound
from server.runtime.threadpool import OneAtATime
from server.stamping.queries import digest_page
from server.stamping.requests import DigestRequest, choose_key, key_fields

JSON = "application/json"
SPACE = " \t\r\n"  # what may surround a digest (removed)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: a key given twice is refused, as a form
    field given twice is (rather than the last one silently winning)."""
    obj: dict[str, Any] = {}
    for name, value in pairs:
        if name in obj:
            raise BadRequest(f"field '{name}' given more than once")
        obj[name] = value
    return obj


def parse_digest_body(ctype: str, body: bytes) -> tuple[DigestRequest, dict[str, list[str]]]:
    """One ``sha256`` or ``sha512`` field, from a form or a JSON object; plus the optional
    key choice fields (``format``, ``key``). Any body that does not parse, or names a field
    twice, is a `BadRequest`."""
    if not body.strip():
        raise BadRequest("empty body: send sha256=<hex> or sha512=<hex>")
    fields: dict[str, list[str]] = {}
    if ctype == URLENCODED:
        try:
            pairs = urllib.parse.parse_qsl(body.decode("ascii"), strict_parsing=True,
                                           keep_blank_values=True,
                                           errors="strict", max_num_fields=8)
        except (UnicodeError, ValueError):
            raise BadRequest("malformed form body") from None
        for name, value in pairs:
            if name in fields:
                raise BadRequest(f"field '{name}' given more than once")
            fields[name] = [value]
    else:
        try:
            data = json.loads(body, object_pairs_hook=_unique_keys)
        except (UnicodeError, ValueError, RecursionError):
            # RecursionError: nesting deeper than the interpreter's recursion limit.
            raise BadRequest("malformed JSON body") from None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise BadRequest('send a JSON object like {"sha256": "<hex>"}')
        fields = {k: [v] for k, v in data.items()}
    choice: dict[str, list[str]] = {k: fields.pop(k) for k in ("format", "key") if k in fields}
    unknown = sorted(set(fields) - set(ALGORITHMS))
    if unknown:
        raise BadRequest(f"unknown field or algorithm {unknown[0]!r}; use sha256 or sha512")
    if len(fields) != 1 or any(len(v) != 1 for v in fields.values()):
        raise BadRequest("send exactly one digest")
    ((algorithm, (digest,)),) = fields.items()
    # `sha256sum FILE | cut -d' ' -f1 | curl --data-urlencode sha256@- ...` sends a final
    # newline; surrounding whitespace is not part of a digest.
    digest = digest.strip(SPACE)
    try:
        check_digest(algorithm, digest)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return DigestRequest(algorithm=algorithm, digest=digest), choice


PAGE_MAX = 100  # receipts in one answer of GET /v1/stamps/<algorithm>/<hex>


def page_params(limit: list[str], after: list[str]) -> tuple[int, int]:
    """(limit, after) of a receipts page from the query: ``limit`` 1..`PAGE_MAX` (default
    `PAGE_MAX`), ``after`` a serial (default 0: from the first); each at most once."""

    def one(name: str, values: list[str], default: int, low: int, high: int) -> int:
        if len(values) > 1:
            raise BadRequest(f"'{name}' given more than once")
        if not values:
            return default
        v = values[0]
        # isascii: str.isdigit() is true of digits that int() refuses ("²").
        if not (v.isascii() and v.isdigit() and len(v) <= 19 and low <= int(v) <= high):
            raise BadRequest(f"'{name}' must be a whole number from {low} to {high}")
        return int(v)

    return one("limit", limit, PAGE_MAX, 1, PAGE_MAX), one("after", after, 0, 0, 2**63 - 1)


def wants_json(request: Request) -> bool:
    return JSON in request.headers.get("accept", "")


def receipt_json(receipt: str) -> dict[str, Any]:
    statement = parse_statement(split_receipt(receipt)[0])
    return {**statement.as_json(), "receipt": receipt}


# -- the answers' and the bodies' schemas ---------------------------------------------------

def _field(name: str, **field: Any) -> Any:
    """A field of a receipt's statement: its pattern is the statement's (`STATEMENT_FIELDS`)."""
    return Field(pattern=whole(STATEMENT_FIELDS[name]), **field)


@with_config(ConfigDict(extra="forbid"))
class Receipt(TypedDict):
    """a receipt and the fields of its signed statement (docs/receipts.md)"""

    algorithm: Annotated[str, _field("algorithm")]
    digest: Annotated[str, _field("digest")]
    time: Annotated[int, Field(ge=0, description="Unix seconds, when the request was journaled")]
    utc: Annotated[str, _field("utc")]
    server: Annotated[str, _field("server")]
    serial: Annotated[int, Field(ge=1)]
    key: Annotated[str, _field("key")]
    receipt: Annotated[str, Field(description="the signed receipt, as the text/plain answer")]


@with_config(ConfigDict(extra="forbid"))
class ManifestRef(TypedDict):
    """a signed manifest that covers the digest"""

    serial: Annotated[int, Field(ge=1)]
    time: Annotated[int, Field(ge=0)]
    algorithm: Annotated[str, _field("algorithm")]
    key: str
    url: Annotated[str, Field(pattern="^/v1/manifests/[0-9]+$")]


@with_config(ConfigDict(extra="forbid"))
class ReceiptPage(TypedDict):
    receipts: Annotated[list[Receipt], Field(max_length=PAGE_MAX)]
    manifests: NotRequired[Annotated[list[ManifestRef], Field(
        max_length=PAGE_MAX, description="signed manifests that cover the digest (present only "
        "when there are some); receipts and manifests of a page are the first `limit` by serial")]]
    next: Annotated[str | None, Field(description="the URL of the next page; null on the last")]


def _stamp_body(algorithm: str, n: int) -> Json:
    digest = {"type": "string", "pattern": f"^[{SPACE}]*[0-9a-f]{{{n}}}[{SPACE}]*$",
              "description": f"the {algorithm} digest: {n} lowercase hex digits (surrounding "
                             "spaces, tabs, CR and LF are removed)"}
    return {"type": "object", "title": f"a {algorithm} digest", "properties": {algorithm: digest},
            "required": [algorithm], "additionalProperties": False, **KEY_CHOICE}


STAMP_BODY = named(
    ref("StampDigest"),
    StampDigest={"oneOf": [ref(f"Stamp{alg.upper()}") for alg in ALGORITHMS]},
    **{f"Stamp{alg.upper()}": _stamp_body(alg, n) for alg, n in ALGORITHMS.items()})
# The receipts' page parameters, as sent (each given at most once: `page_params` checks them).
Limit = Annotated[list[str], Query(default_factory=list), WithJsonSchema(
    {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": PAGE_MAX})]
After = Annotated[list[str], Query(
    default_factory=list, description="a receipt's serial: the page starts after it"),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "default": 0})]


def add_stamp_routes(router: APIRouter) -> None:
    # One receipts page is built at a time: threads building pages contend for the GIL with
    # the event loop and the journal's thread, and every stamp waits on those (bench.readflood:
    # a stamp's p99 under 4 readers 47 ms with pages in parallel, 21 ms one at a time).
    build_page = OneAtATime()

    @router.post(
        "/v1/stamps", tags=["digests"], operation_id="stampDigest",
        summary="Stamp a sha256 or sha512 digest", response_model=Receipt,
        response_description="the receipt",
        responses={200: {"content": {TEXT: {"schema": {"type": "string"}}}},
                   **problems(400, 408, 411, 413, 415, 503)},
        openapi_extra=request_body(URLENCODED, JSON, schema=STAMP_BODY,
                                   example={"sha256": EXAMPLE_DIGEST["sha256"]}))
    async def stamp_digest(request: Request) -> Response:
        """Exactly one digest field, and optionally the key choice. The answer is sent only
        after the receipt is stored, so the GET operations find it from then on. The receipt
        is an OpenPGP cleartext-signed (or SSH signed) statement; with `Accept:
        application/json`, a JSON object of its fields and the receipt."""
        s = services_of(request)  # (not ServicesDep: the hot path, `services_of`)
        ctype, body = await read_body(request.scope, request.receive, s.settings,
                                      (URLENCODED, JSON))
        req, choice = parse_digest_body(ctype, body)
        key = choose_key(s.keys, *key_fields(choice))
        statement, receipt = await s.stamper.stamp(req, key)
        s.stats.request("digest", 200)
        if wants_json(request):
            return JSONResponse({**statement.as_json(), "receipt": receipt})
        return PlainTextResponse(receipt)

    async def receipts(request: Request, s: Services, algorithm: str, digest: str,
                       limit_values: list[str], after_values: list[str]) -> Response:
        """The receipts of a digest, oldest first, a page at a time: ``limit`` (default and
        most `PAGE_MAX`) receipts with a serial after ``after``; a ``Link: <...>; rel="next"``
        header (and ``"next"`` in JSON) names the next page while there is one."""
        try:
            check_digest(algorithm, digest)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        limit, after = page_params(limit_values, after_values)
        as_json = wants_json(request)

        fingerprints = {k.id: k.fingerprint for k in s.keys}
        primary = s.keys[0].fingerprint

        def page() -> tuple[list[int], Any, list[dict[str, Any]]]:
            # The query and the answer's body are built in a thread: a digest stamped
            # thousands of times must not hold up the event loop.
            found = digest_page(s.engine, algorithm, digest, after, limit)
            manifests = [{"serial": m.serial, "time": m.time, "algorithm": algorithm,
                          "key": fingerprints.get(m.key_id, primary) if m.key_id else primary,
                          "url": f"/v1/manifests/{m.serial}"}
                         for m in found.manifests]
            if as_json:
                return found.serials, [receipt_json(r) for r in found.receipts], manifests
            return found.serials, "".join(found.receipts), manifests

        ids, body, manifests = await build_page(page)
        if not ids:
            raise NotFound(f"no receipt for {algorithm} {digest}"
                           + (f" after serial {after}" if after else ""))
        more = len(ids) > limit
        next_url = (f"/v1/stamps/{algorithm}/{digest}?limit={limit}&after={ids[limit - 1]}"
                    if more else None)
        headers = {"Link": f'<{next_url}>; rel="next"'} if next_url else None
        if as_json:
            answer: dict[str, Any] = {"receipts": body, "next": next_url}
            if manifests:  # only then: the answer for receipts alone is as it was
                answer["manifests"] = manifests
            return JSONResponse(answer, headers=headers)
        body += "".join(f"manifest: {m['url']}\n" for m in manifests)
        return PlainTextResponse(body, headers=headers)

    def receipts_of(algorithm: str, n: int) -> Callable[..., Awaitable[Response]]:
        async def get_receipts(
            request: Request, s: ServicesDep, limit: Limit, after: After,
            # (a default, not an annotation: this one differs by algorithm)
            digest: str = Path(description=f"{n} lowercase hex digits",
                               json_schema_extra={"pattern": f"^[0-9a-f]{{{n}}}$"},
                               openapi_examples={"hello": {"value": EXAMPLE_DIGEST[algorithm]}}),
        ) -> Response:
            """Oldest first, a page at a time: at most `limit` receipts with a serial above
            `after`. While more follow, a `Link: <...>; rel="next"` header (and `next` in JSON)
            names the next page. The text answer is the receipts concatenated; with `Accept:
            application/json`, a JSON page."""
            return await receipts(request, s, algorithm, digest, limit, after)

        return get_receipts

    for algorithm, n in ALGORITHMS.items():
        link = (f'^</v1/stamps/{algorithm}/[0-9a-f]{{{n}}}'
                r'\?limit=[0-9]+&after=[0-9]+>; rel="next"$')
        router.add_api_route(
            f"/v1/stamps/{algorithm}/{{digest}}", receipts_of(algorithm, n), methods=["GET"],
            tags=["digests"], operation_id=f"getReceipts{algorithm.upper()}",
            summary=f"The receipts issued for a {algorithm} digest", response_model=ReceiptPage,
            responses={200: {"description": "the receipts", "headers": {"Link": {
                "description": "the next page, while there is one",
                "schema": {"type": "string", "pattern": link}}},
                "content": {TEXT: {"schema": {"type": "string"}}}},
                **problems(400, 404, s404="no receipt for this digest (after `after`)")})

    @router.get("/v1/stamps/{algorithm}/{digest}", include_in_schema=False)
    async def get_receipts(request: Request, s: ServicesDep, algorithm: str, digest: str,
                           limit: Limit, after: After) -> Response:
        """Another algorithm: refused as `check_digest` refuses it."""
        return await receipts(request, s, algorithm, digest, limit, after)
