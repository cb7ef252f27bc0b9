"""``/v1/keys``: the server's signing keys, and the SSH keys' ``allowed_signers`` file."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from formats.keys import SSH_NAMESPACES, allowed_signers
from server.api.services import Services
from server.errors import NotFound


def add_key_routes(router: APIRouter, services: Callable[[], Services]) -> None:
    @router.get("/v1/keys")
    async def keys() -> Response:
        """Every signing key: id, format, fingerprint, algorithm, purpose (``stamps``, or
        ``rfc3161`` for the TSA key, which signs RFC 3161 tokens only), public key, and for
        SSH keys the allowed-signers line (namespaces git and stampd)."""
        return JSONResponse({"keys": [
            {"id": k.id, "format": k.format, "fingerprint": k.fingerprint,
             "algorithm": k.algorithm, "primary": k.primary, "purpose": k.purpose,
             "public_key": k.public,
             "allowed_signers": k.allowed_signers(SSH_NAMESPACES)}
            for k in services().keys]})

    @router.get("/v1/keys/allowed_signers")
    async def get_allowed_signers() -> Response:
        """For `git config gpg.ssh.allowedSignersFile` and `ssh-keygen -Y verify -f`."""
        text = allowed_signers(services().keys)
        if not text:
            raise NotFound("this server has no SSH key")
        return PlainTextResponse(text)
