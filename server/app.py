"""The HTTP edge: Zeitgitter protocol v1 at ``/``.

`create_app(settings)` builds the application; its lifespan starts the journal, the dispatcher
(workers connect to it) and the log committer. The secret key never enters this process.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import Engine
from starlette.types import Receive, Scope, Send

from server import db, status
from server.dbdispatch import DbDispatcher, psycopg_dsn
from server.digests import add_digest_routes, problem
from server.dispatch import Dispatcher, Signed
from server.errors import (
    BadRequest,
    JournalError,
    StampError,
    Unavailable,
    UnknownRequest,
)
from server.journal import Journal
from server.leader import AdvisoryLeader
from server.logcommitter import LogCommitter
from server.metrics import StampdCollector, Stats
from server.peers import CrossStamper
from server.publish import add_log_routes
from server.receipts import DigestRequest, Statement
from server.requestbody import read_body
from server.settings import Settings
from server.zeitgitter import (
    GET_PUBLIC_KEY,
    Fields,
    choose_key,
    key_fields,
    parse_stamp_request,
)
from workers import gitobjects
from workers.gitlog import LogRepository
from workers.gitobjects import BranchRequest, TagRequest
from workers.keyset import ServedKey, parse_extra_keys, served_keys

log = logging.getLogger(__name__)

URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
GIT_OBJECT = "application/x-git-object"
PGP_KEYS = "application/pgp-keys"
MAX_FIELDS = 16


@dataclass
class Services:
    settings: Settings
    journal: Journal
    dispatcher: Dispatcher | DbDispatcher
    committer: LogCommitter
    clock: Callable[[], float]
    engine: Engine
    cross: CrossStamper
    stats: Stats
    keys: list[ServedKey]  # every signing key, the primary first

    @property
    def key(self) -> ServedKey:
        """The primary OpenPGP key (Zeitgitter's key, and the log's)."""
        return self.keys[0]


def _job(req: TagRequest | BranchRequest, t: int, url: str, uid: str | None = None
         ) -> dict[str, Any]:
    job: dict[str, Any]
    if isinstance(req, TagRequest):
        job = {"op": "tag", "commit": req.commit, "tagname": req.tagname, "time": t,
               "message": gitobjects.tag_message(req.commit, url, t)}
    else:
        parents = [req.parent, req.commit] if req.parent else [req.commit]
        job = {"op": "commit", "tree": req.tree, "parents": parents, "time": t,
               "message": gitobjects.branch_message(req.commit, url, t)}
    if uid is not None:
        job["uid"] = uid  # for keys without a user id of their own (SSH)
    return job


async def read_form(scope: Scope, receive: Receive, settings: Settings) -> Fields:
    """Read and parse a form body within the size and time limits."""
    mtype, body = await read_body(scope, receive, settings, (URLENCODED, MULTIPART), BadRequest)
    fields: dict[str, list[str]] = {}
    if mtype == URLENCODED:
        try:
            pairs = urllib.parse.parse_qsl(body.decode("ascii"), keep_blank_values=True,
                                           errors="strict", max_num_fields=MAX_FIELDS)
        except (UnicodeError, ValueError):
            raise BadRequest("malformed form body") from None
    else:
        request = Request(scope)
        request._body = body  # Starlette parses the cached body
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


async def _send(send: Send, status: int, body: bytes, ctype: bytes,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: StampError) -> None:
    extra = [(b"retry-after", str(exc.retry_after).encode())] if isinstance(
        exc, Unavailable) else []
    await _send(send, exc.status, exc.message.encode() + b"\n", b"text/plain; charset=utf-8",
                extra)


class Stamper:
    """The stamping path shared by every front end: journal first, then a worker signs."""

    def __init__(self, services: Services) -> None:
        self.s = services

    async def _sign(self, stamp_id: int, payload: dict[str, Any], key: ServedKey) -> Signed:
        s = self.s
        try:
            async with asyncio.timeout(s.settings.request_timeout):
                return await s.dispatcher.sign(payload, key.id)
        except TimeoutError:
            s.journal.failed(stamp_id, "timed out")
            raise Unavailable("no worker could sign in time; retry later") from None
        except StampError as e:
            s.journal.failed(stamp_id, e.message)
            raise

    async def stamp(self, req: TagRequest | BranchRequest, key: ServedKey | None = None) -> str:
        """A signed git tag or commit for a Zeitgitter request."""
        s = self.s
        key = key or s.keys[0]
        t = int(s.clock())
        stamp_id = await s.journal.record(req, t, None if key.primary else key.id)
        uid = None if key.format == "openpgp" else key.uid
        signed = await self._sign(stamp_id, _job(req, t, s.settings.public_url, uid), key)
        kind = "tag" if isinstance(req, TagRequest) else "commit"
        s.journal.signed(stamp_id, signed.worker,
                         gitobjects.git_object_id(kind, signed.text.encode("ascii")))
        return signed.text

    async def receipt(self, req: DigestRequest, key: ServedKey | None = None
                      ) -> tuple[Statement, str]:
        """A signed receipt for a digest; returned once the receipt itself is stored."""
        s = self.s
        key = key or s.keys[0]
        t = int(s.clock())
        stamp_id = await s.journal.record(req, t, None if key.primary else key.id)
        statement = Statement(algorithm=req.algorithm, digest=req.digest, time=t,
                              server=s.settings.public_url, serial=stamp_id,
                              key=key.fingerprint)
        signed = await self._sign(stamp_id, {"op": "receipt", "text": statement.text(),
                                             "time": t}, key)
        try:
            async with asyncio.timeout(s.settings.request_timeout):
                await s.journal.signed_durably(stamp_id, signed.worker, signed.text)
        except TimeoutError:
            raise JournalError("the receipt could not be stored; retry later") from None
        return statement, signed.text


def log_key_files(keys: list[ServedKey]) -> dict[str, str]:
    """Every public key besides pubkey.asc, for the log: keys/<id>.asc|.pub, allowed_signers."""
    files = {f"keys/{k.log_name}": k.public for k in keys[1:]}
    signers = "".join(k.allowed_signers("git,stampd") or "" for k in keys)
    if signers:
        files["allowed_signers"] = signers
    return files


def _ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")


class ZeitgitterPost:
    """Raw ASGI handler for ``POST /`` (the hot path), in front of the FastAPI app."""

    def __init__(self, app: FastAPI, services: dict[str, Services]) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        s = self.services["s"]
        kind = "invalid"
        try:
            fields = await read_form(scope, receive, s.settings)
            req = parse_stamp_request(fields)
            kind = "tag" if isinstance(req, TagRequest) else "branch"
            key = choose_key(s.keys, *key_fields(fields))
            text = await Stamper(s).stamp(req, key)
        except StampError as e:
            s.stats.request(kind, e.status)
            await send_error(send, e)
            return
        s.stats.request(kind, 200)
        await _send(send, 200, text.encode("ascii"), GIT_OBJECT.encode())


def create_app(
    settings: Settings, *, clock: Callable[[], float] = time.time,
    before_shutdown: Callable[[], None] | None = None,
) -> ZeitgitterPost:
    """``before_shutdown`` runs (in a thread) when the server stops, after the last request
    and before the dispatcher closes: `stampd serve` stops its worker pool there, so that
    workers are stopped rather than cut off and respawned."""
    services: dict[str, Services] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = served_keys(settings.keys_dir, parse_extra_keys(settings.extra_keys))
        engine = db.make_engine(settings.db_url)
        stats = Stats()
        journal = Journal(engine, stats)
        dispatcher: Dispatcher | DbDispatcher
        if settings.dispatch == "database":
            dispatcher = DbDispatcher(engine, max_queue=settings.max_queue,
                                      sign_timeout=settings.sign_timeout,
                                      max_attempts=settings.max_attempts,
                                      heartbeat_timeout=settings.heartbeat_timeout, stats=stats)
        else:
            dispatcher = Dispatcher(settings.dispatch_socket, max_queue=settings.max_queue,
                                    sign_timeout=settings.sign_timeout,
                                    max_attempts=settings.max_attempts, stats=stats)
        leader: AdvisoryLeader | None = None
        if settings.dispatch == "database":
            leader = AdvisoryLeader(psycopg_dsn(engine))
        cross = CrossStamper(engine, settings, clock, leader=leader)

        def on_commit(head: str) -> None:
            cross.head_committed(head)
            loop.call_soon_threadsafe(cross.wake)

        loop = asyncio.get_running_loop()
        committer = LogCommitter(engine, LogRepository(settings.log_repo), dispatcher,
                                 keys[0].public, settings.commit_interval, clock,
                                 on_commit=on_commit, peer_keys=cross.pinned_keys,
                                 key_files=log_key_files(keys), leader=leader)
        await dispatcher.start()
        journal.start()
        committer.start()
        cross.start()
        services["s"] = Services(settings, journal, dispatcher, committer, clock, engine,
                                 cross, stats, keys)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StampdCollector(lambda: services["s"]))
        app.state.registry = registry
        app.state.services = services["s"]
        try:
            yield
        finally:
            if before_shutdown is not None:
                await asyncio.to_thread(before_shutdown)
            await cross.stop()
            await committer.stop()
            await dispatcher.stop()
            await journal.stop()
            if leader is not None:
                leader.close()
            engine.dispose()

    app = FastAPI(title="stampd", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(StampError)
    async def stamp_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StampError)
        if request.url.path.startswith("/v1/"):
            services["s"].stats.request("digest", exc.status)
            return problem(exc)
        headers = {}
        if isinstance(exc, Unavailable):
            headers["Retry-After"] = str(exc.retry_after)
        return PlainTextResponse(exc.message + "\n", status_code=exc.status, headers=headers)

    add_digest_routes(app, lambda: services["s"])
    add_log_routes(app, settings.log_repo)

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    async def readyz() -> Response:
        """Each check by name, so that an operator sees which one failed."""
        s = services["s"]
        workers = sorted(s.dispatcher.workers)
        checks: dict[str, dict[str, Any]] = {}
        try:
            async with asyncio.timeout(5):
                await asyncio.to_thread(_ping, s.engine)
            checks["database"] = {"ok": True}
        except Exception as e:
            checks["database"] = {"ok": False, "detail": f"{type(e).__name__}: {e}"[:300]}
        checks["workers"] = {"ok": bool(workers), "detail": f"{len(workers)} connected"}
        served = s.dispatcher.keys_served()
        for k in s.keys[1:]:
            checks[f"key:{k.id}"] = {"ok": k.id in served,
                                     "detail": "worker connected" if k.id in served
                                     else "no live worker holds this key"}
        overdue = s.committer.overdue()
        checks["log"] = {"ok": not overdue,
                         "detail": s.committer.last_error or ("overdue" if overdue else "ok")}
        try:
            stale = await asyncio.to_thread(s.cross.stale_peers, s.settings.peer_stale_after)
        except Exception:
            stale = {}
        for name in s.cross.peers:
            checks[f"peer:{name}"] = {"ok": name not in stale, "detail": stale.get(name, "ok")}
        ready = all(c["ok"] for c in checks.values())
        return JSONResponse(
            {"ready": ready, "checks": checks, "workers": workers,
             "queue": s.dispatcher.queue_depth, "requeued": s.dispatcher.requeued},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        body = await asyncio.to_thread(generate_latest, request.app.state.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/")
    async def root_get(request: Request) -> Response:
        s = services["s"]
        requests = request.query_params.getlist("request")
        if not requests and "text/html" in request.headers.get("accept", ""):
            snap = await asyncio.to_thread(status.snapshot, s)
            return HTMLResponse(status.render(s, snap))
        if not requests:
            return PlainTextResponse(
                f"stampd timestamping server\nkey {s.key.fingerprint} {s.key.uid}\n"
                "Zeitgitter protocol v1: POST request=stamp-tag-v1 | stamp-branch-v1\n"
            )
        if requests != [GET_PUBLIC_KEY]:
            raise UnknownRequest("unknown request type")
        return Response(s.key.public, media_type=PGP_KEYS)

    return ZeitgitterPost(app, services)
