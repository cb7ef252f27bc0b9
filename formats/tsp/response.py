"""RFC 3161 responses (§2.4.2): the ``TimeStampResp`` that grants a token, and the one that
refuses a request (:class:`Rejection`, :func:`rejection`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from asn1crypto import cms, core, tsp

from formats.tsp.errors import TspError

__all__ = ["FAILURES", "Rejection", "TimeStampResp", "granted", "rejection"]

#: PKIFailureInfo names (RFC 3161 §2.4.2) → asn1crypto's bit names.
FAILURES: Mapping[str, str] = {
    "badAlg": "bad_alg",
    "badRequest": "bad_request",
    "badDataFormat": "bad_data_format",
    "timeNotAvailable": "time_not_available",
    "unacceptedPolicy": "unaccepted_policy",
    "unacceptedExtension": "unaccepted_extensions",
    "addInfoNotAvailable": "add_info_not_available",
    "systemFailure": "system_failure",
}


class TimeStampResp(core.Sequence):
    """``TimeStampResp`` with the token OPTIONAL, as RFC 3161 has it.

    asn1crypto 1.5's ``tsp.TimeStampResp`` makes ``timeStampToken`` mandatory, so it can neither
    write nor read a rejection.
    """

    _fields = [
        ("status", tsp.PKIStatusInfo),
        ("time_stamp_token", cms.ContentInfo, {"optional": True}),
    ]


class Rejection(ValueError):
    """A request the TSA refuses; :func:`rejection` makes the response to send back.

    ``failure`` is the RFC 3161 PKIFailureInfo name (a key of :data:`FAILURES`), ``text`` a
    sentence for the client's statusString. It carries no HTTP status: RFC 3161 answers a
    rejection inside a normal response.
    """

    def __init__(self, failure: str, text: str) -> None:
        if failure not in FAILURES:
            raise TspError(f"unknown PKIFailureInfo {failure!r}")
        super().__init__(f"{failure}: {text}")
        self.failure = failure
        self.text = text


def rejection(failure: str, text: str) -> bytes:
    """The DER ``TimeStampResp`` that refuses a request: status rejection, ``text``, ``failure``."""
    if failure not in FAILURES:
        raise TspError(f"unknown PKIFailureInfo {failure!r}")
    response = TimeStampResp(
        {
            "status": {
                "status": "rejection",
                "status_string": [text],
                "fail_info": {FAILURES[failure]},
            }
        }
    )
    return bytes(response.dump())


def granted(token: bytes) -> bytes:
    """The DER ``TimeStampResp`` with status granted that carries ``token`` (a ContentInfo,
    DER, as `formats.tsp.token` makes it): the response's contents are the constant status
    and the token as they are (building the response from a loaded token took 85 us; this
    takes 3)."""
    return bytes(TimeStampResp(contents=_granted_status() + token).dump())


@functools.lru_cache(maxsize=1)
def _granted_status() -> bytes:
    return bytes(tsp.PKIStatusInfo({"status": "granted"}).dump())
