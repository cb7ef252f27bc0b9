"""formats.allowed_signers: the lines of an allowed-signers file as ssh-keygen reads them, and
when each allows its key (valid-after <= t <= valid-before, both inclusive)."""

from __future__ import annotations

import calendar
import time

import pytest

from formats.allowed_signers import (
    AllowedSignersError,
    parse_allowed_signers,
    parse_time,
    ssh_time,
)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOjb1D6TqnYYeHU1E7Xd3l0Q/2qTsxWcG4tLZVZgYl4O"
T0 = calendar.timegm((2026, 1, 1, 0, 0, 0))
T1 = calendar.timegm((2026, 7, 1, 12, 30, 15))


def test_times_in_utc_and_local() -> None:
    assert parse_time("20260101Z") == T0
    assert parse_time("20260701123015z") == T1
    assert parse_time("202607011230Z") == T1 - 15
    # Without Z the time is local: the converter given decides (ssh-keygen uses mktime).
    assert parse_time("20260101", local=lambda st: calendar.timegm(st) - 3600) == T0 - 3600
    for bad in ("2026010", "20260101123", "2026-01-01", "20261301Z", "20260101120Z"):
        with pytest.raises(AllowedSignersError):
            parse_time(bad)
    assert ssh_time(T1) == "20260701123015Z"


def test_lines_options_and_windows() -> None:
    text = "\n".join([
        "# a comment",
        "",
        f"alice@example.org {KEY} alice's laptop",
        f'bob@x,!eve@x namespaces="git,file",valid-after="20260101Z",'
        f'valid-before="20260701123015Z" {KEY}',
        f'"carol x@y" cert-authority {KEY}',
        "dave@x sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t",
        'erin@x bogus-option="1" ' + KEY,
    ])
    lines, unread = parse_allowed_signers(text)
    assert [s.line for s in lines] == [3, 4, 5]
    alice, bob, carol = lines
    assert alice.principals == ("alice@example.org",) and alice.namespaces is None
    assert alice.refusal_at(0) is None and alice.window() == "valid without a time limit"
    assert bob.principals == ("bob@x", "!eve@x") and bob.identity == "bob@x"
    assert bob.namespaces == ("git", "file") and bob.allows_namespace("git")
    assert not bob.allows_namespace("stampd")
    assert (bob.valid_after, bob.valid_before) == (T0, T1)
    assert bob.refusal_at(T0) is None and bob.refusal_at(T1) is None  # inclusive
    assert bob.refusal_at(T0 - 1) == "valid-after 2026-01-01T00:00:00Z"
    assert bob.refusal_at(T1 + 1) == "valid-before 2026-07-01T12:30:15Z"
    assert bob.window() == "valid from 2026-01-01T00:00:00Z until 2026-07-01T12:30:15Z"
    assert carol.principals == ("carol x@y",) and carol.cert_authority
    assert alice.key.fingerprint == bob.key.fingerprint
    # A FIDO key and an unknown option are left to ssh-keygen, and said.
    assert [u.split(":")[0] for u in unread] == ["line 6", "line 7"]


def test_quoted_commas_and_errors() -> None:
    lines, unread = parse_allowed_signers(f'a@x namespaces="git,x",valid-before="20300101" {KEY}')
    assert lines[0].namespaces == ("git", "x")
    assert lines[0].valid_before == int(time.mktime(time.strptime("20300101", "%Y%m%d")))
    _, unread = parse_allowed_signers(f'a@x namespaces="git {KEY}\nb@x\n')
    assert len(unread) == 2
