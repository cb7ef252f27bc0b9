"""What the routes share, as typed dependencies (``s: ServicesDep``): FastAPI hands each route
the parts it needs, and its signature says which."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.api.services import Services
from server.budgets import client_key


def services_of(request: Request) -> Services:
    """The live parts of the running server (`server.api.app` sets them when it starts). A
    route on a hot path calls this itself: FastAPI resolves a dependency, any dependency, at a
    cost per request (with `ServicesDep`, a digest stamp took ~5% more CPU in the HTTP
    process)."""
    s: Services = request.app.state.services
    return s


async def services(request: Request) -> Services:
    return services_of(request)


async def client(request: Request) -> bytes:
    """The client, as its per-client budgets count it (`server.budgets.client_key`)."""
    return client_key(request.client.host if request.client else None)


ServicesDep = Annotated[Services, Depends(services)]
ClientDep = Annotated[bytes, Depends(client)]
