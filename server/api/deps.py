"""What the routes share, as typed dependencies (``s: ServicesDep``): FastAPI hands each route
the parts it needs, and its signature says which."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.api.ratelimit import client_key
from server.api.services import Services


async def services(request: Request) -> Services:
    """The live parts of the running server (`server.api.app` sets them when it starts)."""
    s: Services = request.app.state.services
    return s


async def client(request: Request) -> bytes:
    """The client, as its per-client budgets count it (`server.api.ratelimit.client_key`)."""
    return client_key(request.client.host if request.client else None)


ServicesDep = Annotated[Services, Depends(services)]
ClientDep = Annotated[bytes, Depends(client)]
