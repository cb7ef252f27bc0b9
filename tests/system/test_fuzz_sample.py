"""A sample of `make fuzz` (bench/fuzz.py, bench/README.md): ~300 generated and mutated
requests through the same code, against one real server on SQLite, with the same promises: no
answer ≥ 500, no hang, no worker restart, no traceback, nothing refused in the journal or the
log, `stampd audit` passes; the server keeps its transparency log, whose proofs and tiles are
fuzzed too. The full runs (10,000 requests, SQLite and PostgreSQL) are
`make fuzz`.

The checks themselves are checked against a tiny server that misbehaves on purpose (a 500, a
hang, a close, garbage, a leak), and against a journal that holds a refused marker: a fuzzer
that cannot fail proves nothing. Inputs the fuzzer found mishandled are pinned down last.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from pathlib import Path

import pytest

from bench.fuzz import DbResult, Options, fuzz_database, run_cases, summary
from bench.fuzz_http import EXPECT_REJECT, PARSER_400, Case, Outcome, Req
from bench.fuzz_server import Ledger
from bench.fuzz_verdict import Tally
from server.api.body import read_body
from server.errors import BadRequest
from server.settings import Settings
from tests.helpers import Server

SAMPLE = Options(requests=300, seed=20261124, concurrency=16)


def test_fuzz_sample_keeps_every_promise() -> None:
    result = fuzz_database("sqlite", SAMPLE, report=None)
    report = summary(result, SAMPLE)
    assert result.ok, report
    t = result.tally
    # Not vacuous: every generator ran, requests were stamped and refused, the log was read.
    assert t.total == SAMPLE.requests, report
    assert {"schema+", "schema-", "form", "digest", "framing", "methods", "paths",
            "pipeline", "tlog"} <= set(t.requests), report
    # The transparency log's reads (the server keeps one): proofs and tiles asked for, some
    # served (they exist), none a 5xx (the judge counts those as failures above).
    # (300 requests draw few of each kind: a proof by serial or git id, and a bundle, at least)
    proofs = [e for e in t.by_endpoint if e.startswith("/v1/proofs/")]
    assert sum(t.by_endpoint[e]["200"] for e in proofs) >= 1, report
    assert t.by_endpoint["/tlog/tile/entries/..."]["200"] >= 1, report
    assert t.statuses["200"] > 20 and t.accepted and len(t.refused_markers) > 50, report
    assert result.ledger is not None and result.ledger.log_commits >= 1, report
    assert t.accepted <= result.ledger.values, report


# -- the checks catch what they are for --------------------------------------------------------


async def _bad_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """200 "ok", except: /boom 500, /hang nothing, /close a close, /garbage no HTTP,
    /leak a secret key block."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ")[1]
        if path == b"/hang":
            await asyncio.sleep(3600)
        answers = {
            b"/boom": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom",
            b"/close": b"",
            b"/garbage": b"NOT HTTP AT ALL\r\n\r\n",
            b"/leak": b"HTTP/1.1 200 OK\r\nContent-Length: 37\r\n\r\n"
                      b"-----BEGIN PGP PRIVATE KEY BLOCK-----",
        }
        writer.write(answers.get(path, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _get(path: str, *, expect: str | None = None, may_close: str | None = None) -> Case:
    wire = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    return Case("test", path, [wire], [Req("GET", path, (), expect)], may_close=may_close)


def test_the_checks_catch_a_5xx_a_hang_a_close_garbage_and_a_leak() -> None:
    cases = [_get("/boom"), _get("/hang"), _get("/close"), _get("/garbage"), _get("/leak"),
             _get("/ok"), _get("/ok", expect=EXPECT_REJECT),
             _get("/close", may_close="a reason the protocol gives")]
    tally = Tally()

    async def main() -> None:
        srv = await asyncio.start_server(_bad_server, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            await run_cases(cases, "127.0.0.1", port, 8, 1.0, tally)
        finally:
            srv.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 2)

    asyncio.run(main())
    assert tally.failures == Counter({"5xx": 1, "hang": 1, "closed without answer": 1,
                                      "garbled answer": 1, "leak": 1, "oracle mismatch": 1})
    assert tally.allowed_closes == Counter({"a reason the protocol gives": 1})
    assert tally.total == len(cases)


def test_a_refused_marker_in_the_journal_or_the_log_fails_the_run() -> None:
    refused, stamped = "ab" * 20, "cd" * 20
    result = DbResult("sqlite", audit_ok=True, metric_restarts=0)
    result.tally.rejected = {refused}
    result.tally.accepted = {stamped}
    result.ledger = Ledger(stamps=2, values={refused, stamped}, published={stamped},
                           log_commits=1, log_values={refused, stamped}, settled=True)
    result.judge()
    assert any("refused request(s) in the journal" in p for p in result.problems)
    assert any("refused request(s) in the log" in p for p in result.problems)


def test_an_answer_ahead_of_its_turn_is_caught() -> None:
    """The parser's 400 for bytes after a well-formed request, sent before that request's own
    answer: the client takes it for the answer to its (journaled) request."""
    wire = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n"
    case = Case("test", "then garbage", [wire], [Req("GET", "/healthz")], trailing_junk=True)
    tally = Tally()
    tally.judge(case, [Outcome("answered", 400, [(b"connection", b"close")], PARSER_400)])
    assert tally.failures["answered out of order"] == 1


# -- inputs the fuzzer found mishandled --------------------------------------------------------


def _post(server: Server, body: bytes, ctype: bytes) -> int:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype
                  + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        return int(s.recv(65536).split(b" ", 2)[1])


def test_a_multipart_body_cut_short_is_refused(live_server: Server) -> None:
    """The multipart parser took a body without its close delimiter as complete and dropped
    the unterminated last part: a branch stamp whose ``parent`` part was cut off was signed
    without a parent."""
    commit, tree, parent = "1f" * 20, "2e" * 20, "3d" * 20
    parts = b"".join(
        b'--b\r\nContent-Disposition: form-data; name="' + n.encode() + b'"\r\n\r\n'
        + v.encode() + b"\r\n"
        for n, v in (("request", "stamp-branch-v1"), ("commit", commit), ("tree", tree),
                     ("parent", parent)))
    ctype = b"multipart/form-data; boundary=b"
    cut = parts[:-5]  # inside the parent part
    assert _post(live_server, cut, ctype) == 406
    assert _post(live_server, parts, ctype) == 406  # the close delimiter is missing too
    assert _post(live_server, parts + b"--b--\r\n", ctype) == 200


def test_a_lone_surrogate_quoted_in_a_refusal_is_no_500(live_server: Server) -> None:
    """JSON may carry lone surrogates (``"\\ud800"``), which UTF-8 cannot encode; a refusal
    that quoted one (an unknown key, a field given twice) failed to encode its answer: 500."""
    digest = "5e" * 32
    for body in (b'{"sha256": "' + digest.encode() + b'", "key": "SHA256:\\ud800"}',
                 b'{"\\ud800": "a", "\\ud800": "b"}'):
        with socket.create_connection(("127.0.0.1", live_server.port), timeout=10) as s:
            s.sendall(b"POST /v1/stamps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"\\\\ud800" in answer, answer  # quoted as text, in JSON


def test_a_content_length_of_other_digits_is_a_bad_request(tmp_path: Path) -> None:
    """``"²".isdigit()`` is true, but ``int("²")`` fails: the check took it for a number (the
    HTTP parser refuses such a header before the app sees it; this is the app's own check)."""
    scope = {"type": "http", "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", "\u00b2".encode("latin-1"))]}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    with pytest.raises(BadRequest, match="malformed Content-Length"):
        asyncio.run(read_body(scope, receive, Settings(data_dir=tmp_path),
                              ("application/json",)))
