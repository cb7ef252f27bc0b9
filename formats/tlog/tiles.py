"""Tiles and entry bundles of c2sp.org/tlog-tiles: paths, which tile holds which node, bytes.

A tile is a run of at most 256 consecutive hashes of one *tile level* ``L``: hash ``i`` of tile
``N`` at level ``L`` is the perfect subtree at tree level ``8 * L`` with index ``N * 256 + i``
(level 0 tiles hold the leaf hashes; a level ``L + 1`` hash is the root of a full level ``L``
tile). The nodes at the seven tree levels between two tile levels are not stored: each is the
root of ``2**s`` consecutive hashes of one tile (:func:`tile_node_reader` computes them).

At tree size ``s``, level ``L`` has ``s // 256**(L+1)`` full tiles and, if
``w = (s // 256**L) % 256`` is not 0, one partial tile of width ``w``. A tile is served at
``tile/<L>/<N>`` (full) or ``tile/<L>/<N>.p/<W>`` (partial), ``N`` written as 3-digit groups of
which all but the last begin with ``x`` (1234067 is ``x001/x234/067``). The entry bundle of
level 0 tile ``N`` is at ``tile/entries/<N>[.p/<W>]``: each entry as a big-endian ``uint16``
length and its bytes.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from formats.tlog.errors import MalformedTile
from formats.tlog.merkle import (
    HASH_SIZE,
    MAX_TREE_SIZE,
    NodeReader,
    consistency_proof,
    inclusion_proof,
    perfect_root,
)

__all__ = [
    "MAX_ENTRY_SIZE",
    "MAX_TILE_LEVEL",
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "Tile",
    "entry_bundle",
    "new_tiles",
    "parse_entries_path",
    "parse_entry_bundle",
    "parse_tile_path",
    "tile_data",
    "tile_for_node",
    "tile_hashes",
    "tile_node_reader",
    "tiles_for_consistency",
    "tiles_for_inclusion",
    "tiles_for_size",
]

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
MAX_TILE_LEVEL = 63
MAX_ENTRY_SIZE = 0xFFFF

_LEVEL = r"0|[1-9][0-9]?"
_INDEX = r"(?:x[0-9]{3}/){0,6}[0-9]{3}"
_WIDTH = r"[1-9][0-9]{0,2}"
_TILE_PATH = re.compile(rf"tile/({_LEVEL})/({_INDEX})(?:\.p/({_WIDTH}))?", re.ASCII)
_ENTRIES_PATH = re.compile(rf"tile/entries/({_INDEX})(?:\.p/({_WIDTH}))?", re.ASCII)


def _encode_index(n: int) -> str:
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(groups))


@dataclass(frozen=True, order=True)
class Tile:
    """Tile ``index`` of tile level ``level`` holding ``width`` hashes (256 when full)."""

    level: int
    index: int
    width: int = TILE_WIDTH

    def __post_init__(self) -> None:
        if not 0 <= self.level <= MAX_TILE_LEVEL:
            raise MalformedTile(f"tile level {self.level} not in 0..{MAX_TILE_LEVEL}")
        if self.index < 0:
            raise MalformedTile(f"negative tile index {self.index}")
        if not 1 <= self.width <= TILE_WIDTH:
            raise MalformedTile(f"tile width {self.width} not in 1..{TILE_WIDTH}")

    @property
    def full(self) -> bool:
        return self.width == TILE_WIDTH

    def _suffix(self) -> str:
        return "" if self.full else f".p/{self.width}"

    def path(self) -> str:
        """``tile/<L>/<N>[.p/<W>]``."""
        return f"tile/{self.level}/{_encode_index(self.index)}{self._suffix()}"

    def entries_path(self) -> str:
        """``tile/entries/<N>[.p/<W>]``: the entry bundle of this level 0 tile."""
        if self.level != 0:
            raise MalformedTile("only level 0 tiles have entry bundles")
        return f"tile/entries/{_encode_index(self.index)}{self._suffix()}"

    def first_node(self) -> tuple[int, int]:
        """The tree ``(level, index)`` of the tile's first hash."""
        return TILE_HEIGHT * self.level, self.index * TILE_WIDTH

    def leaf_range(self) -> tuple[int, int]:
        """The leaves ``[start, end)`` the hashes of this tile span (its width's worth)."""
        span = 1 << (TILE_HEIGHT * self.level)
        start = self.index * TILE_WIDTH * span
        return start, start + self.width * span


