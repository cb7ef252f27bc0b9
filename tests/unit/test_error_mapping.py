"""Domain errors carry no HTTP status; each front end maps them once, in its own dialect."""

from __future__ import annotations

import json

import pytest

from server.api.errors import plain, problem, status_of
from server.errors import (
    BadRequest,
    BodyTooLarge,
    InvalidTagName,
    JournalError,
    LengthRequired,
    MalformedAnswer,
    NotFound,
    PeerError,
    QueueFull,
    RequestTimeout,
    StampError,
    UnsupportedMediaType,
)


@pytest.mark.parametrize(("exc", "zeitgitter", "v1"), [
    (BadRequest("x"), 406, 400),
    (InvalidTagName("x"), 406, 400),
    (NotFound("x"), 404, 404),
    (RequestTimeout("x"), 408, 408),
    (LengthRequired("x"), 411, 411),
    (BodyTooLarge("x"), 413, 413),
    (UnsupportedMediaType("x"), 415, 415),
    (PeerError("x"), 502, 502),
    (QueueFull("x"), 503, 503),
    (JournalError("x"), 503, 503),
    (MalformedAnswer("x"), 503, 503),
    (StampError("x"), 500, 500),
])
def test_status_in_each_dialect(exc: StampError, zeitgitter: int, v1: int) -> None:
    assert not hasattr(exc, "status")
    assert status_of(exc, "zeitgitter")[0] == zeitgitter
    assert status_of(exc, "v1")[0] == v1


def test_problem_details_and_retry_after() -> None:
    r = problem(QueueFull("too many"))
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.media_type == "application/problem+json"
    assert json.loads(bytes(r.body)) == {"type": "about:blank", "title": "Service Unavailable",
                                         "status": 503, "detail": "too many"}
    assert "retry-after" not in problem(BadRequest("no")).headers


def test_plain_answers_of_the_app() -> None:
    r = plain(NotFound("RFC 3161 time-stamping is off on this server"))
    assert (r.status_code, r.body) == (404, b"RFC 3161 time-stamping is off on this server\n")
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert "retry-after" not in r.headers
    assert plain(QueueFull("busy")).headers["retry-after"] == "2"
