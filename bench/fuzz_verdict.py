"""Judging the fuzzer's exchanges: every request's outcome is counted (per generator and per
status) and checked against the promises that hold for any input:

- no answer is a 5xx;
- every request is answered, or the connection closed, within the bound (no hang), and an
  answer is a well-formed HTTP response;
- a request with valid HTTP framing gets an answer; closing without one is allowed only where
  the case says why the protocol allows it (malformed HTTP), and those reasons are counted;
- pipelined requests are answered in order: a request with valid framing never gets the
  parser's "Invalid HTTP request received." 400, which belongs to bytes that came after it;
- where the protocol rules decide a request (`EXPECT_OK`, `EXPECT_REJECT`), the answer agrees;
- no answer leaks what must never leave the server (a secret key, the repository's config,
  a Python traceback).

The markers of each request go into one of three sets: ``accepted`` (a POST answered 200: it was
stamped), ``rejected`` (answered 4xx: it must have left no trace), ``unsettled`` (no answer, a
5xx, a GET: nothing can be said). `Tally.refused_markers` is what must not be found in the
journal or the log afterwards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.fuzz_http import (
    ANSWERED,
    CLOSED,
    EXPECT_OK,
    EXPECT_REJECT,
    GARBLED,
    HANG,
    NOT_SENT,
    SKIPPED,
    Case,
    Outcome,
    Req,
)

# Bytes no answer may contain, whatever was asked.
LEAKS = (b"PRIVATE KEY", b"repositoryformatversion", b"root:x:0:0", b"Traceback (most recent",
         b"sqlalchemy.exc", b"SQLite format 3")

def endpoint_of(target: str) -> str:
    """The endpoint a request target is for, for the report: the transparency log's apart
    (a proof with and without ``?wait=``), everything else by its first path segment."""
    path, _, query = target.partition("?")
    waits = "?wait" if "wait=" in query else ""
    if path.startswith("/v1/proofs/git/"):
        return "/v1/proofs/git/<id>" + waits
    if path.startswith("/v1/proofs/"):
        return "/v1/proofs/<serial>" + waits
    if path in ("/tlog/checkpoint", "/tlog/vkey"):
        return path
    if path.startswith("/tlog/tile/entries/"):
        return "/tlog/tile/entries/..."
    if path.startswith("/tlog/tile/"):
        return "/tlog/tile/<L>/..."
    if path.startswith("/tlog"):
        return "/tlog (other)"
    if not path.startswith("/"):
        return "(no path)"
    return "/" + path[1:].split("/", 1)[0][:20]


FAILURE_KINDS = ("5xx", "hang", "closed without answer", "garbled answer", "no connection",
                 "answered out of order", "oracle mismatch", "leak")


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)  # by generator
    statuses: Counter[str] = field(default_factory=Counter)  # "200", "closed", ...
    by_generator: dict[str, Counter[str]] = field(default_factory=dict)
    by_endpoint: dict[str, Counter[str]] = field(default_factory=dict)  # `endpoint_of`
    allowed_closes: Counter[str] = field(default_factory=Counter)  # by the case's reason
    failures: Counter[str] = field(default_factory=Counter)  # by FAILURE_KINDS
    examples: dict[str, list[str]] = field(default_factory=dict)  # the first of each kind
    accepted: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    unsettled: set[str] = field(default_factory=set)
    slowest: float = 0.0
    max_examples: int = 5  # per kind

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    @property
    def refused_markers(self) -> set[str]:
        """Markers only refused requests carried."""
        return self.rejected - self.accepted - self.unsettled

    def fail(self, kind: str, case: Case, req: Req, out: Outcome, why: str = "") -> None:
        self.failures[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < self.max_examples:
            wire = b"".join(case.wire)
            shown.append(
                f"{kind}: [{case.generator}] {case.label}: {req.method} {req.target[:80]!r} -> "
                f"{out.kind} {out.status or ''} {out.detail} {why}\n"
                f"    sent ({len(wire)} bytes): {wire[:300]!r}\n"
                f"    answer: {out.body[:200]!r}")

    def judge(self, case: Case, outcomes: list[Outcome]) -> None:
        gen = self.by_generator.setdefault(case.generator, Counter())
        wire = b"".join(case.wire)
        for i, (req, out) in enumerate(zip(case.reqs, outcomes, strict=True)):
            self.requests[case.generator] += 1
            key = str(out.status) if out.kind == ANSWERED else out.kind
            self.statuses[key] += 1
            gen[key] += 1
            self.by_endpoint.setdefault(endpoint_of(req.target), Counter())[key] += 1
            self.slowest = max(self.slowest, out.seconds)
            # A marker cut off by a mutation (a truncated body) was not sent: it says nothing.
            markers = {m for m in req.markers if m.encode() in wire}
            if out.kind == ANSWERED:
                self._answered(case, i, req, out, markers)
            elif out.kind == SKIPPED:
                self.unsettled |= markers
            elif out.kind == CLOSED:
                self.unsettled |= markers
                if case.may_close:
                    self.allowed_closes[case.may_close] += 1
                elif not req.well_formed:
                    self.allowed_closes["malformed request"] += 1
                else:
                    self.fail("closed without answer", case, req, out)
            else:
                self.unsettled |= markers
                kind = {HANG: "hang", GARBLED: "garbled answer",
                        NOT_SENT: "no connection"}.get(out.kind, out.kind)
                self.fail(kind, case, req, out)

    def _answered(self, case: Case, i: int, req: Req, out: Outcome, markers: set[str]) -> None:
        status = out.status or 0
        for leak in LEAKS:
            if leak in out.body:
                self.fail("leak", case, req, out, f"answer holds {leak!r}")
        if status >= 500:
            self.unsettled |= markers
            self.fail("5xx", case, req, out)
            return
        followed = i < len(case.reqs) - 1 or case.trailing_junk
        if out.parser_400 and req.well_formed and followed:
            # The parser's answer to the bytes after this request, sent before this request
            # was answered: the client takes it for this request's answer.
            self.unsettled |= markers
            self.fail("answered out of order", case, req, out,
                      "(the parser's 400 for later bytes came first)")
            return
        if status == 200 and req.method == "POST":
            self.accepted |= markers
        elif 400 <= status < 500:
            self.rejected |= markers
        else:
            self.unsettled |= markers
        if req.expect == EXPECT_OK and status != 200:
            self.fail("oracle mismatch", case, req, out, "(the rules say: accept)")
        elif req.expect == EXPECT_REJECT and not 400 <= status < 500:
            self.fail("oracle mismatch", case, req, out, "(the rules say: refuse)")
