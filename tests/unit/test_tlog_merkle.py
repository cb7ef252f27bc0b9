"""formats.tlog.merkle: RFC 6962 hashes, roots and proofs, against published vectors and as
properties of random trees."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formats.tlog.errors import InvalidProof
from formats.tlog.merkle import (
    EMPTY_ROOT,
    NodeReader,
    completed_nodes,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_of,
    tree_levels,
    tree_root,
    verify_consistency,
    verify_inclusion,
)

# Vectors of github.com/transparency-dev/merkle, cmd/proofgen/main.go (Apache-2.0; commit
# 417fb0c314750d94e53942e9f92e79b6d35915db), which come from the Certificate Transparency
# reference implementation: eight leaves, the roots of the trees of 1 to 8 of them, and proofs
# (leaf indexes there count from 1; here from 0).
LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
ROOTS = [
    bytes.fromhex(h)
    for h in (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]
H = bytes.fromhex
INCLUSION = [  # (index from 0, size, proof)
    (0, 1, []),
    (
        0,
        8,
        [
            H("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            H("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        5,
        8,
        [
            H("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            H("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (2, 3, [H("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")]),
    (
        1,
        5,
        [
            H("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
            H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            H("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
]
CONSISTENCY = [  # (old size, new size, proof)
    (1, 1, []),
    (
        1,
        8,
        [
            H("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            H("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        6,
        8,
        [
            H("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            H("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (
        2,
        5,
        [
            H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            H("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
    (
        6,
        7,
        [
            H("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            H("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
            H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
]


def reader(leaf_hashes: list[bytes]) -> NodeReader:
    levels = tree_levels(leaf_hashes)
    return lambda level, index: levels[level][index]


REFERENCE = reader([leaf_hash(x) for x in LEAVES])


def test_hashes_have_the_rfc_6962_prefixes() -> None:
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    assert (
        node_hash(b"l" * 32, b"r" * 32) == hashlib.sha256(b"\x01" + b"l" * 32 + b"r" * 32).digest()
    )
    # golang.org/x/mod/sumdb/tlog note_test.go: RecordHash("hello world").
    assert (
        base64.b64encode(leaf_hash(b"hello world"))
        == b"TszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0="
    )


def test_empty_tree_root_is_the_hash_of_the_empty_string() -> None:
    # RFC 6962 §2.1; golang.org/x/mod/sumdb/tlog tlog_test.go TestEmptyTree.
    assert tree_root(0, REFERENCE) == EMPTY_ROOT == hashlib.sha256(b"").digest()
    assert root_of([]) == EMPTY_ROOT


@pytest.mark.parametrize("size", range(1, 9))
def test_reference_roots(size: int) -> None:
    assert tree_root(size, REFERENCE) == ROOTS[size - 1]
    assert root_of([leaf_hash(x) for x in LEAVES[:size]]) == ROOTS[size - 1]


@pytest.mark.parametrize(("index", "size", "proof"), INCLUSION)
def test_reference_inclusion_proofs(index: int, size: int, proof: list[bytes]) -> None:
    assert inclusion_proof(index, size, REFERENCE) == proof
    verify_inclusion(leaf_hash(LEAVES[index]), index, size, proof, ROOTS[size - 1])


@pytest.mark.parametrize(("old", "new", "proof"), CONSISTENCY)
def test_reference_consistency_proofs(old: int, new: int, proof: list[bytes]) -> None:
    assert consistency_proof(old, new, REFERENCE) == proof
    verify_consistency(old, new, ROOTS[old - 1], ROOTS[new - 1], proof)


def test_consistency_edge_cases() -> None:
    # c2sp.org/tlog-witness: from size 0 the proof is empty and the old root that of the
    # empty tree; between equal sizes it is empty and the roots are equal.
    assert consistency_proof(0, 8, REFERENCE) == []
    verify_consistency(0, 8, EMPTY_ROOT, ROOTS[7], [])
    verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    with pytest.raises(InvalidProof):
        verify_consistency(0, 8, ROOTS[0], ROOTS[7], [])
    with pytest.raises(InvalidProof):
        verify_consistency(0, 8, EMPTY_ROOT, ROOTS[7], [ROOTS[0]])
    assert consistency_proof(8, 8, REFERENCE) == []
    verify_consistency(8, 8, ROOTS[7], ROOTS[7], [])
    with pytest.raises(InvalidProof):
        verify_consistency(8, 8, ROOTS[7], ROOTS[6], [])
    with pytest.raises(InvalidProof):
        verify_consistency(8, 8, ROOTS[7], ROOTS[7], [ROOTS[0]])
    with pytest.raises(InvalidProof):
        consistency_proof(5, 4, REFERENCE)
    with pytest.raises(InvalidProof):
        verify_consistency(5, 4, ROOTS[4], ROOTS[3], [ROOTS[0]])
    with pytest.raises(InvalidProof):  # different sizes need a proof
        verify_consistency(4, 8, ROOTS[3], ROOTS[7], [])
    # A power-of-two old size: the old root is implied, not sent (RFC 6962 §2.1.2).
    assert consistency_proof(4, 8, REFERENCE) == [REFERENCE(2, 1)]
    verify_consistency(4, 8, ROOTS[3], ROOTS[7], [REFERENCE(2, 1)])


def test_inclusion_refusals() -> None:
    index, size, proof = INCLUSION[2]
    leaf = leaf_hash(LEAVES[index])
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, size, size, proof, ROOTS[size - 1])
    with pytest.raises(InvalidProof):
        inclusion_proof(8, 8, REFERENCE)
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, index, size, [*proof, proof[0]], ROOTS[size - 1])
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, index, size, proof[:-1], ROOTS[size - 1])
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, index, size, [proof[0][:31], *proof[1:]], ROOTS[size - 1])
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, 0, 0, [], EMPTY_ROOT)


def test_completed_nodes_are_the_perfect_subtrees_an_append_closes() -> None:
    hashes = [leaf_hash(x) for x in LEAVES]
    stored: dict[tuple[int, int], bytes] = {}
    for i, h in enumerate(hashes):
        done = completed_nodes(i, h, lambda level, index: stored[level, index])
        for level, index, value in done:
            stored[level, index] = value
        assert tree_root(i + 1, lambda level, index: stored[level, index]) == ROOTS[i]
    assert [(lv, ix) for lv, ix, _ in completed_nodes(7, hashes[7], REFERENCE)] == [
        (0, 7),
        (1, 3),
        (2, 1),
        (3, 0),
    ]
    assert len(stored) == 15


def _flip(h: bytes, bit: int) -> bytes:
    b = bytearray(h)
    b[bit // 8 % 32] ^= 1 << (bit % 8)
    return bytes(b)


# Trees of up to 300 leaves; a wrong size is claimed with the root of the tree of that size
# over the same entries (an inclusion or consistency proof alone cannot tell 7 leaves from 8
# when the paths agree: the root is what commits to the size).
ENTRIES = [leaf_hash(b"entry %d" % i) for i in range(1400)]
BIG = reader(ENTRIES)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.data(), st.integers(0, 255), st.integers(1, 1000))
def test_every_inclusion_proof_verifies_and_tampering_is_refused(
    size: int, data: st.DataObject, bit: int, delta: int
) -> None:
    index = data.draw(st.integers(0, size - 1))
    leaf, root = ENTRIES[index], tree_root(size, BIG)
    proof = inclusion_proof(index, size, BIG)
    verify_inclusion(leaf, index, size, proof, root)
    for k in range(len(proof)):
        flipped = [*proof[:k], _flip(proof[k], bit), *proof[k + 1 :]]
        with pytest.raises(InvalidProof):
            verify_inclusion(leaf, index, size, flipped, root)
    with pytest.raises(InvalidProof):
        verify_inclusion(_flip(leaf, bit), index, size, proof, root)
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, index, size, proof, _flip(root, bit))
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, index, size, proof[:-1] if proof else [root], root)
    for wrong_index in {(index + delta) % (size + 1), index ^ 1, index + size}:
        if wrong_index != index:
            with pytest.raises(InvalidProof):
                verify_inclusion(leaf, wrong_index, size, proof, root)
    for wrong_size in {size + delta, max(index + 1, size - delta), size + 1}:
        if wrong_size != size:
            with pytest.raises(InvalidProof):
                verify_inclusion(leaf, index, wrong_size, proof, tree_root(wrong_size, BIG))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.data(), st.integers(0, 255), st.integers(1, 1000))
def test_every_consistency_proof_verifies_and_tampering_is_refused(
    new: int, data: st.DataObject, bit: int, delta: int
) -> None:
    old = data.draw(st.integers(0, new))
    old_root, new_root = tree_root(old, BIG), tree_root(new, BIG)
    proof = consistency_proof(old, new, BIG)
    verify_consistency(old, new, old_root, new_root, proof)
    for k in range(len(proof)):
        flipped = [*proof[:k], _flip(proof[k], bit), *proof[k + 1 :]]
        with pytest.raises(InvalidProof):
            verify_consistency(old, new, old_root, new_root, flipped)
    with pytest.raises(InvalidProof):
        verify_consistency(old, new, _flip(old_root, bit), new_root, proof)
    if old != 0:  # the empty tree is a prefix of any tree: its proof does not name the new root
        with pytest.raises(InvalidProof):
            verify_consistency(old, new, old_root, _flip(new_root, bit), proof)
    # (An empty proof truly proves size n from size n, and size 0 from anything.)
    for wrong_old in {old + delta, old - 1, old + 1}:
        if 0 <= wrong_old != old and wrong_old <= new and (proof or wrong_old not in (0, new)):
            with pytest.raises(InvalidProof):
                verify_consistency(wrong_old, new, tree_root(wrong_old, BIG), new_root, proof)
    for wrong_new in {new + delta, new - 1, new + 1}:
        if wrong_new != new and wrong_new >= old and old != 0:
            with pytest.raises(InvalidProof):
                verify_consistency(old, wrong_new, old_root, tree_root(wrong_new, BIG), proof)
