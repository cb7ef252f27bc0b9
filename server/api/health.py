"""Liveness and readiness: ``GET /healthz`` and ``GET /readyz`` (each check by name, so that an
operator sees which one failed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NotRequired

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import Field
from sqlalchemy import Engine
from typing_extensions import TypedDict

from server.api.deps import ServicesDep
from server.api.openapi import text
from server.api.services import Services
from server.runtime.siblings import Sibling
from server.stamping.rfc3161 import clock_synchronised


def _ping(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")


async def readiness(s: Services, clock: Callable[[], bool | None] = clock_synchronised,
                    ) -> tuple[bool, dict[str, Any]]:
    """(ready, the JSON body of /readyz). Ready means: the database answers, every served key
    (the primary one too) has a live worker holding it, so each can sign now, RFC 3161 (where
    on) has its certificate chain, the clock is synchronised (where RFC 3161 requires it), the
    log is not overdue, the transparency log's last step in this process (if it writes) had
    no error, and no peer is stale. ``clock`` asks the kernel whether the clock is
    synchronised (tests inject its answer)."""
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
    for k in s.keys:  # (why a key has no worker, e.g. a key file it cannot load: the log)
        checks[f"key:{k.id}"] = {"ok": k.id in served,
                                 "detail": "worker connected" if k.id in served
                                 else f"no live worker holds key {k.id} ({k.fingerprint})"}
    if s.settings.tsa:
        checks["tsa"] = {"ok": s.tsa is not None,
                         "detail": "RFC 3161 served" if s.tsa is not None else
                         f"key {s.settings.tsa_key} has no TSA certificate chain"}
    checks["clock"] = _clock_check(clock(), tsa=s.settings.tsa,
                                   required=s.settings.tsa and s.settings.tsa_require_clock_sync)
    overdue = s.committer.overdue()
    checks["log"] = {"ok": not overdue,
                     "detail": s.committer.last_error or ("overdue" if overdue else "ok")}
    if s.tlog is not None:  # (its writer's errors: reported by the process that writes)
        checks["tlog"] = {"ok": s.tlog.last_error is None,
                          "detail": s.tlog.last_error or "ok"}
    try:
        stale = await asyncio.to_thread(s.cross.stale_peers, s.settings.peer_stale_after)
    except Exception:
        stale = {}
    for name in s.cross.peers:
        checks[f"peer:{name}"] = {"ok": name not in stale, "detail": stale.get(name, "ok")}
    total = await s.overview()
    if s.siblings is not None:  # every HTTP process of this server, this one first
        checks[f"http:{s.siblings.index}"] = {"ok": True, "detail": "answering this request"}
        for other in total.others:
            checks[f"http:{other.index}"] = _sibling_check(other, len(workers))
    ready = all(c["ok"] for c in checks.values())
    body = {"ready": ready, "checks": checks, "workers": workers,
            "queue": total.queue, "requeued": total.requeued}
    if s.mail_stampers is not None and s.mail_stampers.stampers:  # (shown, never a check)
        body["mail_stampers"] = await asyncio.to_thread(mail_report, s)
    if s.settings.witness_list:  # (shown, never a check: a witness down never stops stamping)
        body["witnesses"] = witness_report(s, total.others)
    return ready, body


def mail_report(s: Services) -> dict[str, dict[str, Any]]:
    """Each email timestamper by name: when we last sent it a request and had its reply,
    whether a head has waited too long (overdue), its failures and last error. Information,
    not readiness: a timestamper that never answers stops nothing."""
    assert s.mail_stampers is not None
    return {m.name: {"ok": m.overdue_since is None and m.error is None,
                     "detail": ("overdue: a head waits since "
                                f"{m.overdue_since}" if m.overdue_since is not None
                                else m.error or "ok"),
                     "address": m.address, "last_sent": m.last_sent,
                     "last_reply": m.last_reply, "overdue": m.overdue_since is not None,
                     "failures": m.failures, "refused": m.refused, "last_error": m.error}
            for m in s.mail_stampers.statuses()}


def witness_report(s: Services, others: Sequence[Sibling] = ()) -> dict[str, dict[str, Any]]:
    """Each witness by name: whether its last attempt cosigned, what it last cosigned, its
    lag behind the published checkpoint and its errors. Information, not readiness."""
    published = s.published_size()
    out: dict[str, dict[str, Any]] = {}
    for w in s.witness_states(others):
        if w.consecutive_errors:
            detail = f"{w.consecutive_errors} failed in a row: {w.last_error}"
        elif w.cosigned_size is None:
            detail = "no cosignature yet"
        else:
            detail = f"cosigned size {w.cosigned_size}"
        out[w.name] = {"ok": w.consecutive_errors == 0, "detail": detail, "url": w.url,
                       "cosigned_size": w.cosigned_size, "lag": w.lag(published),
                       "last_cosigned_at": w.cosigned_at, "errors": w.errors,
                       "consecutive_errors": w.consecutive_errors, "last_error": w.last_error,
                       "refused_cosignatures": w.refused_cosignatures}
    return out


def _clock_check(synced: bool | None, *, tsa: bool, required: bool) -> dict[str, Any]:
    """The clock, shown always. An unsynchronised clock fails readiness only where RFC 3161
    requests are refused for it (STAMPD_TSA_REQUIRE_CLOCK_SYNC); elsewhere it stays ok but its
    detail says so, and what follows from it."""
    if synced is None:
        return {"ok": True, "detail": "unknown (the kernel cannot be asked: adjtimex)"}
    if synced:
        return {"ok": True, "detail": "synchronised (kernel, adjtimex)"}
    if required:
        return {"ok": False, "detail": "not synchronised (kernel, adjtimex): RFC 3161 requests "
                "are refused (STAMPD_TSA_REQUIRE_CLOCK_SYNC=true)"}
    if not tsa:
        return {"ok": True, "detail": "not synchronised (kernel, adjtimex); RFC 3161 is off, "
                "stamps still carry this clock's time"}
    return {"ok": True, "detail": "not synchronised (kernel, adjtimex); tokens are still "
            "issued: STAMPD_TSA_REQUIRE_CLOCK_SYNC=false"}


def _sibling_check(other: Sibling, workers: int) -> dict[str, Any]:
    """Another HTTP process serves when its report is fresh and it sees workers (those of the
    host's dispatcher, as the coordinator told it, or on PostgreSQL those it found alive)."""
    if not other.serving:
        return {"ok": False, "detail": "not serving (no report for "
                f"{'ever' if other.record is None else f'{other.age:.0f} s'}); "
                "the server restarts it"}
    assert other.record is not None
    reached = len(other.record["workers"])
    return {"ok": reached > 0, "detail": f"pid {other.record['pid']}, {reached} workers "
            f"connected (here: {workers})"}


class Check(TypedDict):
    ok: bool
    detail: NotRequired[str]


class WitnessCheck(Check, total=False):
    url: str
    cosigned_size: int | None
    lag: int | None
    last_cosigned_at: float | None
    errors: int
    consecutive_errors: int
    last_error: str | None
    refused_cosignatures: int


class MailStamperCheck(Check, total=False):
    address: str
    last_sent: int | None
    last_reply: int | None
    overdue: bool
    failures: int
    refused: int
    last_error: str | None


class Readiness(TypedDict):
    ready: bool
    checks: Annotated[dict[str, Check], Field(
        description="each check by name: database, workers, key:<id>, log, peer:<name>")]
    workers: Annotated[list[str], Field(description="the connected workers")]
    queue: Annotated[int, Field(description="signing jobs waiting for a worker")]
    requeued: Annotated[int, Field(description="jobs handed to another worker after a fault")]
    witnesses: NotRequired[Annotated[dict[str, WitnessCheck], Field(
        description="each witness of the transparency log by name, where some are "
                    "configured: information, never a check")]]
    mail_stampers: NotRequired[Annotated[dict[str, MailStamperCheck], Field(
        description="each email timestamper by name, where some are configured (docs/mail.md):"
                    " information, never a check")]]


def add_health_routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["operations"], operation_id="getLiveness",
             summary="Liveness: the process answers", response_class=Response,
             responses={200: text("alive", "ok\n")})
    async def healthz() -> Response:
        return PlainTextResponse("ok\n")

    @app.get("/readyz", tags=["operations"], operation_id="getReadiness",
             summary="Readiness, each check by name", response_model=Readiness,
             response_description="every check passed",
             responses={503: {"model": Readiness, "description": "a check failed"}})
    async def readyz(s: ServicesDep) -> Response:
        ready, body = await readiness(s)
        return JSONResponse(body, status_code=200 if ready else 503)
