"""The one error hierarchy of the service. Domain code raises these; they say what went wrong,
never how to answer it: each front end maps them once (`server.api.errors` for HTTP, the
``stampd`` command line for exit codes)."""

from __future__ import annotations


class StampError(Exception):
    """Base class of everything the service refuses or cannot do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(StampError):
    """A field is missing, malformed or given twice, or the request type is unknown."""


class BadManifest(BadRequest):
    """Lines of a manifest that are not checksum lines: ``lines`` holds the first of their line
    numbers (1-based), ``count`` how many there are."""

    def __init__(self, message: str, lines: list[int], count: int) -> None:
        super().__init__(message)
        self.lines = lines
        self.count = count


class InvalidCommitId(BadRequest):
    pass


class InvalidTagName(BadRequest):
    pass


class UnknownRequest(BadRequest):
    pass


class NotFound(StampError):
    """What was asked for does not exist (no receipt for a digest, no SSH key)."""


class NotInLogYet(NotFound):
    """A stamp the transparency log does not cover yet (no entry, or no checkpoint of a size
    that includes it): ask again after `retry_after` seconds."""

    retry_after = 1


class LengthRequired(StampError):
    """A request body came without a length."""


class BodyTooLarge(StampError):
    """A request body is larger than the limit."""


class UnsupportedMediaType(StampError):
    """A request body of a type the endpoint does not take."""


class RequestTimeout(StampError):
    """A request body did not arrive in time (or the client went away)."""


class Unavailable(StampError):
    """The server cannot take the request now; the client should retry after `retry_after`
    seconds."""

    retry_after = 5


class QueueFull(Unavailable):
    retry_after = 2


class SigningFailed(Unavailable):
    """Every attempt to sign a stamp failed (workers or agents died, or timed out)."""


class MalformedAnswer(SigningFailed):
    """A worker's signed answer is not what its job asked for (``detail`` says how); the
    client is told only that it was malformed."""

    def __init__(self, detail: str) -> None:
        super().__init__("the worker's answer was malformed")
        self.detail = detail


class JournalError(Unavailable):
    """The journal could not record the request durably."""


class ClockUnsynchronised(Unavailable):
    """The kernel reports the clock unsynchronised, and the settings say that RFC 3161 tokens
    are not issued then."""


class MailRefused(StampError):
    """A message stampd must never answer (a bounce, an automatic or list message, a sender
    the MTA in front did not pass, a malformed one): refused for good, nothing recorded."""


class NotOurAddress(MailRefused):
    """A recipient that is not one of the service's own addresses: stampd relays nothing."""


class MalformedMessage(MailRefused):
    """A message that cannot be read, or carries more attachments than are stamped."""


class RelayFailed(Unavailable):
    """The reply could not be handed to the relay (STAMPD_MAIL_RELAY): the message is refused
    for now, and its sender's MTA, which keeps it, sends it again later."""


class PeerError(StampError):
    """A peer could not be reached, or its answer failed a check."""


class KeyRegistryError(StampError):
    """This host's key files disagree with the keys registered in the database, or there are
    no keys to serve (a start-up error)."""


class CommandFailed(StampError):
    """A server command (``stampd serve``, ``worker``, ``db``, ``keys``, ``tsa``) cannot do
    its work: a key that cannot sign, an address that cannot be listened on, a database at the
    wrong revision. ``usage``: the arguments or settings are at fault (the command line's exit
    status 2, else 1)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage
