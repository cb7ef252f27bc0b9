"""A sample of `make fuzz`'s SMTP section (bench/fuzz_mail.py): a few hundred malformed and
hostile SMTP sessions against a real stampd with its mail listener, replies at a real SMTP
server: 0 crashes, 0 replies to what must not be answered, one reply per 250. And the judge
itself catches what it is for (a fuzzer that cannot fail proves nothing)."""

from __future__ import annotations

import random
from collections import Counter

from bench.fuzz_mail import Outcome, RelayStore, Result, fuzz_mail, judge, make_session, summary


def test_fuzz_mail_sample_keeps_every_promise() -> None:
    result = fuzz_mail(sessions=300, seed=20261202, concurrency=8)
    report = summary(result, 20261202)
    assert result.ok, report
    # Not vacuous: every kind ran, some were stamped and answered, some refused.
    assert len(result.kinds) == 15, report
    assert result.answered > 20 and result.data_codes["554"] and result.data_codes["550"], report


def test_the_judge_catches_what_it_is_for() -> None:
    rng = random.Random(1)
    sessions = [make_session(rng, i) for i in range(200)]
    refused = next(s for s in sessions if not s.answerable)
    answerable = next(s for s in sessions if s.answerable)
    relay = RelayStore.__new__(RelayStore)  # (its counts only: no server started)
    relay.to = Counter({refused.sender.lower(): 1})
    result = Result()
    judge([refused, answerable], [Outcome(data_code=550), Outcome(data_code=250)], relay,
          result)
    # the reply to what must not be answered, and the 250 without a reply
    assert len(result.problems) == 2, result.problems
    result = Result()
    judge([answerable], [Outcome(data_code=None, internal=True, hung=True)], relay, result)
    assert len(result.problems) == 2, result.problems  # the internal error, the hang
