"""The stamping server: its URL (``--server``, ``$STAMPD_SERVER`` or git config) and the requests
to it, a git stamp's form POST and a files manifest's ``POST /v1/manifests``."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from client.fetch import FetchError, http_request
from client.stamp.answers import MAX_STAMP
from client.stamp.errors import AnswerRefused, StampFailed, UsageError
from client.stamp.git import git_config

HTTP_TIMEOUT = 30.0
SERVER_ENV = "STAMPD_SERVER"
MANIFEST_SLACK = 64 * 1024  # bytes an answer may have beyond the lines sent (header, signature)


def server_url(repo: Path, given: str | None) -> str:
    """``--server``, else ``$STAMPD_SERVER``, else ``git config timestamp.server`` (its first
    entry, as ``git timestamp`` takes for one tag or branch); ``https://`` is added to a bare host
    name, as ``git timestamp`` does; a bare ``host:port`` is refused, naming the URL meant (it
    would become https and fail on TLS against a local http server)."""
    server = given or os.environ.get(SERVER_ENV) or git_config(repo, "timestamp.server")
    if not server:
        raise UsageError(f"no server: give --server URL, set {SERVER_ENV}, or git config "
                         "timestamp.server URL")
    server = server.split(",")[0].strip()
    if "://" not in server:
        host, sep, port = server.rpartition(":")
        if sep and host and port.isdigit():  # a bare host:port: most likely a local http server
            raise UsageError(f"the server needs a scheme: give http://{server} (or "
                             f"https://{server}), not {server!r}")
        server = "https://" + server  # a bare host name, as `git timestamp` takes it
    parts = urllib.parse.urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname \
            or any(not ("!" <= c <= "~") for c in server):
        raise UsageError(f"the server must be an http:// or https:// URL, not {server!r}")
    return server


def post(server: str, form: dict[str, str]) -> str:
    try:
        body = http_request(server, form=form, timeout=HTTP_TIMEOUT, limit=MAX_STAMP)
    except FetchError as e:
        if e.status is not None:
            raise StampFailed(f"{server} answered HTTP {e.status}: {e.reason}") from None
        raise StampFailed(f"cannot reach {server}: {e.reason}") from None
    if len(body) > MAX_STAMP:
        raise AnswerRefused(f"the answer is longer than {MAX_STAMP} bytes")
    return body.decode("latin-1")



def post_manifest(server: str, body: bytes, query: dict[str, str]) -> bytes:
    url = server.rstrip("/") + "/v1/manifests"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    limit = len(body) + MANIFEST_SLACK
    try:
        answer = http_request(url, data=body, content_type="text/plain", limit=limit,
                              timeout=HTTP_TIMEOUT + len(body) / (1 << 20))
    except FetchError as e:
        if e.status is not None:
            raise StampFailed(f"{url} answered HTTP {e.status}: {e.reason}") from None
        raise StampFailed(f"cannot reach {server}: {e.reason}") from None
    if len(answer) > limit:
        raise AnswerRefused(f"the answer is more than {MANIFEST_SLACK} bytes longer than the "
                            "manifest sent")
    return answer

