"""The ``/v1`` API, one module per resource, on one router whose routes answer every domain
error as ``application/problem+json`` (`server.api.errors.problem_route`):

    /v1/stamps, /v1/stamps/<algorithm>/<hex>    `server.api.stamps`     digest receipts
    /v1/manifests, /v1/manifests/<serial>       `server.api.manifests`  signed manifests
    /v1/keys, /v1/keys/allowed_signers          `server.api.keys`       the signing keys
    /v1/proofs/<serial>, /v1/proofs/git/<id>    `server.api.tlog`       transparency-log proofs

The queries behind them are `server.stamping.queries`.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, FastAPI
from starlette.exceptions import HTTPException

from server.api.errors import problem_route, routing_problem
from server.api.keys import add_key_routes
from server.api.manifests import add_manifest_routes
from server.api.services import Services
from server.api.stamps import add_stamp_routes
from server.api.tlog import add_proof_routes


def add_v1_routes(app: FastAPI, services: Callable[[], Services]) -> None:
    def count(path: str, status: int) -> None:
        # A refused manifest is counted as a manifest request (a 503 of a busy host is no
        # digest stamp refused); every other /v1 refusal as a digest request's.
        kind = "manifest" if path.startswith("/v1/manifests") else "digest"
        services().stats.request(kind, status)

    router = APIRouter(route_class=problem_route(count))
    add_stamp_routes(router)
    add_manifest_routes(router)
    add_key_routes(router)
    add_proof_routes(router)
    # Its routes go on the app's own router as they are: `include_router` would wrap them
    # (FastAPI 0.165), and the first request to each HTTP process would build every route
    # again (34 ms of CPU). Nothing is to be added to them: no prefix, no dependencies.
    app.router.routes.extend(router.routes)
    app.add_exception_handler(HTTPException, routing_problem)
