"""The public log over HTTP, read-only: ``git clone http://HOST:PORT/log.git``.

Git's "dumb" HTTP protocol needs only static files: ``HEAD``, ``info/refs``,
``objects/info/packs`` and the objects. ``info/refs`` and ``objects/info/packs`` are generated
on every request from the repository itself, so a clone always sees the latest log commit and
every peer branch without ``git update-server-info``. Nothing else of the repository (config,
reflogs, hooks) is served.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, PlainTextResponse, Response

from server.gitlog.repository import LogRepository

SERVED = re.compile(
    r"HEAD|objects/[0-9a-f]{2}/[0-9a-f]{38}|objects/pack/pack-[0-9a-f]{40,64}\.(?:pack|idx)"
)
IMMUTABLE = "public, max-age=31536000, immutable"


def info_refs(repo: LogRepository) -> str:
    return "".join(f"{oid}\t{name}\n" for oid, name in repo.refs())


def info_packs(path: Path) -> str:
    packs = sorted((path / "objects" / "pack").glob("pack-*.pack"))
    return "".join(f"P {p.name}\n" for p in packs) + "\n"


def add_log_routes(app: FastAPI, path: Path) -> None:
    """Git's dumb HTTP protocol (not an API: not in /openapi.json)."""
    repo: dict[str, LogRepository] = {}

    def handle() -> LogRepository:
        if "r" not in repo:
            repo["r"] = LogRepository(path)
        return repo["r"]

    @app.get("/log.git/info/refs", include_in_schema=False)
    async def refs() -> Response:
        text = await asyncio.to_thread(lambda: info_refs(handle()))
        return PlainTextResponse(text, headers={"Cache-Control": "no-cache"})

    @app.get("/log.git/objects/info/packs", include_in_schema=False)
    async def packs() -> Response:
        return PlainTextResponse(info_packs(path), headers={"Cache-Control": "no-cache"})

    @app.get("/log.git/{name:path}", include_in_schema=False)
    async def files(name: str) -> Response:
        if not SERVED.fullmatch(name) or not (path / name).is_file():
            return PlainTextResponse("not found\n", status_code=404)
        cache = "no-cache" if name == "HEAD" else IMMUTABLE
        return FileResponse(path / name, media_type="application/octet-stream",
                            headers={"Cache-Control": cache})
