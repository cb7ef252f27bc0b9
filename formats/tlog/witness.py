"""The witness protocol (c2sp.org/tlog-witness), pure: the ``add-checkpoint`` request and
answer, and the checks a witness makes before it cosigns.

The request body, each line ending in a newline::

    old <size the witness last cosigned, decimal, no leading zero>
    <base64 consistency proof hash>            (zero to 63 lines)
    <empty line>
    <the signed checkpoint note, verbatim>

The answer to a request that passes is one or more note signature lines (``— <name> <base64>``),
cosignatures (c2sp.org/tlog-cosignature) of the checkpoint by the witness's key. Each refusal
is an error type of its own, and a front end maps each to the spec's status code once:

=========================  ====  ==============================================================
`MalformedWitnessRequest`  400   the body is not as above, or the old size exceeds the new one
`BadLogSignature`          403   no valid signature by a key trusted for the origin, or a bad one
`UnknownLog`               404   no key is trusted for the checkpoint's origin
`SizeConflict`             409   the old size is not the size last cosigned (``known`` says it;
                                 answered as ``text/x.tlog.size``: the size and a newline)
`InconsistentCheckpoint`   422   the consistency proof does not verify, a proof from size 0, a
                                 size-0 checkpoint whose root is not SHA-256(""), or the same
                                 size with another root
=========================  ====  ==============================================================

:func:`check_add_checkpoint` makes every check in the spec's order against the witness's
record of the origin; the caller stores the checkpoint it returns **atomically with** the record
it checked against (compare and set), and only then cosigns.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from formats.note import (
    Note,
    NoteError,
    Signature,
    UnverifiedNote,
    Verifier,
    b64decode_strict,
    open_note,
    parse_note,
)
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.errors import InvalidProof, TlogError
from formats.tlog.merkle import EMPTY_ROOT, HASH_SIZE, MAX_PROOF_HASHES, verify_consistency

__all__ = [
    "MAX_REQUEST_BYTES",
    "SIZE_CONTENT_TYPE",
    "AddCheckpoint",
    "BadLogSignature",
    "InconsistentCheckpoint",
    "MalformedWitnessRequest",
    "SizeConflict",
    "UnknownLog",
    "WitnessError",
    "WitnessRecord",
    "check_add_checkpoint",
    "encode_size",
    "log_signed_note",
    "parse_cosignatures",
    "parse_size",
]

# A request is 'old N', at most 63 proof lines of 45 bytes, and a checkpoint note of at most a
# few kB (100 signatures of ~100 bytes, a few extension lines): 64 KiB is plenty.
MAX_REQUEST_BYTES = 64 * 1024
SIZE_CONTENT_TYPE = "text/x.tlog.size"
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)


class WitnessError(TlogError):
    """Base of every refusal of an ``add-checkpoint`` request."""


class MalformedWitnessRequest(WitnessError):
    """400: the request body is not as the spec says, or its old size exceeds the new size."""


class BadLogSignature(WitnessError):
    """403: the checkpoint has no valid signature by a key trusted for its origin (or a
    signature line of a trusted key's name and ID that does not verify)."""


class UnknownLog(WitnessError):
    """404: no log key is trusted for the checkpoint's origin."""


class SizeConflict(WitnessError):
    """409: the old size is not the size of the latest checkpoint cosigned for the origin."""

    def __init__(self, known: int) -> None:
        super().__init__(f"the latest checkpoint cosigned for this log is of size {known}")
        self.known = known


class InconsistentCheckpoint(WitnessError):
    """422: the checkpoint is not consistent with the one last cosigned (see the table)."""


@dataclass(frozen=True)
class AddCheckpoint:
    """An ``add-checkpoint`` request: the old size, the consistency proof and the checkpoint
    note (with its signatures, verbatim)."""

    old_size: int
    proof: tuple[bytes, ...]
    checkpoint: bytes

    def __post_init__(self) -> None:
        if self.old_size < 0:
            raise MalformedWitnessRequest(f"negative old size {self.old_size}")
        if len(self.proof) > MAX_PROOF_HASHES or any(len(h) != HASH_SIZE for h in self.proof):
            raise MalformedWitnessRequest("a consistency proof is at most 63 hashes of 32 bytes")

    def encode(self) -> bytes:
        lines = [f"old {self.old_size}", *(base64.b64encode(h).decode("ascii")
                                           for h in self.proof)]
        return ("\n".join(lines) + "\n\n").encode("ascii") + self.checkpoint

    @classmethod
    def parse(cls, body: bytes) -> AddCheckpoint:
        if len(body) > MAX_REQUEST_BYTES:
            raise MalformedWitnessRequest(f"a request is at most {MAX_REQUEST_BYTES} bytes")
        head, sep, checkpoint = body.partition(b"\n\n")
        if not sep:
            raise MalformedWitnessRequest("no empty line before the checkpoint")
        try:
            lines = head.decode("ascii").split("\n")
        except UnicodeDecodeError:
            raise MalformedWitnessRequest("the old size and proof lines are ASCII") from None
        first = lines[0]
        if not first.startswith("old ") or not _DECIMAL.fullmatch(first[4:]):
            raise MalformedWitnessRequest("the first line is not 'old <decimal size>'")
        if len(lines) - 1 > MAX_PROOF_HASHES:
            raise MalformedWitnessRequest("more than 63 consistency proof lines")
        try:
            proof = tuple(b64decode_strict(line) for line in lines[1:])
        except ValueError as e:
            raise MalformedWitnessRequest(f"a proof line is not base64: {e}") from None
        return cls(int(first[4:]), proof, checkpoint)


@dataclass(frozen=True)
class WitnessRecord:
    """What a witness keeps of one log: the size and root hash it last cosigned."""

    size: int
    root: bytes


def check_add_checkpoint(
    request: AddCheckpoint,
    trusted: Mapping[str, Sequence[Verifier]],
    record: WitnessRecord | None,
) -> Checkpoint:
    """The checkpoint of ``request`` once it passes every check of the spec against the
    witness's ``record`` of its origin (None: never cosigned); ``trusted`` maps each known
    origin to its log keys. Raises a `WitnessError` subclass, in the spec's order of checks."""
    try:
        note = parse_note(request.checkpoint)
        checkpoint = Checkpoint.parse(note.text)
    except (NoteError, TlogError) as e:
        raise MalformedWitnessRequest(f"the checkpoint is malformed: {e}") from None
    keys = trusted.get(checkpoint.origin)
    if not keys:
        raise UnknownLog(f"no log of origin {checkpoint.origin!r} is known to this witness")
    try:
        open_note(request.checkpoint, keys)
    except UnverifiedNote:
        raise BadLogSignature("the checkpoint is not signed by a key of its log") from None
    except NoteError as e:
        raise BadLogSignature(f"the checkpoint's signature does not verify: {e}") from None
    if request.old_size > checkpoint.size:
        raise MalformedWitnessRequest(
            f"old size {request.old_size} is above the checkpoint's size {checkpoint.size}")
    known = 0 if record is None else record.size
    if request.old_size != known:
        raise SizeConflict(known)
    if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:  # (Checkpoint refuses it too)
        raise InconsistentCheckpoint("the root of the empty tree is SHA-256 of the empty string")
    if request.old_size == 0:
        if request.proof:
            raise InconsistentCheckpoint("a consistency proof from size 0 is empty")
        return checkpoint
    assert record is not None  # (known == old_size > 0)
    try:
        verify_consistency(record.size, checkpoint.size, record.root, checkpoint.root,
                           request.proof)
    except InvalidProof as e:
        raise InconsistentCheckpoint(f"not consistent with the checkpoint of size "
                                     f"{record.size} cosigned before: {e}") from None
    return checkpoint


def log_signed_note(note: bytes, keys: Sequence[Verifier]) -> bytes:
    """The checkpoint ``note`` with only its signatures by the log's ``keys``, each verified:
    what a witness stores and serves beside its own cosignature. Every other line of the
    request (another witness's cosignature, a line under the witness's own name, a key it
    does not know) is dropped, unverified: the witness vouches for nothing it did not check.
    `BadLogSignature` when none verifies (`check_add_checkpoint` refused it already)."""
    try:
        opened = open_note(note, keys)
    except NoteError as e:
        raise BadLogSignature(f"the checkpoint's signature does not verify: {e}") from None
    return Note(opened.text, opened.verified).encode()


def encode_size(size: int) -> bytes:
    """The body of a 409 answer (``text/x.tlog.size``)."""
    return b"%d\n" % size


def parse_size(body: bytes) -> int:
    """The size of a 409 answer's body; `MalformedWitnessRequest` when it is not one."""
    text = body.decode("ascii", "replace")
    if not text.endswith("\n") or not _DECIMAL.fullmatch(text[:-1]):
        raise MalformedWitnessRequest(f"not a tree size answer: {text[:40]!r}")
    return int(text[:-1])


def parse_cosignatures(body: bytes) -> tuple[Signature, ...]:
    """The signature lines of a 200 answer (one or more ``— name base64`` lines, each ending
    in a newline), checked for syntax only: verify them against the checkpoint with the
    witness keys (:class:`formats.tlog.checkpoint.CosignatureVerifier`)."""
    if not body.endswith(b"\n"):
        raise MalformedWitnessRequest("a cosignature answer ends in a newline")
    try:
        # (a note of a placeholder text with these signature lines: the same line syntax)
        return parse_note(b"x\n\n" + body).signatures
    except NoteError as e:
        raise MalformedWitnessRequest(f"not cosignature lines: {e}") from None
