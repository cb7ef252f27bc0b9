"""``/v1/keys``: the server's signing keys, and the SSH keys' ``allowed_signers`` file."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from formats.keys import SSH_NAMESPACES, allowed_signers
from server.api.deps import ServicesDep
from server.api.openapi import problems
from server.errors import NotFound


@with_config(ConfigDict(extra="forbid"))
class Key(TypedDict):
    id: str
    format: Literal["openpgp", "ssh"]
    fingerprint: str
    algorithm: str
    primary: bool
    purpose: Annotated[Literal["stamps", "rfc3161", "tlog", "witness", "mail"], Field(
        description="what the key signs: stamps; RFC 3161 time-stamp tokens only (the TSA "
                    "key); the transparency log's checkpoints only (the log key); other "
                    "logs' cosignatures only (the witness key); or the receipts of mail "
                    "stamped only (the mail key). key= chooses none of the last four")]
    public_key: Annotated[str, Field(
        description="ASCII-armored OpenPGP key or OpenSSH public key line")]
    allowed_signers: Annotated[str | None, Field(
        description="SSH keys: the allowed-signers line (namespaces git and stampd)")]


@with_config(ConfigDict(extra="forbid"))
class Keys(TypedDict):
    keys: Annotated[list[Key], Field(min_length=1)]


def add_key_routes(router: APIRouter) -> None:
    @router.get("/v1/keys", tags=["keys"], operation_id="getKeys",
                summary="Every signing key of this server", response_model=Keys,
                response_description="the keys, the primary key first")
    async def keys(s: ServicesDep) -> Response:
        return JSONResponse({"keys": [
            {"id": k.id, "format": k.format, "fingerprint": k.fingerprint,
             "algorithm": k.algorithm, "primary": k.primary, "purpose": k.purpose,
             "public_key": k.public,
             "allowed_signers": k.allowed_signers(SSH_NAMESPACES)}
            for k in s.keys]})

    @router.get("/v1/keys/allowed_signers", tags=["keys"], operation_id="getAllowedSigners",
                summary="The SSH keys as allowed-signers lines",
                response_class=PlainTextResponse, response_description="one line per SSH key",
                responses=problems(404, s404="this server has no SSH key"))
    async def get_allowed_signers(s: ServicesDep) -> Response:
        """For `git config gpg.ssh.allowedSignersFile` and `ssh-keygen -Y verify -f`."""
        text = allowed_signers(s.keys)
        if not text:
            raise NotFound("this server has no SSH key")
        return PlainTextResponse(text)
