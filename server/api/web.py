"""The browser pages (docs/web.md): ``GET /stamp`` hashes files in the browser and stamps their
digests; ``GET /verify`` checks a receipt, manifest or proof in the browser alone. Their scripts
and style are built from ``web/`` by ``make assets`` into ``server/web/static`` and served under
``/web/`` from this server: no other origin, no inline script, no Node at run time.

Each page carries its configuration (the server's keys, the log's key and policy, the built
files' names) as a JSON data block, which is not a script and so needs no CSP exception. The
verify page may not connect anywhere (``connect-src 'none'``): once it has loaded, the check
cannot ask a server, by construction, not by promise.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from formats.keys import STAMPS
from server.api import templates
from server.api.services import Services
from server.tlog.witness_client import policy_text

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
STATIC_DIR = WEB_DIR / "static"

# Scripts and style from this server only; WebAssembly (hash-wasm) compiled from the scripts'
# own bytes; the hashing worker from this server. The stamp page posts digests to this
# server; the verify page connects nowhere.
_CSP = ("default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; "
        "style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'; connect-src ")
PAGES = {"stamp": _CSP + "'self'", "verify": _CSP + "'none'"}
_MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".txt": "text/plain; charset=utf-8", ".json": "application/json"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Built files carry a hash of their content in their name: a browser may keep them for good.
_IMMUTABLE = "public, max-age=31536000, immutable"


class WebAssetsMissing(RuntimeError):
    """server/web/static lacks the built files (run `make assets`)."""


@cache
def assets() -> dict[str, str]:
    """Entry name -> built file name (``assets.json``, written by web/build.mjs)."""
    try:
        return dict(json.loads((STATIC_DIR / "assets.json").read_text()))
    except (OSError, ValueError) as e:
        raise WebAssetsMissing(f"{STATIC_DIR}/assets.json: {e}; run make assets") from e


@cache
def _files() -> dict[str, tuple[bytes, bytes]]:
    """Every built file's bytes and their gzip, read once (the files are immutable): a lookup
    of any other name finds nothing and keeps nothing."""
    return {f.name: (data := f.read_bytes(), gzip.compress(data, 9, mtime=0))
            for f in STATIC_DIR.iterdir() if f.is_file() and _NAME.fullmatch(f.name)}


def page_config(s: Services) -> dict[str, Any]:
    """What a page knows of this server without asking it again."""
    settings = s.settings
    log = None
    if s.log_key is not None:
        log = {"origin": s.log_key.origin, "vkey": s.log_key.vkey,
               "policy": policy_text(s.log_key.vkey, settings.public_url + "tlog",
                                     settings.witness_list, settings.quorum)}
    return {
        "server": settings.public_url,
        "keys": [{"id": k.id, "format": k.format, "fingerprint": k.fingerprint,
                  "algorithm": k.algorithm, "uid": k.uid, "primary": k.primary,
                  "public": k.public} for k in s.keys if k.purpose == STAMPS],
        "tlog": log,
        "assets": assets(),
    }


def render(page: str, s: Services) -> str:
    """The page (templates/<page>.html). Its configuration goes through `tojson`, which writes
    "<", ">", "&" and "'" as \\u escapes: the JSON cannot end its <script> element early,
    whatever a key's user id says."""
    names = assets()
    return templates.render(f"{page}.html", css=f"/web/{names['page']}",
                            script=f"/web/{names[page]}", config=page_config(s))


def add_web_routes(app: FastAPI, services: Callable[[], Services]) -> None:
    """``GET /stamp``, ``GET /verify`` and the built files under ``/web/``."""
    for page, csp in PAGES.items():

        def serve(page: str = page, csp: str = csp) -> Callable[[], Any]:
            async def html() -> Response:
                return HTMLResponse(render(page, services()), headers={
                    "Content-Security-Policy": csp, "X-Frame-Options": "DENY",
                    "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"})
            return html

        app.add_api_route(f"/{page}", serve(), methods=["GET"], include_in_schema=False)

    @app.get("/web/{name}", include_in_schema=False)
    async def static(name: str, request: Request) -> Response:
        found = _files().get(name)
        if found is None:
            return PlainTextResponse("no such file\n", status_code=404)
        data, packed = found
        headers = {"Cache-Control": _IMMUTABLE, "X-Content-Type-Options": "nosniff",
                   "Vary": "Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            data = packed
            headers["Content-Encoding"] = "gzip"
        return Response(data, headers=headers,
                        media_type=_MEDIA_TYPES.get(Path(name).suffix, "application/octet-stream"))
