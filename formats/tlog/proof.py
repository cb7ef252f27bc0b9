"""Offline proofs that an entry is in the log (c2sp.org/tlog-proof@v1).

The text, each line ending in a newline::

    c2sp.org/tlog-proof@v1
    [extra <base64 opaque data>]
    index <entry index, decimal, no leading zero>
    <base64 inclusion proof hash, from the leaf's sibling up>   (zero or more lines)
    <empty line>
    <the signed checkpoint note, verbatim>

:func:`verify_proof` checks it against the entry's bytes: the checkpoint is from the expected
origin and signed by a log key, enough known witnesses cosigned it, and the RFC 6962 leaf hash
of the entry is at ``index`` in the checkpoint's tree. The extra data is not authenticated and
plays no part in verification.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from formats.note import NoteError, Verifier, b64decode_strict, open_note, parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.errors import MalformedProof, TlogError
from formats.tlog.merkle import HASH_SIZE, MAX_PROOF_HASHES, leaf_hash, verify_inclusion

__all__ = ["PROOF_HEADER", "ProvenEntry", "TlogProof", "verify_proof"]

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)


@dataclass(frozen=True)
class TlogProof:
    """An entry's index, its inclusion proof, the signed checkpoint (a note) and extra data."""

    index: int
    hashes: tuple[bytes, ...]
    checkpoint: bytes
    extra: bytes | None = None

    def __post_init__(self) -> None:
        if self.index < 0:
            raise MalformedProof(f"negative index {self.index}")
        if len(self.hashes) > MAX_PROOF_HASHES or any(len(h) != HASH_SIZE for h in self.hashes):
            raise MalformedProof("an inclusion proof is at most 63 hashes of 32 bytes")
        if self.extra == b"":
            raise MalformedProof("no extra data is written as no extra line")
        try:
            parse_note(self.checkpoint)
        except NoteError as e:
            raise MalformedProof(f"the checkpoint is not a signed note: {e}") from e

    def encode(self) -> bytes:
        lines = [PROOF_HEADER]
        if self.extra is not None:
            lines.append("extra " + base64.b64encode(self.extra).decode("ascii"))
        lines.append(f"index {self.index}")
        lines += [base64.b64encode(h).decode("ascii") for h in self.hashes]
        return ("\n".join(lines) + "\n\n").encode() + self.checkpoint

    @classmethod
    def parse(cls, data: bytes) -> TlogProof:
        try:
            head, sep, checkpoint = data.partition(b"\n\n")
            lines = head.decode("ascii").split("\n")
        except UnicodeDecodeError as e:
            raise MalformedProof("the proof lines are ASCII") from e
        if not sep:
            raise MalformedProof("no empty line before the checkpoint")
        if lines[0] != PROOF_HEADER:
            raise MalformedProof(f"the first line is not {PROOF_HEADER}")
        rest = lines[1:]
        extra = None
        try:
            if rest and rest[0].startswith("extra "):
                extra = b64decode_strict(rest.pop(0)[len("extra ") :])
            if not rest or not rest[0].startswith("index "):
                raise MalformedProof("no index line")
            index = rest.pop(0)[len("index ") :]
            if not _DECIMAL.fullmatch(index):
                raise MalformedProof(f"index {index!r} is not a decimal without leading zero")
            hashes = tuple(b64decode_strict(line) for line in rest)
        except ValueError as e:
            if isinstance(e, MalformedProof):
                raise
            raise MalformedProof(str(e)) from e
        return cls(int(index), hashes, checkpoint, extra)


class ProvenEntry(NamedTuple):
    """The entry's index in the log and the size of the checkpoint's tree."""

    leaf_index: int
    tree_size: int


def verify_proof(
    proof: bytes,
    entry: bytes,
    *,
    origin: str,
    log_keys: Sequence[Verifier],
    witnesses: Sequence[Verifier] = (),
    quorum: int = 0,
) -> ProvenEntry:
    """Check a tlog-proof of ``entry`` and return its index and the checkpoint's tree size.

    The checkpoint must carry ``origin`` and a valid signature by one of ``log_keys``, and valid
    cosignatures by at least ``quorum`` of ``witnesses`` (signatures by other keys are ignored;
    a bad one by a known key is refused). Raises :class:`formats.tlog.errors.TlogError` or
    :class:`formats.note.NoteError`."""
    parsed = TlogProof.parse(proof)
    opened = open_note(parsed.checkpoint, [*log_keys, *witnesses])
    signed = {(s.name, s.key_id) for s in opened.verified}
    if not signed & {(k.name, k.key_id) for k in log_keys}:
        raise TlogError("the checkpoint is not signed by a log key")
    cosigned = signed & {(w.name, w.key_id) for w in witnesses}
    if len(cosigned) < quorum:
        raise TlogError(f"{len(cosigned)} witnesses cosigned the checkpoint, not {quorum}")
    checkpoint = Checkpoint.parse(opened.text)
    if checkpoint.origin != origin:
        raise TlogError(f"checkpoint of {checkpoint.origin!r}, not {origin!r}")
    verify_inclusion(
        leaf_hash(entry), parsed.index, checkpoint.size, parsed.hashes, checkpoint.root
    )
    return ProvenEntry(parsed.index, checkpoint.size)
