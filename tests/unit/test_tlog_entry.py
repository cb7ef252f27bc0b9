"""The transparency log's entries (formats.tlog.entry): canonical text, refused otherwise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formats.tlog.entry import Entry, MalformedEntry

FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
SSH_FPR = "SHA256:" + "A" * 43
C1 = "a" * 40
C2 = "b" * 64


def test_digest_entry_text() -> None:
    e = Entry(42, "digest", 1_764_170_000, FPR, algorithm="sha256", digest="c" * 64)
    assert e.encode() == (
        b"stampd-tlog-entry/v1\nserial 42\nkind digest\ntime 1764170000\n"
        b"key " + FPR.encode() + b"\ndigest sha256 " + b"c" * 64 + b"\n")
    assert Entry.parse(e.encode()) == e


@pytest.mark.parametrize("entry", [
    Entry(1, "tag", 5, FPR, commit=C1, object_id=C1.replace("a", "d")),
    Entry(2, "branch", 5, SSH_FPR, commit=C2, object_id=C2),
    Entry(3, "tag", 5, FPR, commit=C1),  # answer never recorded
    Entry(4, "manifest", 5, FPR, signed="e" * 64),
    Entry(5, "manifest", 5, FPR),
    Entry(6, "tsa", 5, FPR, algorithm="sha512", digest="f" * 128),
])
def test_round_trip(entry: Entry) -> None:
    assert Entry.parse(entry.encode()) == entry


@pytest.mark.parametrize("kwargs", [
    {"kind": "other"},
    {"kind": "tag"},  # no commit
    {"kind": "tag", "commit": "A" * 40},
    {"kind": "tag", "commit": C1, "object_id": "a" * 41},
    {"kind": "digest"},
    {"kind": "digest", "algorithm": "md5", "digest": "a" * 32},
    {"kind": "digest", "algorithm": "sha256", "digest": "a" * 63},
    {"kind": "digest", "algorithm": "sha256", "digest": "a" * 64, "commit": C1},
    {"kind": "manifest", "signed": "a" * 63},
    {"kind": "tsa", "algorithm": "sha256", "digest": "a" * 64, "signed": "a" * 64},
    {"kind": "digest", "algorithm": "sha256", "digest": "a" * 64, "key": "abc"},
    {"kind": "digest", "algorithm": "sha256", "digest": "a" * 64, "serial": -1},
])
def test_invalid_entries_refused(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {"serial": 1, "time": 1, "key": FPR, **kwargs}
    with pytest.raises(MalformedEntry):
        Entry(**fields)  # type: ignore[arg-type]


GOOD = Entry(7, "digest", 9, FPR, algorithm="sha256", digest="c" * 64).encode()


@pytest.mark.parametrize("data", [
    GOOD[:-1],  # no final newline
    GOOD.replace(b"serial 7", b"serial 07"),
    GOOD.replace(b"kind digest\ntime 9\n", b"time 9\nkind digest\n"),  # order
    GOOD.replace(b"stampd-tlog-entry/v1", b"stampd-tlog-entry/v2"),
    GOOD + b"digest sha256 " + b"c" * 64 + b"\n",  # twice
    GOOD + b"extra x\n",
    GOOD.replace(b"time 9", b"time  9"),
    GOOD.replace(b"kind", b"k\xc3\xa9nd"),
    GOOD + b"\n",
    b"",
    b"x" * 2000,
])
def test_non_canonical_bytes_refused(data: bytes) -> None:
    with pytest.raises(MalformedEntry):
        Entry.parse(data)


@given(st.binary(max_size=300))
def test_parse_refuses_or_round_trips(data: bytes) -> None:
    try:
        entry = Entry.parse(data)
    except MalformedEntry:
        return
    assert entry.encode() == data
