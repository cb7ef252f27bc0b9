"""HTTP for talking to a Zeitgitter server, written once: a GET or a form POST with a timeout,
a size limit, and no redirects (a Zeitgitter server must not redirect; a redirect is an answer
like any other non-200 status)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

USER_AGENT = "stampd"


class FetchError(Exception):
    """No 200 answer. ``status``: the HTTP status the server answered with (a redirect
    included), or None when there was no answer; ``reason``: why there was none (or the
    status line); ``str()``: the underlying error as urllib words it."""

    def __init__(self, url: str, detail: str, *, status: int | None = None,
                 reason: str | None = None, retry_after: str | None = None) -> None:
        super().__init__(detail)
        self.url = url
        self.status = status
        self.reason = detail if reason is None else reason
        self.retry_after = retry_after  # the answer's Retry-After header, if any


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # urllib then raises HTTPError with the redirect's status


_OPENER = urllib.request.build_opener(_NoRedirect)


def http_request(url: str, *, form: Mapping[str, str] | None = None, data: bytes | None = None,
                 content_type: str = "text/plain", timeout: float, limit: int) -> bytes:
    """The body of a 200 answer to a GET (or, with ``form``, a form POST; with ``data``, a POST
    of those bytes as ``content_type``) of ``url``.

    At most ``limit + 1`` bytes are read: a longer body comes back as ``limit + 1`` bytes, so
    the caller can tell it was too long. Raise `FetchError` for anything but a 200 answer.
    """
    headers = {"User-Agent": USER_AGENT}
    body = None
    if form is not None:
        body = urllib.parse.urlencode(form).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif data is not None:
        body = data
        headers["Content-Type"] = content_type
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as r:
            if r.status != 200:
                raise FetchError(url, f"HTTP {r.status}", status=r.status)
            answer: bytes = r.read(limit + 1)
            return answer
    except urllib.error.HTTPError as e:
        raise FetchError(url, str(e), status=e.code, reason=str(e.reason),
                         retry_after=e.headers.get("Retry-After") if e.headers else None
                         ) from None
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(url, str(e), reason=str(getattr(e, "reason", e))) from None