def _parse_index(text: str) -> int:
    groups = text.replace("x", "").split("/")
    n = int("".join(groups))
    if _encode_index(n) != text:  # leading x000 groups
        raise MalformedTile(f"tile index {text!r} not in canonical form")
    return n


def parse_tile_path(path: str) -> Tile:
    """The tile of a path ``tile/<L>/<N>[.p/<W>]``, refusing anything not canonical."""
    m = _TILE_PATH.fullmatch(path)
    if m is None:
        raise MalformedTile(f"not a tile path: {path!r}")
    width = int(m[3]) if m[3] else TILE_WIDTH
    if m[3] and width >= TILE_WIDTH:
        raise MalformedTile(f"partial tile width {width} not in 1..255")
    return Tile(int(m[1]), _parse_index(m[2]), width)


def parse_entries_path(path: str) -> Tile:
    """The level 0 tile of an entry bundle path ``tile/entries/<N>[.p/<W>]``."""
    m = _ENTRIES_PATH.fullmatch(path)
    if m is None:
        raise MalformedTile(f"not an entry bundle path: {path!r}")
    width = int(m[2]) if m[2] else TILE_WIDTH
    if m[2] and width >= TILE_WIDTH:
        raise MalformedTile(f"partial bundle width {width} not in 1..255")
    return Tile(0, _parse_index(m[1]), width)


def _check_size(size: int) -> None:
    if not 0 <= size <= MAX_TREE_SIZE:
        raise MalformedTile(f"tree size {size} out of range")


