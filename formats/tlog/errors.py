"""The errors of the transparency-log formats: one base, one type per refusal."""

from __future__ import annotations

__all__ = [
    "InvalidProof",
    "MalformedCheckpoint",
    "MalformedProof",
    "MalformedTile",
    "TlogError",
]


class TlogError(ValueError):
    """Base of every refusal in :mod:`formats.tlog`."""


class InvalidProof(TlogError):
    """An inclusion or consistency proof does not prove what it claims, or is out of range."""


class MalformedTile(TlogError):
    """A tile path, a tile or an entry bundle is not exactly as c2sp.org/tlog-tiles says."""


class MalformedCheckpoint(TlogError):
    """A checkpoint body or a cosignature is not exactly as c2sp.org/tlog-checkpoint says."""


class MalformedProof(TlogError):
    """A tlog-proof text is not exactly as c2sp.org/tlog-proof says."""
