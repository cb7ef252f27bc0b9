"""The digest index of manifests (`formats.manifests.buckets`): no row holds more than
`BUCKET_DIGESTS` digests, however the digests were chosen, and each digest lies in exactly
one row, on one of its `lookup_prefixes`."""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest

from formats.manifests import (
    BUCKET_DIGESTS,
    SORT_DIGESTS,
    bucket_key,
    buckets,
    key_prefix,
    lookup_prefixes,
    pack,
    packed_contains,
    unpack,
)


def sha(i: int) -> str:
    return hashlib.sha256(i.to_bytes(4, "big")).hexdigest()


def check_rows(digests: list[str]) -> list[tuple[bytes, bytes]]:
    """The rows of ``digests``, checked: bounded, sorted, disjoint, and every digest found
    through its own prefixes."""
    width = len(digests[0]) // 2
    rows = [(key_prefix(k), packed) for k, packed in buckets(pack(digests), width)]
    assert all(len(p) <= BUCKET_DIGESTS * width for _, p in rows)
    prefixes = [p for p, _ in rows]
    assert prefixes == sorted(set(prefixes))
    assert not any(b.startswith(a) for a, b in itertools.pairwise(prefixes))
    every = [d for _, p in rows for d in unpack(p, width)]
    assert every == sorted(set(digests))  # each once, in order
    by_prefix = dict(rows)
    for d in random.Random(0).sample(digests, min(300, len(digests))):
        holding = [p for p in lookup_prefixes(d) if p in by_prefix]
        assert len(holding) == 1 and packed_contains(by_prefix[holding[0]], d)
        assert all(bytes.fromhex(d).startswith(p) for p in holding)
    return rows


def test_random_digests_keep_16_bit_buckets() -> None:
    rows = check_rows([sha(i) for i in range(20000)])
    assert {len(p) for p, _ in rows} == {2}


def test_a_poisoned_bucket_is_split_into_bounded_rows() -> None:
    """Digests that all start with ``abcd`` (as three poisoning manifests of 10^6 had)."""
    digests = ["abcd" + sha(i)[4:] for i in range(20000)]
    rows = check_rows(digests)
    assert len(rows) > 20000 // BUCKET_DIGESTS
    assert all(p.startswith(b"\xab\xcd") and len(p) >= 3 for p, _ in rows)


def test_digests_sharing_all_but_their_last_byte() -> None:
    """Deep splits: digests that differ only in their last bytes."""
    digests = [("ab" * 31) + f"{i:02x}" for i in range(256)] + [("cd" * 31) + "00"]
    digests += [("ef" * 30) + f"{i:04x}" for i in range(BUCKET_DIGESTS + 1)]
    check_rows(digests)


def test_sha512_and_duplicates() -> None:
    digests = ["0000" + hashlib.sha512(str(i).encode()).hexdigest()[4:] for i in range(3000)]
    rows = check_rows(digests + digests[:500])
    assert sum(len(p) for _, p in rows) == 64 * 3000


@pytest.mark.parametrize("prefix", [b"\x00\x00", b"\xab\xcd\x00", b"\xff" * 64])
def test_bucket_keys_keep_the_prefix(prefix: bytes) -> None:
    assert key_prefix(bucket_key(prefix)) == prefix
    with pytest.raises(ValueError):
        key_prefix(int.from_bytes(prefix, "big"))


def reference_rows(digests: list[str]) -> list[tuple[bytes, bytes]]:
    """The rule (migration 0011 states it too), one hex string per digest."""
    rows: list[tuple[bytes, bytes]] = []

    def split(prefix: str, group: list[str]) -> None:
        if len(group) <= BUCKET_DIGESTS or len(prefix) >= len(group[0]):
            rows.append((bytes.fromhex(prefix), bytes.fromhex("".join(group))))
            return
        sub: dict[str, list[str]] = {}
        for d in group:
            sub.setdefault(d[:len(prefix) + 2], []).append(d)
        for p, g in sub.items():
            split(p, g)

    grouped: dict[str, set[str]] = {}
    for d in digests:
        grouped.setdefault(d[:4], set()).add(d)
    for prefix, group in sorted(grouped.items()):
        split(prefix, sorted(group))
    return rows


@pytest.mark.parametrize("digests", [
    [sha(1)] * (SORT_DIGESTS * 2 + 5),  # one digest, in every run
    ["abcd" + sha(i % 3000)[4:] for i in range(SORT_DIGESTS * 3)],  # copies across runs
    ["ab" * 30 + f"{i % 70000:04x}"[-4:] for i in range(SORT_DIGESTS * 5)],  # a deep split
    [sha(i) for i in range(SORT_DIGESTS)] + ["abcd" + sha(i)[4:] for i in range(SORT_DIGESTS + 1)],
], ids=["one-digest", "copies", "deep", "mixed"])
def test_groups_larger_than_one_sort_are_merged(digests: list[str]) -> None:
    """A 16-bit group of more than `SORT_DIGESTS` digests is sorted in runs and merged: its
    rows are those of the rule, byte for byte."""
    rows = [(key_prefix(k), p) for k, p in buckets(pack(digests), 32)]
    assert rows == reference_rows(digests)
    check_rows(digests)
