"""`stampd verify`: the proof's checkpoint against the other checkpoints the user holds of the
same log: those earlier audits kept (`client.audit.state`, the ``--state`` file of
``stampd audit``) and, with ``--fetch-proof``, the server's current one.

Two checkpoints of one log must both hold: the smaller tree a prefix of the larger. Offline,
two of the same size must have the same root. With the server at hand (``--fetch-proof``), its
entry bundles are fetched, the tree of its current checkpoint rebuilt, and every checkpoint no
larger than it must have that tree's root at its size. Any two that cannot both hold are a
fork: `Forked` carries both signed checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from client.audit.state import SeenCheckpoints, StateError, default_state_file
from client.audit.tlog import (
    MAX_BUNDLE,
    MAX_NOTE,
    HttpSource,
    NotFound,
    SourceError,
    base_url,
    read_entries,
)
from client.verify.errors import Invalid
from formats.note import Ed25519Verifier, NoteError, open_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.errors import TlogError
from formats.tlog.merkle import leaf_hash, tree_levels, tree_root
from formats.tlog.proof import TlogProof


@dataclass(frozen=True)
class Signed:
    """A checkpoint, its signed note and where it comes from (for messages)."""

    what: str
    note: bytes
    checkpoint: Checkpoint


class Forked(Invalid):
    """Two signed checkpoints of one log that cannot both hold; ``evidence`` is both notes,
    for standard error (the one-line message names them)."""

    def __init__(self, a: Signed, b: Signed) -> None:
        self.evidence = (f"{a.what}:\n{a.note.decode('utf-8', 'replace')}\n"
                         f"{b.what}:\n{b.note.decode('utf-8', 'replace')}")
        super().__init__(f"a fork of {a.checkpoint.origin}: {a.what} (size "
                         f"{a.checkpoint.size}) and {b.what} (size {b.checkpoint.size}) cannot "
                         "both hold (both signed checkpoints on stderr)")


def _open(what: str, note: bytes, verifier: Ed25519Verifier) -> Signed | None:
    try:
        return Signed(what, note, Checkpoint.parse(open_note(note, [verifier]).text))
    except (NoteError, TlogError, ValueError):
        return None


def seen_checkpoints(origin: str, verifier: Ed25519Verifier, state: Path | None = None
                     ) -> list[Signed]:
    """The checkpoints of ``origin`` kept by earlier audits that open with ``verifier``."""
    path = state or default_state_file()
    try:
        seen = SeenCheckpoints.load(path).logs.get(origin)
    except StateError:
        return []
    if seen is None:
        return []
    out = []
    for note in seen.checkpoints:
        signed = _open(f"a checkpoint seen by stampd audit ({path})", note.encode(), verifier)
        if signed is not None:
            out.append(signed)
    return out


def server_checkpoint(server: str, verifier: Ed25519Verifier
                      ) -> tuple[Signed, list[bytes]] | None:
    """The server's current checkpoint and the entries of its tree; None if unavailable."""
    source = HttpSource(base_url(server))

    def get(path: str) -> bytes | None:
        try:
            return source.get(path, MAX_BUNDLE)
        except (NotFound, SourceError):
            return None

    try:
        current = _open(f"the server's checkpoint ({source.base}tlog/checkpoint)",
                        source.get("checkpoint", MAX_NOTE), verifier)
    except (NotFound, SourceError):
        return None
    if current is None:
        return None
    entries = read_entries(current.checkpoint.size, get, lambda _tile, _e: None)
    return None if entries is None else (current, entries)


def check_consistency(proof: bytes, verifier: Ed25519Verifier, others: Sequence[Signed],
                      current: tuple[Signed, list[bytes]] | None = None) -> int:
    """How many other checkpoints the proof's was compared with; `Forked` for two that
    cannot both hold."""
    signed = _open("the proof's checkpoint", TlogProof.parse(proof).checkpoint, verifier)
    if signed is None:
        return 0
    views = [signed, *others]
    compared = 0
    for other in others:
        if other.checkpoint.size == signed.checkpoint.size:
            if other.checkpoint.root != signed.checkpoint.root:
                raise Forked(signed, other)
            compared += 1
    if current is not None:
        top, entries = current
        levels = tree_levels([leaf_hash(e) for e in entries])

        def node(level: int, index: int) -> bytes:
            return levels[level][index]

        if tree_root(top.checkpoint.size, node) != top.checkpoint.root:
            return compared  # the server's tiles do not match its checkpoint: not evidence
        for view in views:
            if view.checkpoint.size <= top.checkpoint.size:
                if tree_root(view.checkpoint.size, node) != view.checkpoint.root:
                    raise Forked(view, top)
                compared += 1
    return compared
