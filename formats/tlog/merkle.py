"""RFC 6962 Merkle trees: hashes, roots, inclusion and consistency proofs (SHA-256).

The tree over entries ``D[0:n]`` is RFC 6962 §2.1 (RFC 9162 §2.1.1): the leaf hash is
``SHA-256(0x00 || entry)``, an interior node is ``SHA-256(0x01 || left || right)``, the left
subtree of ``n > 1`` leaves holds the largest power of two ``k < n`` of them, and the root of the
empty tree is ``SHA-256("")``.

Only *perfect* subtrees are ever stored: the node ``(level, index)`` is the root of the ``2**level``
leaves ``[index * 2**level, (index + 1) * 2**level)``; level 0 holds the leaf hashes. Proof
generation reads them through a :data:`NodeReader` (a function of ``level, index``), so the same
code runs over hashes kept in memory (:func:`tree_levels`), in a database or in tiles
(:func:`formats.tlog.tiles.tile_node_reader`). A range that is not a perfect subtree is hashed
from the perfect ones it splits into, exactly as RFC 6962 defines ``MTH``.

Generation follows RFC 6962 §2.1.1 ``PATH`` and §2.1.2 ``SUBPROOF``; verification follows the
bit-shifting algorithms of RFC 9162 §2.1.3.2 and §2.1.4.2, with the edge cases of
c2sp.org/tlog-witness: between equal sizes the proof is empty and the roots equal, and from
size 0 (whose root is ``SHA-256("")``) the proof is empty, the empty tree being a prefix of
every tree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from formats.tlog.errors import InvalidProof

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "MAX_PROOF_HASHES",
    "NodeReader",
    "completed_nodes",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "perfect_root",
    "range_hash",
    "root_of",
    "tree_levels",
    "tree_root",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()
# A tree of fewer than 2**63 leaves has proofs of at most 63 hashes (inclusion) or 64
# (consistency, with the old root prepended); c2sp.org/tlog-witness caps proofs at 63 lines.
MAX_PROOF_HASHES = 63
MAX_TREE_SIZE = 2**63 - 1

# (level, index) -> the root hash of the perfect subtree of leaves
# [index * 2**level, (index + 1) * 2**level).
NodeReader = Callable[[int, int], bytes]


def leaf_hash(entry: bytes) -> bytes:
    """The RFC 6962 leaf hash of an entry: SHA-256(0x00 || entry)."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The RFC 6962 interior node hash: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``): the size of the left subtree."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_size(size: int) -> None:
    if not 0 <= size <= MAX_TREE_SIZE:
        raise InvalidProof(f"tree size {size} out of range")


def range_hash(lo: int, hi: int, node: NodeReader) -> bytes:
    """``MTH(D[lo:hi])`` for a range of the tree's recursion (``lo`` a multiple of the largest
    power of two not above ``hi - lo``), from the perfect subtrees it splits into."""
    if not 0 <= lo < hi:
        raise ValueError(f"empty or negative range [{lo}, {hi})")
    width = hi - lo
    if width & (width - 1) == 0:
        level = width.bit_length() - 1
        if lo % width:
            raise ValueError(f"range [{lo}, {hi}) is not aligned")
        return node(level, lo >> level)
    k = _split(width)
    return node_hash(range_hash(lo, lo + k, node), range_hash(lo + k, hi, node))


def tree_root(size: int, node: NodeReader) -> bytes:
    """The root hash of the tree of ``size`` leaves (``SHA-256("")`` for the empty tree)."""
    _check_size(size)
    return EMPTY_ROOT if size == 0 else range_hash(0, size, node)


def tree_levels(leaf_hashes: Sequence[bytes]) -> list[list[bytes]]:
    """Every perfect subtree of a tree held in memory: ``levels[level][index]``; serve them as a
    :data:`NodeReader` with ``lambda level, index: levels[level][index]``."""
    levels = [list(leaf_hashes)]
    sha256 = hashlib.sha256  # (`node_hash` written out: a proof hashes hundreds of nodes)
    while len(levels[-1]) >= 2:
        below = levels[-1]
        levels.append([sha256(b"\x01" + below[i] + below[i + 1]).digest()
                       for i in range(0, len(below) - 1, 2)])
    return levels


def perfect_root(hashes: Sequence[bytes]) -> bytes:
    """The root of the perfect subtree over ``hashes`` (a power of two of them)."""
    return tree_levels(hashes)[-1][0]


