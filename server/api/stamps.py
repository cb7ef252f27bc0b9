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
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from formats.receipts import ALGORITHMS, check_digest, parse_statement, split_receipt
from server.api.body import read_body
from server.api.services import Services
from server.api.threadpool import OneAtATime
from server.errors import BadRequest, NotFound
from server.stamping.queries import digest_page
from server.stamping.requests import DigestRequest, choose_key, key_fields

URLENCODED = "application/x-www-form-urlencoded"
JSON = "application/json"


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
    digest = digest.strip(" \t\r\n")
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


def add_stamp_routes(router: APIRouter, services: Callable[[], Services]) -> None:
    # One receipts page is built at a time: threads building pages contend for the GIL with
    # the event loop and the journal's thread, and every stamp waits on those (bench.readflood:
    # a stamp's p99 under 4 readers 47 ms with pages in parallel, 21 ms one at a time).
    build_page = OneAtATime()

    @router.post("/v1/stamps")
    async def stamp_digest(request: Request) -> Response:
        s = services()
        ctype, body = await read_body(request.scope, request.receive, s.settings,
                                      (URLENCODED, JSON))
        req, choice = parse_digest_body(ctype, body)
        key = choose_key(s.keys, *key_fields(choice))
        statement, receipt = await s.stamper.stamp(req, key)
        s.stats.request("digest", 200)
        if wants_json(request):
            return JSONResponse({**statement.as_json(), "receipt": receipt})
        return PlainTextResponse(receipt)

    @router.get("/v1/stamps/{algorithm}/{digest}")
    async def get_receipts(algorithm: str, digest: str, request: Request) -> Response:
        """The receipts of a digest, oldest first, a page at a time: ``limit`` (default and
        most `PAGE_MAX`) receipts with a serial after ``after``; a ``Link: <...>; rel="next"``
        header (and ``"next"`` in JSON) names the next page while there is one."""
        s = services()
        try:
            check_digest(algorithm, digest)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        limit, after = page_params(request.query_params.getlist("limit"),
                                   request.query_params.getlist("after"))
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
