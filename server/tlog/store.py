"""The transparency log's tiles on disk: files any static web server could serve.

``<data dir>/tlog/`` holds, in C2SP tlog-tiles layout (docs/transparency.md):

- ``checkpoint``: the newest signed checkpoint this host publishes;
- ``tile/<L>/<N>`` and ``tile/<L>/<N>.p/<W>``: hash tiles; ``tile/entries/<N>[.p/<W>]``:
  entry bundles.

The tiles are made from the database's entries (`server.models.TlogEntry`), which fix the
tree: they are a cache of it, rebuilt from the database when they do not match it. Each file
is written whole (a temporary file, then a rename), and the checkpoint last, after the tiles of
its size have been flushed to disk in one go (`flush`: one ``syncfs`` of the filesystem where
Linux has it, else an fsync of each file): whatever a crash interrupts, the tiles of the
published checkpoint are on disk. (One flush per checkpoint rather than an fsync per file: a
file's fsync is a journal commit of the filesystem, and the database's commits wait on those.)
A full tile is written once and never changes; the partial tiles of a tile are deleted once
it is full (a client that asked for one then reads the full tile's first hashes, as the spec
allows).

One process per host writes (`TileWriter`); every HTTP process reads (`TileReader`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from formats.note import parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    NodeReader,
    node_hash,
    perfect_root,
    tree_levels,
)
from formats.tlog.tiles import (
    TILE_HEIGHT,
    TILE_WIDTH,
    Tile,
    entry_bundle,
    parse_entry_bundle,
    tile_for_node,
    tile_hashes,
    tile_node_reader,
)

CHECKPOINT = "checkpoint"


class TilesMismatch(Exception):
    """The tiles on disk do not hold the tree of the published checkpoint: rebuild them."""


def _syncfs_function() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux), or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function: Callable[[int], int] = libc.syncfs
    except (OSError, AttributeError):
        return None
    return function


_SYNCFS = _syncfs_function()


def _flush(directory: Path, paths: Sequence[Path]) -> None:
    """Make the files ``paths`` (renamed into place under ``directory``) durable."""
    if _SYNCFS is not None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _SYNCFS(fd) == 0:
                return
        finally:
            os.close(fd)
    dirs = set()
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # (a partial tile dropped since)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        dirs.add(path.parent)
    for d in dirs:
        with contextlib.suppress(FileNotFoundError):  # (a partial tile's directory, dropped)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (a reader never sees part of it); durable once
    flushed (`_flush`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def checkpoint_size(note: bytes) -> int:
    """The tree size a signed checkpoint states (its signatures are not checked here)."""
    return Checkpoint.parse(parse_note(note).text).size


def checkpoint_file(reader: TileReader | None) -> dict[str, str]:
    """The log repository's ``tlog-checkpoint`` file: the checkpoint published when a log
    commit is made, so that the peers' cross-stamps of the git log pin it too (none when the
    transparency log is off or has no checkpoint yet)."""
    note = None if reader is None else reader.checkpoint()
    return {} if note is None else {"tlog-checkpoint": note.decode("utf-8")}


class TileWriter:
    """Appends entries to the tiles of ``root`` (one writer per directory: the caller holds
    the host's tlog lock). ``size`` is the number of entries whose tiles are written."""

    def __init__(self, root: Path, *, sync: bool = True) -> None:
        self.root = root
        self.sync = sync  # flush before publishing (off only in benchmarks of the hashing)
        self._written: list[Path] = []  # files written since the last flush
        self.size = 0
        # For each tile level, the hashes of its tile not yet full; and the entries of the
        # level 0 tile not yet full.
        self.edge: list[list[bytes]] = [[]]
        self.edge_entries: list[bytes] = []

    # -- opening --------------------------------------------------------------------------
    def open(self) -> None:
        """Take up the tiles of the published checkpoint (none: the empty tree).
        `TilesMismatch` when they are missing or do not hash to its root."""
        self.size, self.edge, self.edge_entries = 0, [[]], []
        note = self.read_checkpoint()
        if note is None:
            return
        cp = Checkpoint.parse(parse_note(note).text)
        reader = TileReader(self.root)
        edge: list[list[bytes]] = []
        try:
            while count := cp.size >> (TILE_HEIGHT * len(edge)):
                tile = Tile(len(edge), count // TILE_WIDTH, count % TILE_WIDTH or TILE_WIDTH)
                edge.append(tile_hashes(tile, reader.tile_bytes(tile)) if not tile.full else [])
            edge = edge or [[]]
            entries: list[bytes] = []
            if cp.size % TILE_WIDTH:
                tile = Tile(0, cp.size // TILE_WIDTH, cp.size % TILE_WIDTH)
                entries = parse_entry_bundle(reader.bundle_bytes(tile), tile.width)
        except (OSError, ValueError) as e:
            raise TilesMismatch(f"the tiles of checkpoint size {cp.size}: {e}") from None
        self.size, self.edge, self.edge_entries = cp.size, edge, entries
        if self.root_hash() != cp.root:
            self.size, self.edge, self.edge_entries = 0, [[]], []
            raise TilesMismatch(f"the tiles do not hash to the root of checkpoint size {cp.size}")

    def reset(self) -> None:
        """Forget every tile (they are rebuilt from entry 0): the checkpoint file goes first,
        so that nothing published points at tiles being rewritten."""
        (self.root / CHECKPOINT).unlink(missing_ok=True)
        self.size, self.edge, self.edge_entries = 0, [[]], []

    # -- appending ------------------------------------------------------------------------
    def append(self, first: int, entries: Sequence[bytes]) -> None:
        """Append ``entries``, the log's entries ``first``, ``first + 1``, ...: ``first`` must
        be ``size``. Their tiles are written (full ones once, partial ones at their new width)
        before this returns."""
        if first != self.size:
            raise ValueError(f"entries from {first} appended to tiles of size {self.size}")
        if not entries:
            return
        touched: set[int] = {0}
        sha256 = hashlib.sha256
        pos = 0
        while pos < len(entries):  # a level 0 tile at a time
            take = min(len(entries) - pos, TILE_WIDTH - len(self.edge_entries))
            chunk = entries[pos:pos + take]
            pos += take
            self.edge_entries += chunk
            self.edge[0] += [sha256(b"\x00" + e).digest() for e in chunk]
            self.size += take
            if len(self.edge_entries) == TILE_WIDTH:  # full: written once, its root goes up
                n = self.size // TILE_WIDTH - 1
                self._write(Tile(0, n).entries_path(), entry_bundle(self.edge_entries))
                self._drop_partials(Tile(0, n).entries_path())
                self._write(Tile(0, n).path(), b"".join(self.edge[0]))
                self._drop_partials(Tile(0, n).path())
                root = perfect_root(self.edge[0])
                self.edge_entries, self.edge[0] = [], []
                self._push(1, root, touched)
        for level in sorted(touched):
            hashes = self.edge[level]
            if hashes:
                count = self.size >> (TILE_HEIGHT * level)
                tile = Tile(level, count // TILE_WIDTH, len(hashes))
                self._write(tile.path(), b"".join(hashes))
        if self.edge_entries:
            tile = Tile(0, self.size // TILE_WIDTH, len(self.edge_entries))
            self._write(tile.entries_path(), entry_bundle(self.edge_entries))

    def _push(self, level: int, h: bytes, touched: set[int]) -> None:
        """Add the root of a full tile of ``level - 1`` (``size`` counts its entries)."""
        while True:
            if level == len(self.edge):
                self.edge.append([])
            row = self.edge[level]
            row.append(h)
            touched.add(level)
            if len(row) < TILE_WIDTH:
                return
            # A full tile: written once; its root goes one tile level up.
            tile = Tile(level, (self.size >> (TILE_HEIGHT * level)) // TILE_WIDTH - 1)
            self._write(tile.path(), b"".join(row))
            self._drop_partials(tile.path())
            h = perfect_root(row)
            self.edge[level] = []
            level += 1

    def _write(self, rel: str, data: bytes) -> None:
        path = self.root / rel
        write_whole(path, data)
        if self.sync:
            self._written.append(path)

    def _drop_partials(self, full_path: str) -> None:
        """Delete the partial versions of a tile that is now full."""
        pdir = self.root / f"{full_path}.p"
        if pdir.is_dir():
            for f in pdir.iterdir():
                with contextlib.suppress(OSError):
                    f.unlink()
            with contextlib.suppress(OSError):
                pdir.rmdir()

    # -- the tree -------------------------------------------------------------------------
    def root_hash(self) -> bytes:
        """The root of the tree of ``size`` entries, from the tiles not yet full: the perfect
        subtrees of the size's binary digits, largest first, hashed right to left."""
        if self.size == 0:
            return EMPTY_ROOT
        subtrees: list[bytes] = []
        for level in range(len(self.edge) - 1, -1, -1):
            row = self.edge[level]
            pos = 0
            for s in range(TILE_HEIGHT - 1, -1, -1):
                if len(row) >> s & 1:
                    subtrees.append(perfect_root(row[pos:pos + (1 << s)]))
                    pos += 1 << s
        root = subtrees[-1]
        for h in reversed(subtrees[:-1]):
            root = node_hash(h, root)
        return root

    # -- checkpoints ----------------------------------------------------------------------
    def read_checkpoint(self) -> bytes | None:
        try:
            return (self.root / CHECKPOINT).read_bytes()
        except FileNotFoundError:
            return None

    def publish(self, note: bytes) -> None:
        """Publish a signed checkpoint whose tiles are written (its size at most ``size``)."""
        size = checkpoint_size(note)
        if size > self.size:
            raise ValueError(f"checkpoint of size {size} ahead of the tiles ({self.size})")
        self.flush()
        # (not flushed itself: lost in a crash, the one before is back, whose tiles are on
        # disk, and the next checkpoint is of the database's size, not smaller)
        write_whole(self.root / CHECKPOINT, note)

    def republish(self, note: bytes) -> None:
        """Publish ``note`` again: the published checkpoint with other signatures (the
        witnesses' cosignatures). Its tiles were flushed when it was first published."""
        write_whole(self.root / CHECKPOINT, note)

    def flush(self) -> None:
        """Make every tile written so far durable (before a checkpoint points at them)."""
        if self._written:
            _flush(self.root, self._written)
            self._written = []


class TileReader:
    """What the HTTP processes read: the checkpoint, tiles, entry bundles, and proofs made from
    them. Full tiles never change, so they are cached (``cache`` of them, least recently used
    first out); partial ones are read each time."""

    def __init__(self, root: Path, cache: int = 512) -> None:
        self.root = root
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_size = cache
        self._lock = threading.Lock()
        self._checkpoint: tuple[tuple[int, int, int], bytes, int] | None = None
        self._tree_cache: OrderedDict[str, list[list[bytes]]] = OrderedDict()

    def checkpoint(self) -> bytes | None:
        """The published checkpoint's bytes (None before the first)."""
        published = self.published()
        return None if published is None else published[0]

    def published(self) -> tuple[bytes, int] | None:
        """The published checkpoint's bytes and tree size (None before the first); read again
        only when the file changed."""
        path = self.root / CHECKPOINT
        try:
            st = path.stat()
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._checkpoint
            if cached is not None and cached[0] == key:
                return cached[1], cached[2]
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        size = checkpoint_size(data)
        self._checkpoint = (key, data, size)
        return data, size

    def _full(self, rel: str) -> bytes:
        with self._lock:
            data = self._cache.get(rel)
            if data is not None:
                self._cache.move_to_end(rel)
                return data
        data = (self.root / rel).read_bytes()
        with self._lock:
            self._cache[rel] = data
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return data

    def _read(self, tile: Tile, rel: str, full_rel: str, item: int) -> bytes:
        """The bytes of a tile or bundle; a partial one that was replaced by its full tile is
        cut from it (``item``: bytes per hash, or 0 for a bundle)."""
        if tile.full:
            return self._full(rel)
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            data = self._full(full_rel)
        if item:
            return data[:tile.width * item]
        return entry_bundle(parse_entry_bundle(data)[:tile.width])

    def tile_bytes(self, tile: Tile) -> bytes:
        return self._read(tile, tile.path(), Tile(tile.level, tile.index).path(), HASH_SIZE)

    def bundle_bytes(self, tile: Tile) -> bytes:
        return self._read(tile, tile.entries_path(), Tile(0, tile.index).entries_path(), 0)

    def node_reader(self, size: int) -> NodeReader:
        """The tree of ``size`` entries (at most the published checkpoint's) as a node reader.
        A full tile's seven inner levels are hashed once and kept with it (a proof reads a
        node of each of them); a partial tile's are hashed for each node asked."""
        partial = tile_node_reader(size, self.tile_bytes)

        def node(level: int, index: int) -> bytes:
            tile, start, _stop = tile_for_node(level, index, size)
            if not tile.full:
                return partial(level, index)
            sub = level % TILE_HEIGHT
            return self._levels(tile)[sub][start >> sub]

        return node

    def _levels(self, tile: Tile) -> list[list[bytes]]:
        key = "levels:" + tile.path()
        with self._lock:
            levels = self._tree_cache.get(key)
            if levels is not None:
                self._tree_cache.move_to_end(key)
                return levels
        levels = tree_levels(tile_hashes(tile, self.tile_bytes(tile)))
        with self._lock:
            self._tree_cache[key] = levels
            while len(self._tree_cache) > self._cache_size:
                self._tree_cache.popitem(last=False)
        return levels

    def entry(self, index: int, size: int) -> bytes:
        """Entry ``index`` of the tree of ``size`` entries, from its bundle."""
        n = index // TILE_WIDTH
        width = min(TILE_WIDTH, size - n * TILE_WIDTH)
        tile = Tile(0, n, width)
        return parse_entry_bundle(self.bundle_bytes(tile), width)[index % TILE_WIDTH]
