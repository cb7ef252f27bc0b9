"""The transparency log's tiles on disk (server.tlog.store): written by `TileWriter`, read by
`TileReader`, checked against pymerkle (an RFC 6962 implementation that is not ours) and
against the C2SP tile layout; a writer takes up where the published checkpoint left off, and
refuses tiles that do not hash to it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pymerkle import InmemoryTree

from formats.note import ed25519_signer, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.merkle import inclusion_proof, leaf_hash, verify_inclusion
from formats.tlog.tiles import Tile, parse_entry_bundle, tiles_for_size
from server.tlog.store import TileReader, TilesMismatch, TileWriter, checkpoint_size

ENTRIES = [b"entry %d" % i for i in range(70_000)]
ORIGIN = "example.test/tlog"
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@pytest.fixture(scope="module")
def theirs() -> InmemoryTree:
    tree = InmemoryTree(algorithm="sha256")
    for e in ENTRIES[:2000]:
        tree.append_entry(e)
    return tree


def signed_checkpoint(w: TileWriter) -> bytes:
    text = Checkpoint(ORIGIN, w.size, w.root_hash()).body()
    return sign_note(text, [ed25519_signer(ORIGIN, PUBLIC, KEY.sign)]).encode()


def test_roots_and_proofs_agree_with_pymerkle(tmp_path: Path, theirs: InmemoryTree) -> None:
    w, r = TileWriter(tmp_path, sync=False), TileReader(tmp_path)
    rng = random.Random(1)
    size = 0
    while size < 2000:
        n = min(rng.choice([1, 2, 3, 17, 255, 256, 300]), 2000 - size)
        w.append(size, ENTRIES[size:size + n])
        size += n
        assert w.size == size
        assert w.root_hash() == theirs.get_root(size)
        for index in rng.sample(range(size), min(size, 3)):
            proof = inclusion_proof(index, size, r.node_reader(size))
            assert proof == theirs.prove_inclusion(index + 1, size).path[1:]
            assert r.entry(index, size) == ENTRIES[index]


def test_files_are_the_c2sp_layout(tmp_path: Path) -> None:
    w, r = TileWriter(tmp_path, sync=False), TileReader(tmp_path)
    w.append(0, ENTRIES[:70_000])
    for tile in tiles_for_size(70_000):  # every tile of the tree exists, at its width
        data = r.tile_bytes(tile)
        assert len(data) == 32 * tile.width
    assert (tmp_path / "tile/0/273.p/112").is_file()
    assert (tmp_path / "tile/1/000").is_file() and (tmp_path / "tile/2/000.p/1").is_file()
    # a full tile's partial versions are gone; its bundle holds its 256 entries
    assert not (tmp_path / "tile/0/000.p").exists()
    bundle = (tmp_path / "tile/entries/000").read_bytes()
    assert parse_entry_bundle(bundle, 256) == ENTRIES[:256]
    # a level 0 hash is the entry's leaf hash
    assert r.tile_bytes(Tile(0, 5))[:32] == leaf_hash(ENTRIES[5 * 256])


def test_partial_tile_replaced_by_full_is_cut_from_it(tmp_path: Path) -> None:
    w, r = TileWriter(tmp_path, sync=False), TileReader(tmp_path)
    w.append(0, ENTRIES[:10])
    before = r.tile_bytes(Tile(0, 0, 10))
    bundle = r.bundle_bytes(Tile(0, 0, 10))
    w.append(10, ENTRIES[10:300])
    assert not (tmp_path / "tile/0/000.p/10").exists()
    assert r.tile_bytes(Tile(0, 0, 10)) == before
    assert r.bundle_bytes(Tile(0, 0, 10)) == bundle


def test_reopened_writer_goes_on_with_the_same_tree(tmp_path: Path,
                                                    theirs: InmemoryTree) -> None:
    w = TileWriter(tmp_path, sync=False)
    w.append(0, ENTRIES[:777])
    w.publish(signed_checkpoint(w))
    w.append(777, ENTRIES[777:900])  # written, never published: a crash here
    again = TileWriter(tmp_path, sync=False)
    again.open()
    assert again.size == 777  # the published checkpoint's tiles
    again.append(777, ENTRIES[777:2000])
    assert again.root_hash() == theirs.get_root(2000)
    r = TileReader(tmp_path)
    proof = inclusion_proof(1999, 2000, r.node_reader(2000))
    verify_inclusion(leaf_hash(ENTRIES[1999]), 1999, 2000, proof, theirs.get_root(2000))


def test_tiles_that_do_not_match_the_checkpoint_are_refused(tmp_path: Path) -> None:
    w = TileWriter(tmp_path, sync=False)
    w.append(0, ENTRIES[:300])
    note = signed_checkpoint(w)
    w.publish(note)
    tile = tmp_path / "tile/0/001.p/44"
    data = bytearray(tile.read_bytes())
    data[0] ^= 1
    tile.write_bytes(bytes(data))
    again = TileWriter(tmp_path, sync=False)
    with pytest.raises(TilesMismatch):
        again.open()
    assert again.size == 0
    tile.unlink()
    with pytest.raises(TilesMismatch):
        again.open()
    again.reset()
    assert again.read_checkpoint() is None  # nothing published points at rewritten tiles


def test_appending_out_of_order_or_publishing_ahead_is_refused(tmp_path: Path) -> None:
    w = TileWriter(tmp_path, sync=False)
    w.append(0, ENTRIES[:5])
    with pytest.raises(ValueError):
        w.append(4, ENTRIES[4:6])
    note = signed_checkpoint(w)
    w2 = TileWriter(tmp_path / "other", sync=False)
    with pytest.raises(ValueError):
        w2.publish(note)
    assert checkpoint_size(note) == 5


def test_empty_tree(tmp_path: Path) -> None:
    w = TileWriter(tmp_path, sync=False)
    w.publish(signed_checkpoint(w))
    again = TileWriter(tmp_path, sync=False)
    again.open()
    assert again.size == 0 and again.root_hash() == w.root_hash()


@pytest.mark.parametrize("syncfs", [True, False])
def test_tiles_are_flushed_before_a_checkpoint_is_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncfs: bool) -> None:
    """One flush per checkpoint: syncfs where libc has it, else an fsync of each file (and of
    its directory); a partial tile dropped meanwhile is no error."""
    from server.tlog import store

    if not syncfs:
        monkeypatch.setattr(store, "_SYNCFS", None)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(store.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    w = TileWriter(tmp_path)
    w.append(0, ENTRIES[:10])
    w.append(10, ENTRIES[10:300])  # (drops the partial tiles of the first append)
    assert w._written
    w.publish(signed_checkpoint(w))
    assert w._written == []
    assert bool(synced) != syncfs or store._SYNCFS is None
    again = TileWriter(tmp_path)
    again.open()
    assert again.size == 300