def root_of(leaf_hashes: Sequence[bytes]) -> bytes:
    """The root hash of the tree over these leaf hashes."""
    levels = tree_levels(leaf_hashes)
    return tree_root(len(leaf_hashes), lambda level, index: levels[level][index])


def completed_nodes(index: int, leaf: bytes, node: NodeReader) -> list[tuple[int, int, bytes]]:
    """The perfect subtrees that appending the leaf hash ``leaf`` at ``index`` completes, as
    ``(level, index, hash)`` from the leaf up: what a log stores when the tree grows from
    ``index`` to ``index + 1`` leaves. ``node`` must answer for the nodes already stored."""
    _check_size(index + 1)
    out = [(0, index, leaf)]
    level, i, current = 0, index, leaf
    while i & 1:
        current = node_hash(node(level, i - 1), current)
        level, i = level + 1, i >> 1
        out.append((level, i, current))
    return out


def inclusion_proof(index: int, size: int, node: NodeReader) -> list[bytes]:
    """RFC 6962 ``PATH(index, D[size])``: the audit path of leaf ``index``, from the leaf's
    sibling up to the root's child."""
    _check_size(size)
    if not 0 <= index < size:
        raise InvalidProof(f"index {index} not in a tree of size {size}")
    top_down: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            top_down.append(range_hash(lo + k, hi, node))
            hi = lo + k
        else:
            top_down.append(range_hash(lo, lo + k, node))
            lo = lo + k
    return top_down[::-1]


def consistency_proof(old_size: int, new_size: int, node: NodeReader) -> list[bytes]:
    """RFC 6962 ``PROOF(old_size, D[new_size])`` = ``SUBPROOF(old_size, D[new_size], true)``;
    empty when the sizes are equal or ``old_size`` is 0."""
    _check_size(new_size)
    if not 0 <= old_size <= new_size:
        raise InvalidProof(f"no consistency proof from size {old_size} to {new_size}")
    if old_size in (0, new_size):
        return []
    top_down: list[bytes] = []
    lo, hi, m, whole = 0, new_size, old_size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            top_down.append(range_hash(lo + k, hi, node))
            hi = lo + k
        else:
            top_down.append(range_hash(lo, lo + k, node))
            lo, m, whole = lo + k, m - k, False
    base = [] if whole else [range_hash(lo, hi, node)]
    return base + top_down[::-1]


def _check_hashes(proof: Sequence[bytes], *hashes: bytes) -> None:
    if len(proof) > MAX_PROOF_HASHES:
        raise InvalidProof(f"proof of {len(proof)} hashes, more than {MAX_PROOF_HASHES}")
    for h in (*proof, *hashes):
        if len(h) != HASH_SIZE:
            raise InvalidProof(f"hash of {len(h)} bytes, not {HASH_SIZE}")


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``proof`` proves leaf hash ``leaf`` at ``index`` in the tree of ``size``
    leaves with ``root`` (RFC 9162 §2.1.3.2); raises :class:`InvalidProof` otherwise."""
    _check_size(size)
    _check_hashes(proof, leaf, root)
    if not 0 <= index < size:
        raise InvalidProof(f"index {index} not in a tree of size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise InvalidProof("inclusion proof longer than the path")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise InvalidProof("inclusion proof shorter than the path")
    if r != root:
        raise InvalidProof("inclusion proof does not lead to the root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that ``proof`` proves the tree of ``old_size`` leaves with ``old_root`` a prefix
    of the tree of ``new_size`` leaves with ``new_root`` (RFC 9162 §2.1.4.2); raises
    :class:`InvalidProof` otherwise."""
    _check_size(new_size)
    _check_hashes(proof, old_root, new_root)
    if not 0 <= old_size <= new_size:
        raise InvalidProof(f"no consistency proof from size {old_size} to {new_size}")
    if old_size == 0:
        if proof:
            raise InvalidProof("a consistency proof from the empty tree must be empty")
        if old_root != EMPTY_ROOT:
            raise InvalidProof("the root of the empty tree is SHA-256 of the empty string")
        return
    if old_size == new_size:
        if proof:
            raise InvalidProof("a consistency proof between equal sizes must be empty")
        if old_root != new_root:
            raise InvalidProof("equal sizes with different roots")
        return
    if not proof:
        raise InvalidProof("empty consistency proof between different sizes")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise InvalidProof("consistency proof longer than the path")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise InvalidProof("consistency proof shorter than the path")
    if fr != old_root:
        raise InvalidProof("consistency proof does not lead to the old root")
    if sr != new_root:
        raise InvalidProof("consistency proof does not lead to the new root")
