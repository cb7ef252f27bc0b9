"""formats.tlog.tiles: tile paths, which tiles a tree has and a proof reads, tile bytes, entry
bundles; the examples are c2sp.org/tlog-tiles' own and golang.org/x/mod/sumdb/tlog's."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formats.tlog.errors import MalformedTile
from formats.tlog.merkle import (
    NodeReader,
    completed_nodes,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    tree_levels,
    tree_root,
)
from formats.tlog.tiles import (
    Tile,
    entry_bundle,
    new_tiles,
    parse_entries_path,
    parse_entry_bundle,
    parse_tile_path,
    tile_data,
    tile_for_node,
    tile_hashes,
    tile_node_reader,
    tiles_for_consistency,
    tiles_for_inclusion,
    tiles_for_size,
)

ENTRIES = [b"stamp %d" % i for i in range(70_000)]
_LEVELS = tree_levels([leaf_hash(e) for e in ENTRIES])


def memory(level: int, index: int) -> bytes:
    return _LEVELS[level][index]


@pytest.mark.parametrize(
    ("tile", "path"),
    [
        # c2sp.org/tlog-tiles: "index 1234067 will be encoded as x001/x234/067".
        (Tile(0, 1234067), "tile/0/x001/x234/067"),
        # N encodings of golang.org/x/mod/sumdb/tlog tlog_test.go tilePaths (whose paths
        # also carry the tile height, which C2SP fixes at 8 and leaves out).
        (Tile(5, 123456078), "tile/5/x123/x456/078"),
        (Tile(5, 123456078, 2), "tile/5/x123/x456/078.p/2"),
        (Tile(0, 3057500, 2), "tile/0/x003/x057/500.p/2"),
        (Tile(0, 1), "tile/0/001"),
        (Tile(1, 0, 1), "tile/1/000.p/1"),
        (Tile(63, 999, 255), "tile/63/999.p/255"),
        (Tile(2, 1000), "tile/2/x001/000"),
    ],
)
def test_tile_paths(tile: Tile, path: str) -> None:
    assert tile.path() == path
    assert parse_tile_path(path) == tile
    if tile.level == 0:
        bundle = path.replace("tile/0/", "tile/entries/")
        assert tile.entries_path() == bundle
        assert parse_entries_path(bundle) == tile


@pytest.mark.parametrize(
    "path",
    [
        "tile/3/5/123/456/078",  # golang.org/x/mod/sumdb/tlog tilePaths: no x
        "tile/3/-1/123/456/078",
        "tile/0/x000/005",  # not canonical
        "tile/0/5",
        "tile/0/0005",
        "tile/00/005",
        "tile/64/005",
        "tile/0/005.p/0",
        "tile/0/005.p/256",
        "tile/0/005.p/07",
        "tile/0/005.p/",
        "tile/0/005/",
        "/tile/0/005",
        "tile/0/x005",
        "tile/0/005\n",
        "tile/entries/005",
        "tile/0/\u0660\u0660\u0665",  # Arabic-Indic digits
    ],
)
def test_malformed_tile_paths_are_refused(path: str) -> None:
    with pytest.raises(MalformedTile):
        parse_tile_path(path)


def test_malformed_entries_paths_are_refused() -> None:
    for path in ("tile/entries/5", "tile/entries/005.p/256", "tile/0/005", "tile/entries/x000/005"):
        with pytest.raises(MalformedTile):
            parse_entries_path(path)
    with pytest.raises(MalformedTile):
        Tile(1, 0).entries_path()
    for bad in ((64, 0, 1), (0, -1, 1), (0, 0, 0), (0, 0, 257)):
        with pytest.raises(MalformedTile):
            Tile(*bad)


def test_tiles_of_the_spec_examples() -> None:
    # c2sp.org/tlog-tiles: "a tree of size 70,000 will be represented by 273 full level 0
    # tiles, one partial level 0 tile of width 112, one full level 1 tile, one partial level 1
    # tile of width 17, and one partial level 2 tile of width 1."
    counts = Counter((t.level, t.width) for t in tiles_for_size(70_000))
    assert counts == {(0, 256): 273, (0, 112): 1, (1, 256): 1, (1, 17): 1, (2, 1): 1}
    # "a tree of size 256 will be represented by a full level 0 tile and a partial level 1
    # tile of width 1."
    assert tiles_for_size(256) == [Tile(0, 0), Tile(1, 0, 1)]
    assert tiles_for_size(0) == []
    assert tiles_for_size(1) == [Tile(0, 0, 1)]
    assert Tile(1, 1, 17).leaf_range() == (65_536, 65_536 + 17 * 256)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 70_000), st.integers(0, 70_000))
def test_new_tiles_are_what_growing_changes(a: int, b: int) -> None:
    old, new = min(a, b), max(a, b)
    before, after = set(tiles_for_size(old)), set(tiles_for_size(new))
    written = new_tiles(old, new)
    assert len(written) == len(set(written))
    assert set(written) == after - before


def test_tile_bytes_and_the_node_reader_over_them() -> None:
    for size in (1, 255, 256, 257, 511, 65_536, 65_537, 70_000):
        store = {t: tile_data(t, memory) for t in tiles_for_size(size)}
        for t, data in store.items():
            assert tile_hashes(t, data) == [
                memory(8 * t.level, t.index * 256 + i) for i in range(t.width)
            ]
        node = tile_node_reader(size, store.__getitem__)
        assert tree_root(size, node) == tree_root(size, memory)
        for index in {0, size // 3, size - 1}:
            assert inclusion_proof(index, size, node) == inclusion_proof(index, size, memory)
        for old in {1, size // 2, size - 1, size}:
            assert consistency_proof(old, size, node) == consistency_proof(old, size, memory)


def test_tile_hashes_refuse_a_wrong_length() -> None:
    for data in (b"", bytes(31), bytes(32 * 3 + 1), bytes(32 * 5)):
        with pytest.raises(MalformedTile):
            tile_hashes(Tile(0, 0, 3), data)


def test_tile_for_node() -> None:
    assert tile_for_node(0, 300, 70_000) == (Tile(0, 1), 44, 45)
    assert tile_for_node(3, 1, 70_000) == (Tile(0, 0), 8, 16)
    assert tile_for_node(8, 0, 70_000) == (Tile(1, 0), 0, 1)
    assert tile_for_node(9, 130, 70_000) == (Tile(1, 1, 17), 4, 6)
    assert tile_for_node(16, 0, 70_000) == (Tile(2, 0, 1), 0, 1)
    with pytest.raises(MalformedTile):
        tile_for_node(1, 0, 1)  # not a complete node yet
    with pytest.raises(MalformedTile):
        tile_for_node(0, 5, 5)


def only(tiles: list[Tile], size: int) -> NodeReader:
    allowed = {t: tile_data(t, memory) for t in tiles}
    return tile_node_reader(size, allowed.__getitem__)  # KeyError for any other tile


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 70_000), st.data())
def test_the_tiles_a_proof_needs_are_enough(size: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, size - 1))
    old = data.draw(st.integers(0, size))
    got = inclusion_proof(index, size, only(tiles_for_inclusion(index, size), size))
    assert got == inclusion_proof(index, size, memory)
    got = consistency_proof(old, size, only(tiles_for_consistency(old, size), size))
    assert got == consistency_proof(old, size, memory)
    assert set(tiles_for_inclusion(index, size)) <= set(tiles_for_size(size))


def test_a_log_appending_in_batches_writes_tiles_that_only_grow() -> None:
    # How a log uses this module: append leaf hashes with completed_nodes, then write
    # new_tiles(old, new) with tile_data; a partial tile is a prefix of its later versions.
    stored: dict[tuple[int, int], bytes] = {}
    written: dict[tuple[int, int], bytes] = {}
    size = 0
    for batch in (1, 2, 253, 1, 255, 300, 1024, 65_536 - 1837, 4_000):
        for i in range(size, size + batch):
            for level, index, h in completed_nodes(
                i, leaf_hash(ENTRIES[i]), lambda lv, ix: stored[lv, ix]
            ):
                stored[level, index] = h
        reader: NodeReader = lambda level, index: stored[level, index]  # noqa: E731
        for t in new_tiles(size, size + batch):
            data = tile_data(t, reader)
            before = written.get((t.level, t.index), b"")
            assert data.startswith(before) and len(data) > len(before)
            written[t.level, t.index] = data
        size += batch
        assert tree_root(size, reader) == tree_root(size, memory)
    assert {(t.level, t.index): tile_data(t, memory) for t in tiles_for_size(size)} == written


def test_entry_bundles() -> None:
    entries = [b"", b"a", bytes(300), bytes(65_535)]
    data = entry_bundle(entries)
    assert data[:5] == b"\x00\x00\x00\x01a"
    assert parse_entry_bundle(data) == entries
    assert parse_entry_bundle(data, 4) == entries
    full = entry_bundle(ENTRIES[:256])
    assert [leaf_hash(e) for e in parse_entry_bundle(full, 256)] == tile_hashes(
        Tile(0, 0), tile_data(Tile(0, 0), memory)
    )


@pytest.mark.parametrize(
    ("data", "width"),
    [
        (b"", None),  # empty
        (b"\x00", None),  # inside a length
        (b"\x00\x02a", None),  # inside an entry
        (b"\x00\x01a\x00", None),
        (b"\x00\x01a", 2),  # not the tile's width
        (b"\x00\x00" * 257, None),  # more than 256
    ],
)
def test_malformed_entry_bundles_are_refused(data: bytes, width: int | None) -> None:
    with pytest.raises(MalformedTile):
        parse_entry_bundle(data, width)


def test_entry_bundles_refuse_what_cannot_be_encoded() -> None:
    for entries in ([], [b""] * 257, [bytes(65_536)]):
        with pytest.raises(MalformedTile):
            entry_bundle(entries)