def tiles_for_size(size: int) -> list[Tile]:
    """Every tile of the tree of ``size`` leaves, level by level, the partial one last."""
    _check_size(size)
    out = []
    level = 0
    while count := size >> (TILE_HEIGHT * level):
        out += [Tile(level, n) for n in range(count // TILE_WIDTH)]
        if count % TILE_WIDTH:
            out.append(Tile(level, count // TILE_WIDTH, count % TILE_WIDTH))
        level += 1
    return out


def new_tiles(old_size: int, new_size: int) -> list[Tile]:
    """The tiles a log writes when its tree grows from ``old_size`` to ``new_size`` leaves:
    at each level, every tile that gains hashes, at its width in the new tree."""
    _check_size(new_size)
    if not 0 <= old_size <= new_size:
        raise MalformedTile(f"a tree does not grow from {old_size} to {new_size}")
    out = []
    level = 0
    while new_count := new_size >> (TILE_HEIGHT * level):
        old_count = old_size >> (TILE_HEIGHT * level)
        if new_count != old_count:
            for n in range(old_count // TILE_WIDTH, (new_count - 1) // TILE_WIDTH + 1):
                out.append(Tile(level, n, min(TILE_WIDTH, new_count - n * TILE_WIDTH)))
        level += 1
    return out


def tile_for_node(level: int, index: int, size: int) -> tuple[Tile, int, int]:
    """The tile of the tree of ``size`` leaves that holds the perfect subtree ``(level, index)``,
    and the slice ``[start, stop)`` of its hashes whose root that node is."""
    _check_size(size)
    if level < 0 or index < 0 or (index + 1) << level > size:
        raise MalformedTile(f"node ({level}, {index}) not in a tree of size {size}")
    tile_level, sub = divmod(level, TILE_HEIGHT)
    first = index << sub
    n = first // TILE_WIDTH
    width = min(TILE_WIDTH, (size >> (TILE_HEIGHT * tile_level)) - n * TILE_WIDTH)
    start = first % TILE_WIDTH
    return Tile(tile_level, n, width), start, start + (1 << sub)


def tile_data(tile: Tile, node: NodeReader) -> bytes:
    """The bytes of ``tile``: its hashes concatenated, read from the stored perfect subtrees."""
    level, first = tile.first_node()
    return b"".join(node(level, first + i) for i in range(tile.width))


def tile_hashes(tile: Tile, data: bytes) -> list[bytes]:
    """The hashes of ``tile`` from its bytes, refusing a tile of the wrong length."""
    if len(data) != tile.width * HASH_SIZE:
        raise MalformedTile(
            f"{tile.path()} has {len(data)} bytes, not {tile.width} hashes of {HASH_SIZE}"
        )
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


def tile_node_reader(size: int, read_tile: Callable[[Tile], bytes]) -> NodeReader:
    """A :data:`NodeReader` for the tree of ``size`` leaves over its tiles, fetched with
    ``read_tile`` (once each) and checked for length."""
    cache: dict[Tile, list[bytes]] = {}

    def node(level: int, index: int) -> bytes:
        tile, start, stop = tile_for_node(level, index, size)
        if tile not in cache:
            cache[tile] = tile_hashes(tile, read_tile(tile))
        return perfect_root(cache[tile][start:stop])

    return node


def _tiles_read_by(size: int, run: Callable[[NodeReader], object]) -> list[Tile]:
    seen: dict[Tile, None] = {}

    def node(level: int, index: int) -> bytes:
        seen.setdefault(tile_for_node(level, index, size)[0], None)
        return bytes(HASH_SIZE)

    run(node)
    return list(seen)


def tiles_for_inclusion(index: int, size: int) -> list[Tile]:
    """The tiles, at tree size ``size``, that an inclusion proof of leaf ``index`` reads."""
    return _tiles_read_by(size, lambda node: inclusion_proof(index, size, node))


def tiles_for_consistency(old_size: int, new_size: int) -> list[Tile]:
    """The tiles, at tree size ``new_size``, that a consistency proof from ``old_size`` reads."""
    return _tiles_read_by(new_size, lambda node: consistency_proof(old_size, new_size, node))


def entry_bundle(entries: Sequence[bytes]) -> bytes:
    """The entry bundle of 1 to 256 entries: each a big-endian uint16 length and its bytes."""
    if not 1 <= len(entries) <= TILE_WIDTH:
        raise MalformedTile(f"an entry bundle holds 1 to {TILE_WIDTH} entries, not {len(entries)}")
    longest = max(map(len, entries))
    if longest > MAX_ENTRY_SIZE:
        raise MalformedTile(f"entry of {longest} bytes, more than {MAX_ENTRY_SIZE}")
    return b"".join([len(entry).to_bytes(2, "big") + entry for entry in entries])


def parse_entry_bundle(data: bytes, width: int | None = None) -> list[bytes]:
    """The entries of a bundle, refusing a truncated one, an empty one, one of more than 256
    entries, or (when ``width`` is given) one that does not hold exactly ``width`` entries."""
    entries: list[bytes] = []
    pos = 0
    while pos < len(data):
        if len(entries) == TILE_WIDTH:
            raise MalformedTile(f"entry bundle of more than {TILE_WIDTH} entries")
        if pos + 2 > len(data):
            raise MalformedTile("entry bundle ends inside a length")
        (length,) = struct.unpack_from(">H", data, pos)
        pos += 2
        if pos + length > len(data):
            raise MalformedTile("entry bundle ends inside an entry")
        entries.append(bytes(data[pos : pos + length]))
        pos += length
    if not entries:
        raise MalformedTile("empty entry bundle")
    if width is not None and len(entries) != width:
        raise MalformedTile(f"entry bundle of {len(entries)} entries, not {width}")
    return entries
