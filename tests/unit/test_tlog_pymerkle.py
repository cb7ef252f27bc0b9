"""formats.tlog.merkle against an RFC 6962 implementation that is not ours: pymerkle
(https://github.com/fmerg/pymerkle, a test-only dependency; its trees follow RFC 9162 §2.1
with the 0x00/0x01 prefixes when ``security`` is on, the default).

pymerkle's roots and inclusion paths are RFC 6962's (its path starts with the leaf itself).
Its consistency paths are of its own shape (they go down to a leaf even when the old tree is
a complete subtree), so for consistency it is the judge of the roots: each of our proofs must
verify between the roots pymerkle computes for the two sizes.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pymerkle import InmemoryTree

from formats.tlog.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    tree_levels,
    tree_root,
    verify_consistency,
    verify_inclusion,
)

ENTRIES = [b"stamp %d" % i for i in range(600)]
THEIRS = InmemoryTree(algorithm="sha256")
for _entry in ENTRIES:
    THEIRS.append_entry(_entry)
_LEVELS = tree_levels([leaf_hash(e) for e in ENTRIES])


def ours(level: int, index: int) -> bytes:
    return _LEVELS[level][index]


def test_leaf_hashes_agree() -> None:
    for i in (0, 1, 255, 599):
        assert THEIRS.get_leaf(i + 1) == leaf_hash(ENTRIES[i])


def test_roots_agree_for_every_size() -> None:
    for size in range(len(ENTRIES) + 1):
        assert tree_root(size, ours) == THEIRS.get_root(size)


def test_inclusion_paths_agree_on_small_trees() -> None:
    for size in range(1, 40):
        for index in range(size):
            theirs = THEIRS.prove_inclusion(index + 1, size).path[1:]
            assert inclusion_proof(index, size, ours) == theirs


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 600), st.data())
def test_inclusion_paths_agree(size: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, size - 1))
    proof = inclusion_proof(index, size, ours)
    assert proof == THEIRS.prove_inclusion(index + 1, size).path[1:]
    verify_inclusion(leaf_hash(ENTRIES[index]), index, size, proof, THEIRS.get_root(size))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 600), st.data())
def test_consistency_proofs_verify_between_their_roots(new: int, data: st.DataObject) -> None:
    old = data.draw(st.integers(0, new))
    proof = consistency_proof(old, new, ours)
    verify_consistency(old, new, THEIRS.get_root(old), THEIRS.get_root(new), proof)
    if 0 < old < new:  # their own proof holds between the same roots
        theirs = THEIRS.prove_consistency(old, new)
        theirs.verify(THEIRS.get_root(old), THEIRS.get_root(new))
