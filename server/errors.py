"""The one error hierarchy of stampd. Domain code raises these; `server.app` maps them to HTTP."""

from __future__ import annotations


class StampError(Exception):
    """Base class. `status` is the HTTP status the edge answers with."""

    status = 500
    title = "Internal Server Error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(StampError):
    """A field is missing or malformed, or the request type is unknown (Zeitgitter: 406)."""

    status = 406
    title = "Not Acceptable"


class ValidationFailed(StampError):
    """Malformed input to the /v1 API (400)."""

    status = 400
    title = "Bad Request"


class NotFound(StampError):
    status = 404
    title = "Not Found"


class InvalidCommitId(BadRequest):
    pass


class InvalidTagName(BadRequest):
    pass


class UnknownRequest(BadRequest):
    pass


class LengthRequired(StampError):
    status = 411
    title = "Length Required"


class BodyTooLarge(StampError):
    status = 413
    title = "Content Too Large"


class UnsupportedMediaType(StampError):
    status = 415
    title = "Unsupported Media Type"


class RequestTimeout(StampError):
    status = 408
    title = "Request Timeout"


class Unavailable(StampError):
    """The server cannot take the request now; the client should retry later (503)."""

    status = 503
    title = "Service Unavailable"
    retry_after = 5


class QueueFull(Unavailable):
    retry_after = 2


class SigningFailed(Unavailable):
    """Every attempt to sign a stamp failed (workers or agents died, or timed out)."""


class JournalError(Unavailable):
    """The journal could not record the request durably."""


class KeyStoreError(StampError):
    """The key store is missing, unreadable or inconsistent (configuration error)."""


class PeerError(StampError):
    """A peer could not be reached, or its answer failed a check."""

    status = 502
    title = "Bad Gateway"
