"""HTTP for talking to a Zeitgitter server, written once: a GET or a form POST with a timeout,
a size limit, and no redirects (a Zeitgitter server must not redirect; a redirect is an answer
like any other non-200 status). A TLS failure is said in one line of our own (`tls_problem`,
for git's words too), never OpenSSL's."""

from __future__ import annotations

import re
import ssl
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
        cause = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(cause, ssl.SSLError):
            said = tls_problem(url, cause)
            raise FetchError(url, said, reason=said) from None
        raise FetchError(url, str(e), reason=str(getattr(e, "reason", e))) from None


# OpenSSL's reasons for a first answer that is no TLS record: an http:// server's "HTTP/1.1 400"
NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL",
                     "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"})
# git's words (over libcurl with GnuTLS or OpenSSL) for the same, and for a certificate
_GIT_NOT_TLS = re.compile(r"unexpected TLS packet|wrong version number|record layer failure|"
                          r"unknown protocol|packet length too long", re.IGNORECASE)
_GIT_CERTIFICATE = re.compile(r"certificate verification failed|SSL certificate problem|"
                              r"certificate verify failed", re.IGNORECASE)


def tls_problem(url: str, error: ssl.SSLError | str) -> str:
    """One line saying what went wrong with TLS talking to ``url``: an ``ssl.SSLError``, or
    git's error output (``str``, for which an empty string comes back when it is not about
    TLS). ``https://`` against an http:// server: ``HOST:PORT does not speak TLS; use
    http://HOST:PORT``; a certificate: ``the TLS certificate of HOST:PORT is not trusted``."""
    address = urllib.parse.urlsplit(url).netloc
    if isinstance(error, str):
        if _GIT_NOT_TLS.search(error):
            return f"{address} does not speak TLS; use http://{address}"
        if _GIT_CERTIFICATE.search(error):
            return (f"the TLS certificate of {address} is not trusted (git could not verify "
                    "it against the system's certificate authorities)")
        return ""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"the TLS certificate of {address} is not trusted ({error.verify_message})"
    if error.reason in NOT_TLS:
        return f"{address} does not speak TLS; use http://{address}"
    if isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return f"{address} closed the connection during the TLS handshake (not a TLS server?)"
    return f"TLS with {address} failed ({(error.reason or str(error)).lower()})"
